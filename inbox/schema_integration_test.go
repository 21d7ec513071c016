package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestEnsureSchemaLeavesABusyTableAlone (review finding 5): EnsureSchema,
// which every member runs at start, takes no lock on a table that is already
// up to date: it returns at once while a transaction writing to the table is
// open, and the writers that come meanwhile do not queue behind it (ALTER
// TABLE ... ADD COLUMN IF NOT EXISTS took ACCESS EXCLUSIVE even when the
// column existed, and CREATE INDEX IF NOT EXISTS a SHARE lock, so a member
// start stopped every inbox insert until the longest open transaction
// ended). A table that does need the upgrade waits for its lock a bounded
// time and fails saying so, and writers wait no longer than that.
func TestEnsureSchemaLeavesABusyTableAlone(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	busy := func(t *testing.T, table string) (release func()) {
		t.Helper()
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (consumer, id, topic, kafka_partition, kafka_offset, outcome)
			VALUES ('busy', 'ev-open', 't', 0, 0, 'processed')`); err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Commit(ctx) }
	}
	// writeDuring inserts into table while ensure runs, with a lock_timeout
	// of its own, and returns how long the insert waited and its error.
	writeDuring := func(table string, ensure func() error) (ensureErr error, ensureTook, wrote time.Duration, writeErr error) {
		done := make(chan struct{})
		start := time.Now()
		go func() {
			defer close(done)
			ensureErr = ensure()
			ensureTook = time.Since(start)
		}()
		time.Sleep(200 * time.Millisecond) // ensure is waiting for its lock, if it takes one
		w0 := time.Now()
		_, writeErr = e.pool.Exec(ctx, `SET lock_timeout = '8s'; INSERT INTO `+table+` (consumer, id, topic, kafka_partition, kafka_offset, outcome)
			VALUES ('writer', 'ev-w', 't', 0, 0, 'processed'); RESET lock_timeout`)
		wrote = time.Since(w0)
		<-done
		return
	}

	t.Run("up to date", func(t *testing.T) {
		release := busy(t, "inbox")
		defer release()
		ensureErr, took, wrote, writeErr := writeDuring("inbox", func() error {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return inbox.EnsureSchema(cctx, e.pool, "")
		})
		if ensureErr != nil || took > 2*time.Second {
			t.Errorf("EnsureSchema on an up-to-date table with a writer's transaction open: %v after %s; want nil at once (no lock taken)",
				ensureErr, took.Round(time.Millisecond))
		}
		if writeErr != nil || wrote > time.Second {
			t.Errorf("an insert during EnsureSchema: %v after %s; want it not to wait", writeErr, wrote.Round(time.Millisecond))
		}
	})

	t.Run("needs the upgrade", func(t *testing.T) {
		if _, err := e.pool.Exec(ctx, `CREATE TABLE public.inbox_old (
			consumer text NOT NULL, id text NOT NULL, topic text NOT NULL, kafka_partition integer NOT NULL,
			kafka_offset bigint NOT NULL, outcome text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (consumer, id))`); err != nil {
			t.Fatal(err)
		}
		release := busy(t, "inbox_old")
		ensureErr, took, wrote, writeErr := writeDuring("inbox_old", func() error {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return inbox.EnsureSchema(cctx, e.pool, "public.inbox_old")
		})
		var pgErr *pgconn.PgError
		if ensureErr == nil || !errors.As(ensureErr, &pgErr) || pgErr.Code != "55P03" || took > 5*time.Second {
			t.Errorf("EnsureSchema upgrading a busy table: %v after %s; want a lock timeout (55P03) within a few seconds",
				ensureErr, took.Round(time.Millisecond))
		} else if !strings.Contains(ensureErr.Error(), "busy") {
			t.Errorf("the error %q does not say the table is busy", ensureErr)
		}
		if writeErr != nil || wrote > 4*time.Second {
			t.Errorf("an insert while EnsureSchema waited to upgrade: %v after %s; want it to wait no longer than the upgrade's bounded lock wait",
				writeErr, wrote.Round(time.Millisecond))
		}
		release()
		if err := inbox.EnsureSchema(ctx, e.pool, "public.inbox_old"); err != nil {
			t.Fatalf("EnsureSchema once the table is quiet: %v", err)
		}
		if n := count(t, e.pool, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.inbox_old'::regclass
			AND attname IN ('payload_sha256', 'redriven_sha256')`); n != 2 {
			t.Errorf("%d of the 2 hash columns added", n)
		}
		if n := count(t, e.pool, `SELECT count(*) FROM pg_indexes WHERE tablename = 'inbox_old' AND indexdef LIKE '%(processed_at)%'`); n != 1 {
			t.Errorf("%d processed_at indexes, want 1", n)
		}
	})
}
