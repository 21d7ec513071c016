package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestWrap(t *testing.T) {
	if Wrap(nil, strings.ToUpper) != nil {
		t.Fatal("Wrap(nil) is not nil")
	}
	inner := &pgconn.PgError{Code: "28P01", Message: "password authentication failed for hunter2"}
	err := fmt.Errorf("OUTBOX_PG_DSN: %w", Wrap(fmt.Errorf("connect: %w", inner), func(s string) string {
		return strings.ReplaceAll(s, "hunter2", "xxxxx")
	}))
	if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("text not masked: %s", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Errorf("errors.As lost the PostgreSQL error: %v", pgErr)
	}
}
