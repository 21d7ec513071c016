package relay

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestRecoverResumeRetention: a slot recovery whose window's publish fails
// midway (a fault after 20 rows here; a Kafka outage, a registry refusal or
// the liveness probe's restart in production) resumes at the next session
// from the table as it is then. A retention that deleted, meanwhile, the
// oldest rows and with them rows of the window (DELETE ... WHERE created_at
// < ..., as the outbox Cleaner does) makes the resume refuse, naming the way
// out, instead of publishing what is left and recording the recovery done.
// Then -allow-gap publishes the rows left and finishes it.
func TestRecoverResumeRetention(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("resume")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.OnSlotLoss = "recover"
	w := testenv.NewWriter()
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	w.Write(t, ctx, conn, aggType, 200, 5, 10)
	waitCount(t, c, 200)
	// Long enough for a state write to record a recovery point past the
	// first 200: they are older than the window.
	time.Sleep(time.Second)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	window := writeSpread(t, ctx, conn, w, aggType, 100)
	loseSlot(t, ctx, conn, "dropped")
	cutoff := createdAt(t, conn, window[59].ID)

	del := pg.Conn(t, "outbox")
	hook, deleted := retentionAt(t, del, 20, cutoff, false)
	rec := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
	err := waitRefusal(t, conn, rec, "the resumed recovery")
	if deleted.Load() != 259 {
		t.Fatalf("the retention deleted %d rows; want the 200 older ones and 59 of the window", deleted.Load())
	}
	for _, want := range []string{"cannot recover slot", "retention", "-allow-gap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	t.Logf("refused: %v", err)
	if done, recovering := stateFlags(t, conn); done || !recovering {
		t.Fatalf("after the refusal: snapshot_done %v, recovering %v; want the recovery still owed", done, recovering)
	}

	// The way out the refusal names: -allow-gap publishes what is left.
	cfg.RecoverAllowGap = true
	gap := startRelay(t, cfg)
	gap.waitStreaming(t)
	left := heldBy(t, conn, window)
	c.WaitFor(t, left, 60*time.Second)
	if done, recovering := stateFlags(t, conn); !done || recovering {
		t.Errorf("after -allow-gap: snapshot_done %v, recovering %v; want the recovery done", done, recovering)
	}
	t.Logf("with -allow-gap: the %d rows of the window left delivered", len(left))
}

// TestRecoverLostDuringInitialSnapshot: the slot is lost while its initial
// snapshot is published (dropped after 20 rows), so the recovery owes the
// whole table. The rows the initial snapshot read first are the evidence:
// while one at least as old as the oldest of them is still there, a
// retention (which deletes by age, oldest first) deleted none of them, and
// the recovery publishes the table ("kept"). When the retention deleted the
// oldest rows meanwhile ("retention"), the recovery refuses, naming the way
// out, instead of publishing what is left and recording the snapshot done.
func TestRecoverLostDuringInitialSnapshot(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	for _, mode := range []string{"kept", "retention"} {
		t.Run(mode, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("initial")
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.OnSlotLoss = "recover"
			w := testenv.NewWriter()
			rows := writeSpread(t, ctx, conn, w, aggType, 100)
			cutoff := createdAt(t, conn, rows[59].ID)

			del := pg.Conn(t, "outbox")
			hook, deleted := retentionAt(t, del, 20, cutoff, true)
			if mode == "kept" {
				hook, deleted = retentionAt(t, del, 20, time.Time{}, true)
			}
			run := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
			if mode == "kept" {
				run.waitStreaming(t)
				c.WaitFor(t, rows, 60*time.Second)
				if got := metricValue(t, run, "outbox_connector_slot_recoveries_total"); got != ":1" {
					t.Errorf("outbox_connector_slot_recoveries_total = %q, want 1", got)
				}
				if done, _ := stateFlags(t, conn); !done {
					t.Error("snapshot_done false after the recovery published the table")
				}
				t.Logf("the slot lost during the initial snapshot, no row deleted: the recovery published all %d rows", len(rows))
				return
			}
			err := waitRefusal(t, conn, run, "the recovery of a slot lost during its initial snapshot")
			if deleted.Load() != 59 {
				t.Fatalf("the retention deleted %d rows; want 59", deleted.Load())
			}
			for _, want := range []string{"cannot recover slot", "initial snapshot", "retention", "-allow-gap"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestForeignStateRowMissingSlot: the state row was written by another
// cluster (a logical restore or a copy of the database, the state table
// copied along) and the slot is missing here. A start with OUTBOX_SNAPSHOT
// never must not take this for a new deployment (a new slot, streaming from
// now, the restored backlog never published): it refuses, naming both
// system identifiers, and the ways out, as it refuses the same row beside
// a slot that exists. OUTBOX_ON_SLOT_LOSS=recover, the first way out,
// publishes the backlog from the table (a window by time: the other
// cluster's transaction ids mean nothing here).
func TestForeignStateRowMissingSlot(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("foreign")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.Snapshot = "never"
	w := testenv.NewWriter()
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	w.Write(t, ctx, conn, aggType, 100, 5, 10)
	waitCount(t, c, 100)
	time.Sleep(time.Second) // a recovery point past the 100
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	const foreign = "7000000000000000001"
	var here string
	if err := conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&here); err != nil {
		t.Fatal(err)
	}
	// The rows delivered before the copy are an hour old: older than the
	// window by time below (the margin is 30 minutes).
	for _, q := range []string{
		"UPDATE outbox_connector_state SET system_identifier = '" + foreign + "'",
		"UPDATE outbox SET created_at = created_at - interval '1 hour'",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	loseSlot(t, ctx, conn, "dropped")
	before := len(w.Snapshot())
	w.Write(t, ctx, conn, aggType, 50, 5, 10)
	backlog := w.Snapshot()[before:]

	refused := startRelay(t, cfg)
	deadline := time.After(60 * time.Second)
	var err error
wait:
	for {
		select {
		case err = <-refused.done:
			refused.cancel = nil
			break wait
		case <-deadline:
			t.Fatal("the connector neither refused nor streamed within 60s")
		case <-time.After(20 * time.Millisecond):
			if refused.relay.Streaming() {
				t.Fatalf("the connector created a new slot and streams from it: the state row of system %s was taken for a new deployment, and the %d events written before the slot were skipped", foreign, len(backlog))
			}
		}
	}
	if !fatal.Is(err) {
		t.Fatalf("the connector ended with %v; want a fatal refusal", err)
	}
	for _, want := range []string{foreign, here, "another cluster", "OUTBOX_ON_SLOT_LOSS=recover", "OUTBOX_ACCEPT_SLOT_RESET=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %q: %v", want, err)
		}
	}
	t.Logf("refused: %v", err)
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots after the refusal (%v); want none", slots, err)
	}

	// The first way out: recovery from the table, by time.
	cfg.OnSlotLoss = "recover"
	cfg.RecoverMargin = 30 * time.Minute
	rec := startRelay(t, cfg)
	rec.waitStreaming(t)
	c.WaitFor(t, backlog, 60*time.Second)
	if got := metricValue(t, rec, "outbox_connector_slot_recoveries_total"); got != ":1" {
		t.Errorf("outbox_connector_slot_recoveries_total = %q, want 1", got)
	}
	var sys string
	if err := conn.QueryRow(ctx, "SELECT system_identifier FROM outbox_connector_state").Scan(&sys); err != nil || sys != here {
		t.Errorf("the state row's system identifier after the recovery: %q, %v; want %s", sys, err, here)
	}
	dups := c.Count() - len(w.Snapshot())
	t.Logf("recovered by time: the %d events written after the loss delivered, %d duplicates", len(backlog), dups)
	if dups >= 100 {
		t.Errorf("%d duplicates: the window by time took the events delivered before the loss too", dups)
	}
}

// writeSpread writes n events, one transaction each, a few milliseconds
// apart, so that created_at orders them; it returns them in order.
func writeSpread(t *testing.T, ctx context.Context, conn *pgx.Conn, w *testenv.Writer, aggType string, n int) []testenv.Event {
	t.Helper()
	before := len(w.Snapshot())
	for i := range n {
		if err := w.Tx(ctx, conn, aggType, 1, 5, i); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	return w.Snapshot()[before:]
}

// createdAt is the created_at of the outbox row id.
func createdAt(t *testing.T, conn *pgx.Conn, id string) time.Time {
	t.Helper()
	var at time.Time
	if err := conn.QueryRow(context.Background(), "SELECT created_at FROM outbox WHERE id = $1", id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// retentionAt is a fault hook that fails the snapshot's publish at its
// n-th row, after deleting (on del) the rows created before cutoff, as a
// retention would (none when cutoff is zero); dropSlot drops the slot
// there too (lost during its snapshot). deleted counts the rows deleted.
func retentionAt(t *testing.T, del *pgx.Conn, n int32, cutoff time.Time, dropSlot bool) (fault.Hook, *atomic.Int64) {
	var seen atomic.Int32
	var deleted atomic.Int64
	return func(s fault.Step) error {
		if s != fault.SnapshotRow || seen.Add(1) != n {
			return nil
		}
		ctx := context.Background()
		if !cutoff.IsZero() {
			tag, err := del.Exec(ctx, "DELETE FROM outbox WHERE created_at < $1", cutoff)
			if err != nil {
				return err
			}
			deleted.Store(tag.RowsAffected())
		}
		if dropSlot {
			if _, err := del.Exec(ctx, "SELECT pg_drop_replication_slot('outbox_slot')"); err != nil {
				return err
			}
		}
		return errors.New("the publish fails midway")
	}, &deleted
}

// waitRefusal waits until run ends with a fatal error, failing the test
// when it records the snapshot it owes done (once the row said it owes
// one: a recovery's intent resets the row of the slot it replaces), or
// neither within 90s.
func waitRefusal(t *testing.T, conn *pgx.Conn, run *running, what string) error {
	t.Helper()
	deadline := time.After(90 * time.Second)
	owed := false
	for {
		select {
		case err := <-run.done:
			run.cancel = nil
			if err == nil || !fatal.Is(err) {
				t.Fatalf("%s ended with %v; want a fatal refusal", what, err)
			}
			return err
		case <-deadline:
			t.Fatalf("%s neither refused nor finished within 90s", what)
		case <-time.After(50 * time.Millisecond):
			done, _ := stateFlags(t, conn)
			owed = owed || !done
			if owed && done {
				t.Fatalf("%s recorded the snapshot done (streaming: %v): rows the retention deleted meanwhile were skipped", what, run.relay.Streaming())
			}
		}
	}
}

// stateFlags reads the state row's snapshot_done and recovering (false
// when there is no row yet).
func stateFlags(t *testing.T, conn *pgx.Conn) (done, recovering bool) {
	t.Helper()
	err := conn.QueryRow(context.Background(), "SELECT snapshot_done, recovering FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&done, &recovering)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return done, recovering
}
