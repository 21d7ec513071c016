package fatal

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestIs(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("connect: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("read: connection reset by peer"), false},
		{"wrapped Error", fmt.Errorf("prepare slot: %w", Errorf("slot %q is invalidated", "s")), true},
		{"invalid password 28P01", pg("28P01"), true},
		{"no pg_hba entry 28000", pg("28000"), true},
		{"insufficient privilege 42501", pg("42501"), true},
		{"no such database 3D000", pg("3D000"), true},
		{"admin shutdown 57P01", pg("57P01"), false},
		{"connection failure 08006", pg("08006"), false},
		{"slot in use 55006", pg("55006"), false},
		{"serialization 40001", pg("40001"), false},
	}
	for _, tt := range tests {
		if got := Is(tt.err); got != tt.want {
			t.Errorf("%s: Is(%v) = %v; want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestFatalErrorText(t *testing.T) {
	cause := errors.New("permission denied to create table")
	e := &Error{Msg: "the state table is missing", Err: cause}
	if got := e.Error(); got != "the state table is missing: permission denied to create table" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(e, cause) {
		t.Error("Error does not unwrap to its cause")
	}
	if got := Errorf("slot %q", "s").Error(); got != `slot "s"` {
		t.Errorf("Errorf(...).Error() = %q", got)
	}
}
