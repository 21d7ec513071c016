package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// recoverySteps are the steps of a recovery a fault may hit ("" none).
var recoverySteps = []fault.Step{"", fault.SlotIntent, fault.SlotCreated, fault.SnapshotImported, fault.StateWritten, fault.SnapshotRow, fault.SnapshotDone}

// slotLosses are the ways a slot is lost while the connector is stopped.
var slotLosses = []string{"dropped", "invalidated", "advanced"}

// TestRecoverLostSlot: events are written all along; the connector stops,
// the slot is lost (dropped, invalidated by max_slot_wal_keep_size, or
// advanced past what the connector confirmed) while events go on being
// written. With OUTBOX_ON_SLOT_LOSS=fail the connector refuses, as before,
// naming the way out; with recover it replaces the slot, publishes the
// window again from the outbox table (a fault failing one step of the
// recovery, drawn at random), and streams on. Every time: nothing lost,
// per-aggregate order, and every duplicate is an event of the window (its
// transaction id at least the recovery point's), which is not the whole
// table. `make test` runs each loss once with a step drawn at random
// (OUTBOX_TEST_SEED repeats a draw); `make soak` runs every loss with every
// step.
func TestRecoverLostSlot(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	brokers := testenv.SharedKafka(t)
	for _, loss := range slotLosses {
		steps := []fault.Step{recoverySteps[rng.IntN(len(recoverySteps))]}
		if os.Getenv("OUTBOX_SOAK") != "" {
			steps = recoverySteps
		}
		for _, step := range steps {
			n := 1
			if step == fault.SnapshotRow {
				n = 1 + rng.IntN(50)
			}
			name := loss + "/" + string(step) + "#" + strconv.Itoa(n)
			if step == "" {
				name = loss + "/no-fault"
			}
			t.Run(name, func(t *testing.T) { runRecoverCase(t, brokers, loss, step, n) })
		}
	}
}

func runRecoverCase(t *testing.T, brokers, loss string, step fault.Step, n int) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_slot_wal_keep_size": "32MB"}})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("recover")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 20, 2*time.Millisecond)

	cfg.OnSlotLoss = "recover"
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	waitCount(t, c, 300)
	time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	before := c.Count()
	time.Sleep(300 * time.Millisecond) // events of the gap
	loseSlot(t, ctx, conn, loss)
	time.Sleep(300 * time.Millisecond) // more after the loss

	// Recovery off: refused, as before, with the way out.
	off := cfg
	off.OnSlotLoss = "fail"
	refused := startRelay(t, off)
	select {
	case err := <-refused.done:
		refused.cancel = nil
		if err == nil || !strings.Contains(err.Error(), "OUTBOX_ON_SLOT_LOSS=recover") {
			t.Fatalf("with recovery off the connector ended with %v; want a refusal naming OUTBOX_ON_SLOT_LOSS=recover", err)
		}
		t.Logf("recovery off: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("with recovery off the connector neither refused nor stopped within 60s")
	}

	var from int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(recover_xmin, 0) FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&from); err != nil || from == 0 {
		t.Fatalf("recovery point %d, %v; want one recorded", from, err)
	}
	var older int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE pg_current_xact_id()::text::bigint - age(xmin) < $1", from).Scan(&older); err != nil {
		t.Fatal(err)
	}
	if older == 0 {
		t.Fatalf("no row is older than the recovery point %d: the window would be the whole table", from)
	}

	var hit atomic.Bool
	var seen atomic.Int32
	hook := func(s fault.Step) error {
		if step != "" && s == step && seen.Add(1) == int32(n) {
			hit.Store(true)
			return errors.New("injected")
		}
		return nil
	}
	rec := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
	rec.waitStreaming(t)
	time.Sleep(500 * time.Millisecond)
	want := load.Halt()
	c.WaitFor(t, want, 120*time.Second)
	if err := rec.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if step != "" && !hit.Load() {
		t.Errorf("the fault at %s #%d was never reached", step, n)
	}
	dups := c.Verify(t, want)
	if got := metricValue(t, rec, "outbox_connector_slot_recoveries_total"); got != ":1" {
		t.Errorf("outbox_connector_slot_recoveries_total = %q, want 1", got)
	}

	// Every duplicate is an event of the window.
	counts := map[string]int{}
	for _, r := range c.Records() {
		counts[testenv.Header(r, "id")]++
	}
	var dupIDs []string
	for id, k := range counts {
		if k > 1 {
			dupIDs = append(dupIDs, id)
		}
	}
	var outside int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[]) AND pg_current_xact_id()::text::bigint - age(xmin) < $2", dupIDs, from).Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if outside != 0 {
		t.Errorf("%d duplicated events were written before the recovery point: published again outside the window", outside)
	}
	var done, recovering bool
	var after int64
	if err := conn.QueryRow(ctx, "SELECT snapshot_done, recovering, coalesce(recover_xmin, 0) FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&done, &recovering, &after); err != nil {
		t.Fatal(err)
	}
	if !done || recovering || after < from {
		t.Errorf("state after the recovery: snapshot_done %v, recovering %v, recover_xmin %d (was %d)", done, recovering, after, from)
	}
	t.Logf("%s, fault at %q #%d: %d events, %d consumed before the stop, %d rows older than the window, %d duplicates (%d distinct, all in the window)",
		loss, step, n, len(want), before, older, dups, len(dupIDs))
}

// loseSlot loses the stopped connector's slot: dropped, invalidated (WAL
// pushed past max_slot_wal_keep_size, then a checkpoint), or advanced to the
// end of the WAL.
func loseSlot(t *testing.T, ctx context.Context, conn *pgx.Conn, how string) {
	t.Helper()
	switch how {
	case "dropped":
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot('outbox_slot')"); err != nil {
			t.Fatal(err)
		}
	case "advanced":
		if _, err := conn.Exec(ctx, "SELECT pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())"); err != nil {
			t.Fatal(err)
		}
	case "invalidated":
		t.Logf("slot invalidated after %d rounds of WAL", testenv.InvalidateSlot(t, conn, "outbox_slot"))
	default:
		t.Fatalf("unknown loss %q", how)
	}
}

// TestRecoverRefused: a recovery whose window the outbox table cannot be
// shown to hold is refused with what to do, before anything changes: rows
// deleted in the transaction that wrote them (delete-after-insert; here the
// slot invalidated, and the way out the refusal names, a start with
// OUTBOX_ACCEPT_SLOT_RESET=true and recovery off, replaces it), events
// written as logical messages (even with table-mode rows older than the
// window in the table), and a retention that deleted every row older than
// the window. With -allow-gap (RecoverAllowGap) the retention case goes on,
// once, and delivers every row the table still holds.
func TestRecoverRefused(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	for _, mode := range []string{"delete-after-insert", "messages", "retention"} {
		t.Run(mode, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_slot_wal_keep_size": "32MB"}})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("refused")
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.OnSlotLoss = "recover"
			w := testenv.NewWriter()
			write := func(n int) {
				switch mode {
				case "retention":
					w.Write(t, ctx, conn, aggType, n, 5, 10)
				case "messages":
					// Table-mode rows too: rows older than the window are
					// there, yet the messages are not.
					w.Write(t, ctx, conn, aggType, n/2, 5, 10)
					for i := range n - n/2 {
						if _, err := conn.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', gen_random_uuid(), 'aggregatetype', $1::text, 'aggregateid', $2::text, 'type', 'Tested', 'payload', '{}'::json)::text)`,
							aggType, "agg-"+strconv.Itoa(i%5)); err != nil {
							t.Fatal(err)
						}
					}
				default:
					// outbox.ModeDeleteAfterInsert's two statements, in one
					// transaction (a CTE's DELETE would not see the INSERT).
					for i := range n {
						err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
							var id string
							if err := tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), $1, $2, 'Tested', '{}') RETURNING id::text`,
								aggType, "agg-"+strconv.Itoa(i%5)).Scan(&id); err != nil {
								return err
							}
							_, err := tx.Exec(ctx, "DELETE FROM outbox WHERE id = $1::uuid", id)
							return err
						})
						if err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			write(200)
			waitCount(t, c, 200)
			// Long enough for a state write to record a recovery point
			// past the first 200 (a point is recorded once the WAL
			// position it was taken at is acked).
			time.Sleep(time.Second)
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			var older int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE pg_current_xact_id()::text::bigint - age(xmin) < (SELECT recover_xmin FROM outbox_connector_state)").Scan(&older); err != nil {
				t.Fatal(err)
			}
			if want := map[string]int{"delete-after-insert": 0, "messages": 100, "retention": 200}[mode]; older != want {
				t.Fatalf("%d rows older than the recovery point after the first 200 were delivered; want %d", older, want)
			}
			write(100)
			if mode == "retention" {
				// The retention deleted everything older than the window.
				if _, err := conn.Exec(ctx, "DELETE FROM outbox WHERE created_at < (SELECT recover_at FROM outbox_connector_state)"); err != nil {
					t.Fatal(err)
				}
			}
			loss := "dropped"
			if mode == "delete-after-insert" {
				loss = "invalidated"
			}
			loseSlot(t, ctx, conn, loss)
			slots := func() int {
				var n int
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_slot'").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := slots()
			refused := startRelay(t, cfg)
			var err error
			select {
			case err = <-refused.done:
				refused.cancel = nil
			case <-time.After(60 * time.Second):
				t.Fatal("the recovery was neither refused nor ended within 60s")
			}
			wants := map[string][]string{
				"delete-after-insert": {"cannot recover slot", "delete-after-insert", "none older", "OUTBOX_ACCEPT_SLOT_RESET=true", "-allow-gap"},
				"messages":            {"cannot recover slot", "logical decoding messages", "OUTBOX_ACCEPT_SLOT_RESET=true", "-allow-gap"},
				"retention":           {"cannot recover slot", "retention", "none older", "-allow-gap"},
			}[mode]
			for _, want := range wants {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("recovery ended with %v; want a refusal saying %q", err, want)
				}
			}
			t.Logf("refused: %v", err)
			if n := slots(); n != before {
				t.Fatalf("%d slots after the refusal, %d before: a refused recovery must change nothing", n, before)
			}
			switch mode {
			case "delete-after-insert":
				// The way out the refusal names: recovery off, the reset
				// accepted; the invalidated slot is replaced.
				cfg.OnSlotLoss, cfg.AcceptSlotReset = "fail", true
				reset := startRelay(t, cfg)
				reset.waitStreaming(t)
				before := c.Count()
				write(50)
				waitCount(t, c, before+50)
				t.Logf("OUTBOX_ACCEPT_SLOT_RESET=true replaced the invalidated slot; new events flow")
			case "messages":
				// Let through once: the new slot's state row still says
				// what the slot carried, so a later loss refuses again.
				cfg.RecoverAllowGap = true
				rec := startRelay(t, cfg)
				rec.waitStreaming(t)
				var seen bool
				if err := conn.QueryRow(ctx, "SELECT messages_seen FROM outbox_connector_state").Scan(&seen); err != nil || !seen {
					t.Fatalf("messages_seen after the recovery: %v, %v; want it kept", seen, err)
				}
			case "retention":
				cfg.RecoverAllowGap = true
				rec := startRelay(t, cfg)
				rec.waitStreaming(t)
				if rec.relay.allowGap.Load() {
					t.Error("-allow-gap outlived the recovery it was given for")
				}
				left := heldBy(t, conn, w.Events)
				if len(left) < 100 {
					t.Fatalf("%d rows left in the table; want at least the 100 of the window", len(left))
				}
				c.WaitFor(t, left, 60*time.Second)
				t.Logf("with -allow-gap: the %d rows left delivered", len(left))
			}
		})
	}
}

// TestRecoverLongTransaction: a transaction that wrote an outbox row and
// stayed open across the recovery points the connector recorded (taken
// while it ran) commits after the connector stopped; the slot is lost. The
// recovery publishes it: its transaction id is at least the point's, which
// is the oldest transaction running when the point was taken, not the next
// one to start. (A point taken at the snapshot's xmax would lose it.)
func TestRecoverLongTransaction(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("longtx")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.OnSlotLoss = "recover"
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	// Events older than the long transaction: the table shows the window
	// is whole.
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 100, 5, 10)

	long := pg.Conn(t, "outbox")
	tx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	const longID = "00000000-0000-4000-8000-00000000abcd"
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'long', 'Tested', '{}')`, longID, aggType); err != nil {
		t.Fatal(err)
	}
	// Events after it move the recorded point on.
	for range 5 {
		w.Write(t, ctx, conn, aggType, 100, 5, 10)
		time.Sleep(500 * time.Millisecond)
	}
	c.WaitFor(t, w.Snapshot(), 60*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	var point, longXID int64
	if err := conn.QueryRow(ctx, "SELECT recover_xmin FROM outbox_connector_state").Scan(&point); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&longXID); err != nil {
		t.Fatal(err)
	}
	var later int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE pg_current_xact_id()::text::bigint - age(xmin) > $1", longXID).Scan(&later); err != nil {
		t.Fatal(err)
	}
	if later == 0 {
		t.Fatalf("no event was written after the long transaction began: the points did not move past it")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	loseSlot(t, ctx, conn, "dropped")
	rec := startRelay(t, cfg)
	rec.waitStreaming(t)
	c.WaitFor(t, append(w.Snapshot(), testenv.Event{ID: longID}), 60*time.Second)
	t.Logf("the long transaction (xid %d) committed after the stop, %d later rows delivered before it; recovery point %d: delivered", longXID, later, point)
}

// TestFailoverPromotedStandby: the connector and a writer use a DSN naming a
// primary and its physical standby (pg_basebackup, streaming replication)
// with target_session_attrs=read-write. While events are written
// continuously the primary is killed (immediate stop) and the standby
// promoted: the connector follows it, finds its slot missing there (slots
// are not replicated before PostgreSQL 17's failover slots), recovers from
// the outbox table (OUTBOX_ON_SLOT_LOSS=recover) and streams on. Every
// event committed and replicated (what the new primary's table holds) is
// delivered, in per-aggregate order; duplicates are counted.
func TestFailoverPromotedStandby(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	primary := testenv.StartPostgres(t, testenv.PGOptions{})
	standby := primary.StartStandby(t, nil)
	runFailover(t, brokers, primary, standby, false)
}

// TestFailoverSyncedSlot: the same with PostgreSQL 17, the connector's slot
// created as a failover slot (OUTBOX_SLOT_FAILOVER=true), the standby
// synchronizing it (sync_replication_slots, a physical slot with
// hot_standby_feedback) and the primary holding logical decoding back to
// what the standby received (synchronized_standby_slots). The primary is
// killed once the standby's copy is ready: the connector continues from
// the synchronized slot, with no recovery from the table.
func TestFailoverSyncedSlot(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	primary := testenv.StartPostgres(t, testenv.PGOptions{BinDir: bin, Settings: map[string]string{"synchronized_standby_slots": "'standby1'"}})
	// The standby's physical slot exists before the standby starts: the
	// slot sync worker gives up for a while on a missing one.
	if _, err := primary.Conn(t, "outbox").Exec(context.Background(), "SELECT pg_create_physical_replication_slot('standby1', true)"); err != nil {
		t.Fatal(err)
	}
	standby := primary.StartStandby(t, map[string]string{"primary_slot_name": "'standby1'", "sync_replication_slots": "on", "hot_standby_feedback": "on",
		// The copy has the primary's settings: once promoted, it has no
		// standby of its own to wait for.
		"synchronized_standby_slots": "''"})
	// A copy of the data directory copies the primary's slots too.
	if _, err := standby.Conn(t, "postgres").Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'standby1'"); err != nil {
		t.Fatal(err)
	}
	runFailover(t, brokers, primary, standby, true)
}

// runFailover writes events continuously through a multi-host DSN, kills
// the primary, promotes the standby, and checks that every event the new
// primary holds is delivered. synced: the slot is a failover slot, ready on
// the standby before the kill, and the connector continues from it;
// otherwise it recovers the missing slot from the table.
func runFailover(t *testing.T, brokers string, primary, standby *testenv.Postgres, synced bool) {
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/outbox?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", primary.Port, standby.Port)
	aggType := uniqueType("failover")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, dsn, brokers)
	cfg.OnSlotLoss = "recover"
	cfg.SlotFailover = synced
	load := testenv.StartLoad(t, dsn, aggType, 20, 2*time.Millisecond)
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	waitCount(t, c, 500)
	if synced {
		waitSynced(t, standby)
	}
	time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond)
	before := c.Count()
	if err := primary.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(500 * time.Millisecond)
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	t.Logf("primary killed with %d records consumed; standby promoted %s later", before, time.Since(killed).Round(time.Millisecond))
	recoveries := ":1"
	if synced {
		recoveries = ":0"
	}
	deadline := time.Now().Add(90 * time.Second)
	for c.Count() <= before || !run.relay.Streaming() || run.relay.Token() < 2 {
		select {
		case err := <-run.done:
			run.cancel = nil
			t.Fatalf("the connector ended after the failover: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connector did not stream from the promoted standby within 90s (recoveries %q)", metricValue(t, run, "outbox_connector_slot_recoveries_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("streaming from the promoted standby %s after the kill", time.Since(killed).Round(time.Millisecond))
	time.Sleep(time.Second)
	written := load.Halt()
	conn := standby.Conn(t, "outbox")
	want := heldBy(t, conn, written)
	c.WaitFor(t, want, 120*time.Second)
	if got := metricValue(t, run, "outbox_connector_slot_recoveries_total"); got != recoveries {
		t.Errorf("outbox_connector_slot_recoveries_total = %q after the failover, want %q", got, recoveries)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events committed, %d of them replicated before the kill or written after the promotion (all delivered), %d committed on the old primary only; %d duplicates",
		len(written), len(want), len(written)-len(want), dups)
	if !synced {
		return
	}
	// The promoted server's slot stays synced for good: only the first
	// start after the promotion may take it as ahead of a lagging row. A
	// slot advanced behind the connector's back later is refused as ever.
	if _, err := conn.Exec(context.Background(), "SELECT pg_logical_emit_message(true, 'other', 'x')"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), "SELECT pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())"); err != nil {
		t.Fatal(err)
	}
	off := cfg
	off.OnSlotLoss = "fail"
	refused := startRelay(t, off)
	select {
	case err := <-refused.done:
		refused.cancel = nil
		if err == nil || !strings.Contains(err.Error(), "moved behind the connector's back") {
			t.Fatalf("a synced slot advanced after the failover: the connector ended with %v; want the refusal", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a synced slot advanced after the failover was not refused within 60s")
	}
}

// waitSynced waits until the standby holds a synchronized copy of the
// connector's slot that a promotion keeps (synced, not temporary).
func waitSynced(t *testing.T, standby *testenv.Postgres) {
	t.Helper()
	conn := standby.Conn(t, "outbox")
	deadline := time.Now().Add(60 * time.Second)
	for {
		var ready bool
		err := conn.QueryRow(context.Background(), "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'outbox_slot'").Scan(&ready)
		if err == nil && ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby has no synchronized copy of the slot after 60s (ready %v, %v); its log:\n%s", ready, err, standby.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldBy returns the events of evs whose rows the outbox table on conn
// holds, in their order.
func heldBy(t *testing.T, conn *pgx.Conn, evs []testenv.Event) []testenv.Event {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT id::text FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	held := make(map[string]bool, len(ids))
	for _, id := range ids {
		held[id] = true
	}
	var out []testenv.Event
	for _, e := range evs {
		if held[e.ID] {
			out = append(out, e)
		}
	}
	return out
}
