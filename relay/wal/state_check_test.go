package wal

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unit tests of the decisions in slot.go that need no server: when a slot
// is refused and which errors stop the connector. The state row's checks
// are relay/checkpoint's. The integration tests run the same paths against
// PostgreSQL.

func TestCheckSlot(t *testing.T) {
	ok := SlotInfo{Name: "s", SlotType: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "reserved"}
	tests := []struct {
		name  string
		edit  func(*SlotInfo)
		fatal []string
	}{
		{"usable", func(*SlotInfo) {}, nil},
		{"unreserved WAL is still usable", func(s *SlotInfo) { s.WALStatus = "unreserved" }, nil},
		{"physical", func(s *SlotInfo) { s.SlotType = "physical" }, []string{"physical slot"}},
		{"other plugin", func(s *SlotInfo) { s.Plugin = "wal2json" }, []string{`plugin "wal2json"`, "pg_drop_replication_slot"}},
		{"other database", func(s *SlotInfo) { s.Database = "billing" }, []string{`database "billing"`, `"app"`}},
		{"invalidated", func(s *SlotInfo) { s.WALStatus = "lost" }, []string{"wal_status = lost", "events were skipped"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.edit(&s)
			wantFatal(t, CheckSlot(s, "app"), tt.fatal)
		})
	}
}

// wantFatal fails unless err is nil (want nil) or a FatalError naming every
// part of want.
func wantFatal(t *testing.T, err error, want []string) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if !IsFatal(err) {
		t.Fatalf("error %v; want a FatalError", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

func TestIsFatal(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("connect: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("read: connection reset by peer"), false},
		{"wrapped FatalError", fmt.Errorf("prepare slot: %w", Fatalf("slot %q is invalidated", "s")), true},
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
		if got := IsFatal(tt.err); got != tt.want {
			t.Errorf("%s: IsFatal(%v) = %v; want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestFatalErrorText(t *testing.T) {
	cause := errors.New("permission denied to create table")
	e := &FatalError{Msg: "the state table is missing", Err: cause}
	if got := e.Error(); got != "the state table is missing: permission denied to create table" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(e, cause) {
		t.Error("FatalError does not unwrap to its cause")
	}
	if got := Fatalf("slot %q", "s").Error(); got != `slot "s"` {
		t.Errorf("Fatalf(...).Error() = %q", got)
	}
}
