package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestStallStateWriteFails (issue 35, item 10): the state row cannot be
// written while events keep coming. Each session delivers new events to
// Kafka, fails at its first state write and ends; the next reads them again
// from the slot's confirmed position, which never moves, so the slot holds
// the WAL. Delivering events is no progress here: /healthz's Stalled() says
// so within OUTBOX_STALL_TIMEOUT + 5 s, naming the state write, with
// outbox_connector_stalled 1, while the lease stays with this instance. Once
// the state row can be written again the stall clears and every event is
// in Kafka, in order.
//
// The row lock also shows that a state write waits a bounded time: it
// holds the lease row FOR SHARE while it waits, which the lease's renewal
// waits for, so an unbounded wait lost the lease and left a backend queued
// behind the lock for every session.
func TestStallStateWriteFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		// block makes the state row unwritable; its result undoes it.
		block func(t *testing.T, pg *testenv.Postgres, conn *pgx.Conn) func()
		says  string // what the stall's reason names
	}{
		{"a trigger refuses the write", refuseStateWrites, "state row refused by a test trigger"},
		{"another session holds the row lock", lockStateRow, "lock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			brokers := testenv.SharedKafka(t)
			conn := pg.Conn(t, "outbox")
			ctx := context.Background()
			aggType := uniqueType("sstate")
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.StallTimeout = 3 * time.Second
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			token := run.relay.Token()
			load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 5, 20*time.Millisecond)

			// Healthy under the same load: never a stall, the slot moves.
			before := slotConfirmed(t, conn, cfg.Slot)
			for end := time.Now().Add(cfg.StallTimeout + 2*time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if st, why := run.relay.Stalled(); st {
					t.Fatalf("stalled while healthy: %s", why)
				}
			}
			if after := slotConfirmed(t, conn, cfg.Slot); after <= before || run.relay.Published() == 0 {
				t.Fatalf("healthy: slot confirmed %X -> %X, %d published; want both moving", before, after, run.relay.Published())
			}

			reconnects := metricValue(t, run, "outbox_connector_reconnects_total")
			undo := tc.block(t, pg, conn)
			published := run.relay.Published()
			began := time.Now()
			waitStalled(t, run, true, cfg.StallTimeout+5*time.Second)
			_, why := run.relay.Stalled()
			t.Logf("stalled %s after the state row became unwritable; %d events published meanwhile: %s",
				time.Since(began).Round(100*time.Millisecond), run.relay.Published()-published, why)
			if !strings.Contains(why, "state") || !strings.Contains(why, tc.says) {
				t.Errorf("the stall's reason %q does not name the failing state write (%q)", why, tc.says)
			}
			if run.relay.Published() <= published {
				t.Errorf("no event delivered while the state row was unwritable: not the case this test is for")
			}
			if v := metricValue(t, run, "outbox_connector_stalled"); v != ":1" {
				t.Errorf("outbox_connector_stalled %q while stalled, want 1", v)
			}
			// Stays stalled; the lease stays here; the slot stands still
			// (within the last promise recorded: sessions confirm up to
			// it without a write); no backend queues behind the lock.
			promise := stateConfirmed(t, conn, cfg.Slot)
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if st, _ := run.relay.Stalled(); !st {
					t.Fatalf("the stall cleared while the state row is still unwritable")
				}
			}
			if !run.relay.holding() || run.relay.Token() != token {
				t.Errorf("lease: holding %v, token %d (was %d); want the lease kept", run.relay.holding(), run.relay.Token(), token)
			}
			if p, slot := stateConfirmed(t, conn, cfg.Slot), slotConfirmed(t, conn, cfg.Slot); p != promise || slot > promise {
				t.Errorf("while the state row was unwritable: its promise %X -> %X, the slot confirmed at %X", promise, p, slot)
			}
			var waiting int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 1 {
				t.Errorf("%d backends wait on a lock; want at most the state write in flight", waiting)
			}

			// A lock not granted is someone else's moment: the writer
			// tries again at its next tick, and the session goes on
			// (before, each failed write ended it, and the next one read
			// the unconfirmed suffix again).
			if tc.says == "lock" {
				if now := metricValue(t, run, "outbox_connector_reconnects_total"); now != reconnects {
					t.Errorf("reconnects while the state row was locked: %q -> %q; want the session kept", reconnects, now)
				}
			}
			undo()
			waitStalled(t, run, false, 30*time.Second)
			events := load.Halt()
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			c.WaitFor(t, events, time.Minute)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			dups := c.Verify(t, events)
			t.Logf("%d events delivered in order; %d duplicates", len(events), dups)
		})
	}
}

// refuseStateWrites makes a trigger refuse every write of the state row
// (as a failing audit trigger would).
func refuseStateWrites(t *testing.T, _ *testenv.Postgres, conn *pgx.Conn) func() {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`CREATE FUNCTION refuse_state() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'state row refused by a test trigger'; END $$`,
		`CREATE TRIGGER refuse_state BEFORE INSERT OR UPDATE ON public.outbox_connector_state
		 FOR EACH ROW EXECUTE FUNCTION refuse_state()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if _, err := conn.Exec(ctx, `DROP TRIGGER refuse_state ON public.outbox_connector_state`); err != nil {
			t.Fatal(err)
		}
	}
}

// lockStateRow holds the state row's lock in an open transaction of
// another session (an operator's SELECT ... FOR UPDATE left open).
func lockStateRow(t *testing.T, pg *testenv.Postgres, _ *pgx.Conn) func() {
	t.Helper()
	ctx := context.Background()
	op := pg.Conn(t, "outbox")
	tx, err := op.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM public.outbox_connector_state FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// stateConfirmed is the position the state row promises.
func stateConfirmed(t *testing.T, conn *pgx.Conn, slot string) uint64 {
	t.Helper()
	var lsn uint64
	if err := conn.QueryRow(context.Background(),
		`SELECT (confirmed_lsn - '0/0')::bigint FROM public.outbox_connector_state WHERE slot_name = $1`, slot).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}
