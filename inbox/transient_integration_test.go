package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestTransientHandlerErrorsAreRetried (issue 14 defect 2): a lock timeout
// (55P03), a statement timeout (57014), a deadlock (40P01) and a
// serialization failure (40001) raised inside the handler, twice as many
// times as MaxAttempts, are retried as the database's fault: every event is
// applied exactly once and none is dead-lettered.
func TestTransientHandlerErrorsAreRetried(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE locked (k int PRIMARY KEY); INSERT INTO locked VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	cfg := e.quiet()
	failures := 2 * cfg.MaxAttempts
	var attempts attemptCounter
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id := inbox.Header(r, "id")
		n := attempts.next(id)
		var stmt string
		switch string(r.Value) {
		case "lock":
			// The test holds the row until this has failed often enough.
			stmt = `SET LOCAL lock_timeout = '20ms'; SELECT k FROM locked WHERE k = 1 FOR UPDATE`
		case "timeout":
			if n <= failures {
				stmt = `SET LOCAL statement_timeout = '20ms'; SELECT pg_sleep(1)`
			}
		case "deadlock":
			if n <= failures {
				stmt = `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected (raised by the test)' USING ERRCODE = '40P01'; END $$`
			}
		case "serialization":
			if n <= failures {
				stmt = `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access (raised by the test)' USING ERRCODE = '40001'; END $$`
			}
		}
		if stmt != "" {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("attempt %d: %w", n, err)
			}
		}
		return effectHandler(ctx, tx, r)
	}
	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT k FROM locked WHERE k = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	kinds := []string{"lock", "timeout", "deadlock", "serialization"}
	var recs []*kgo.Record
	for _, k := range kinds {
		recs = append(recs, rec("ev-"+k, k), rec("ev-after-"+k, "ok"))
	}
	e.produce(t, recs...)
	c, err := inbox.New(e.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "the lock-timeout handler to fail repeatedly", 30*time.Second, func() bool {
		return attempts.get("ev-lock") > failures || c.Stats().DeadLettered > 0
	})
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().Processed < int64(len(recs)) && c.Stats().DeadLettered == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	s := c.Stats()
	if s.DeadLettered != 0 || s.Processed != int64(len(recs)) {
		t.Errorf("stats %+v; want %d processed, none dead-lettered (transient database errors are not the record's fault)", s, len(recs))
	}
	for _, k := range kinds {
		if n := effectsOf(t, e, "ev-"+k); n != 1 {
			t.Errorf("%s: %d effects, want 1 (%d handler attempts)", k, n, attempts.get("ev-"+k))
		}
	}
}
