package relay

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestPollMarkRowLocked: an operator holds a row lock on an unpublished
// row (fixing its payload in place, or an UPDATE ... SET published_at =
// NULL over a range, left open) for longer than a statement's bound. The
// mark does not wait on it until the statement is cancelled and the
// session ends (before: the next owner published the same batch again,
// every ~31 s, for as long as the lock was held): it marks what it can,
// waits for the rest with backoff while the session lives, says the stall,
// and publishes nothing twice.
func TestPollMarkRowLocked(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("rowlock")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	var ids []string
	if err := conn.QueryRow(ctx, `WITH i AS (INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'agg-' || g, 'T', '{}' FROM generate_series(1, 5) g RETURNING id::text)
		SELECT array_agg(id ORDER BY id) FROM i`, aggType).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	// The operator's transaction: a row lock on one of them, held.
	op := pg.Conn(t, "outbox")
	tx, err := op.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, ids[2]); err != nil {
		t.Fatal(err)
	}
	cfg := pollConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelay(t, cfg)
	run.waitPolling(t)
	waitCount(t, c, 5)
	why := waitPollStalled(t, run, true, 30*time.Second)
	t.Logf("stalled while a row is locked: %s", why)
	// The four rows not locked are marked while the lock is held.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var marked int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id::text = ANY($1) AND published_at IS NOT NULL`, ids).Scan(&marked); err != nil {
			t.Fatal(err)
		}
		if marked == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 4 rows not locked marked while the fifth is locked; want 4", marked)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Past a statement's bound (max(3 × OUTBOX_LEASE_TTL, 30 s)): before,
	// the mark was cancelled there, the session ended and the batch was
	// published again.
	time.Sleep(35 * time.Second)
	if n := c.Count(); n != 5 {
		t.Errorf("%d records of 5 events while a row was locked for 35 s; want each published once", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitMarked(t, conn, ids)
	waitPollStalled(t, run, false, 30*time.Second)
	if n := c.Count(); n != 5 {
		t.Errorf("%d records of 5 events; want each published once", n)
	}
}
