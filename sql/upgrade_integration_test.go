package schema

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestOutboxTraceColumnUpgrade: 001_outbox.sql gives an outbox table made
// before the trace context column existed that column, and applying it
// again prints no notice about it (a DO block that looks in the catalog,
// not ADD COLUMN IF NOT EXISTS, whose "already exists, skipping" an
// operator would have to read past).
func TestOutboxTraceColumnUpgrade(t *testing.T) {
	ctx := context.Background()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	if _, err := pg.Conn(t, "postgres").Exec(ctx, "CREATE DATABASE old"); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "sql", "001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg, err := pgx.ParseConfig(pg.DSN("old"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The table as sql/001_outbox.sql made it before the column.
	if _, err := conn.Exec(ctx, `CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	hasColumn := func() bool {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'public.outbox'::regclass
			AND attname = 'tracingspancontext' AND NOT attisdropped AND atttypid = 'text'::regtype AND NOT attnotnull)`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for round := range 2 {
		mu.Lock()
		notices = nil
		mu.Unlock()
		if _, err := conn.Exec(ctx, string(file)); err != nil {
			t.Fatalf("apply 001_outbox.sql (round %d): %v", round, err)
		}
		if !hasColumn() {
			t.Fatalf("round %d: no nullable text column tracingspancontext", round)
		}
		mu.Lock()
		for _, n := range notices {
			// CREATE TABLE/INDEX IF NOT EXISTS say they skipped, as they
			// always did; nothing the upgrade added may say anything.
			if strings.Contains(n, "tracingspancontext") || strings.Contains(n, "column") {
				t.Errorf("round %d: notice %q", round, n)
			}
		}
		t.Logf("round %d notices: %q", round, notices)
		mu.Unlock()
	}
}
