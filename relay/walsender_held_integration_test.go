package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// heldLook is how late a hold is seen: the walsender watch looks every
// second, and the stall is decided at every /healthz.
const heldLook = 2 * time.Second

// heldByGauge reads outbox_connector_walsender_held_by{for, by} (-1: no such
// series).
func heldByGauge(t testing.TB, run *running, what, by string) float64 {
	t.Helper()
	mfs, err := run.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "outbox_connector_walsender_held_by" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["for"] == what && labels["by"] == by {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// waitStalledSaying waits until the relay is stalled with a reason holding
// every one of want, or fails after within; it returns when.
func waitStalledSaying(t *testing.T, run *running, within time.Duration, want ...string) (time.Duration, string) {
	t.Helper()
	start := time.Now()
	for {
		stalled, why := run.relay.Stalled()
		ok := stalled
		for _, w := range want {
			ok = ok && strings.Contains(why, w)
		}
		if ok {
			return time.Since(start), why
		}
		select {
		case err := <-run.done:
			run.cancel = nil
			t.Fatalf("the connector ended: %v", err)
		default:
		}
		if time.Since(start) > within {
			t.Fatalf("not stalled saying %q within %v: Stalled() = %v, %q; last error %q", want, within, stalled, why, run.relay.LastError())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitNotStalled(t *testing.T, run *running, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		stalled, why := run.relay.Stalled()
		if !stalled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still stalled %v after the cause ended: %s", within, why)
		}
	}
}

// TestWalsenderHeldStallReason: the relay's side of the walsender watch
// (watchWalsender) over a replication connection of its own whose
// CREATE_REPLICATION_SLOT a prepared transaction holds: the stall's reason
// names the gid once the hold outlasts the stall timeout, and the
// outbox_connector_walsender_held_* series say it before; once the
// transaction is committed and the slot created, both end.
func TestWalsenderHeldStallReason(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_prepared_transactions": "5"}})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	gid := "forgotten-" + uniqueType("reason")
	for _, q := range []string{"BEGIN", "CREATE TABLE held_reason (x int)", "PREPARE TRANSACTION '" + gid + "'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(t, pg.DSN("outbox"), "127.0.0.1:1")
	cfg.StallTimeout = 3 * time.Second
	run := &running{relay: New(cfg, nil, slog.New(slog.NewTextHandler(testWriter{t}, nil)), metrics.New())}
	run.m = run.relay.metrics
	pool, err := pgxpool.New(ctx, cfg.PGDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rconn, err := pgconn.Connect(ctx, cfg.PGDSN+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(ctx)
	stop := run.relay.watchWalsender(ctx, pool, rconn.PID())
	defer stop()
	created := make(chan error, 1)
	go func() {
		_, _, err := wal.CreateSlot(ctx, rconn, cfg.Slot, false, false)
		created <- err
	}()
	for deadline := time.Now().Add(cfg.StallTimeout); heldByGauge(t, run, "transactions", "prepared:"+gid) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("outbox_connector_walsender_held_by{for=\"transactions\",by=\"prepared:%s\"} not 1 within the stall timeout", gid)
		}
	}
	if stalled, why := run.relay.Stalled(); stalled {
		t.Fatalf("stalled before the stall timeout: %s", why)
	}
	took, why := waitStalledSaying(t, run, cfg.StallTimeout+heldLook, `prepared transaction "`+gid+`"`, "OUTBOX_STALL_TIMEOUT")
	t.Logf("stalled after %v more: %s", took.Round(time.Millisecond), why)
	if _, err := conn.Exec(ctx, "COMMIT PREPARED '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	waitNotStalled(t, run, 5*time.Second)
	if v := heldByGauge(t, run, "transactions", "prepared:"+gid); v != -1 {
		t.Errorf("outbox_connector_walsender_held_by for the committed transaction = %v; want no series", v)
	}
}

// TestSlotCreationHeldSaid: a prepared transaction left open (forgotten)
// while the connector starts for the first time. CREATE_REPLICATION_SLOT
// waits for it, and before, nothing said so: the stall, a minute later,
// said only that no session got past setup. Now within the stall timeout
// and a look the stall's reason (/healthz) names the gid, and
// outbox_connector_walsender_held_by{by="prepared:<gid>"} is 1 before the
// timeout; after COMMIT PREPARED the slot is created, the connector
// streams and delivers, and the stall ends.
func TestSlotCreationHeldSaid(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_prepared_transactions": "5"}})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("held")
	gid := "forgotten-" + aggType
	for _, q := range []string{"BEGIN", "CREATE TABLE held_by_prepared (x int)", "PREPARE TRANSACTION '" + gid + "'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.OffsetsTopic = "offsets." + aggType
	cfg.StallTimeout = 4 * time.Second
	run := startRelay(t, cfg)
	for deadline := time.Now().Add(cfg.StallTimeout); heldByGauge(t, run, "transactions", "prepared:"+gid) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("outbox_connector_walsender_held_by{for=\"transactions\",by=\"prepared:%s\"} not 1 within the stall timeout (%v)", gid, cfg.StallTimeout)
		}
	}
	took, why := waitStalledSaying(t, run, cfg.StallTimeout+heldLook, "creating replication slot", `prepared transaction "`+gid+`"`, "COMMIT PREPARED")
	t.Logf("stalled %v after the start: %s", took.Round(time.Millisecond), why)
	if run.relay.Streaming() {
		t.Fatal("streaming while the prepared transaction is open: the test shows nothing")
	}
	if _, err := conn.Exec(ctx, "COMMIT PREPARED '"+gid+"'"); err != nil {
		t.Fatal(err)
	}
	run.waitStreaming(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 20, 5, 5)
	c.WaitFor(t, w.Snapshot(), time.Minute)
	waitNotStalled(t, run, 5*time.Second)
	if v := heldByGauge(t, run, "transactions", "prepared:"+gid); v != -1 {
		t.Errorf("outbox_connector_walsender_held_by for the committed transaction = %v; want no series", v)
	}
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	c.Verify(t, w.Snapshot())
}

// TestStandbyHeldSaid: PostgreSQL 17, the connector's slot a failover slot
// (OUTBOX_SLOT_FAILOVER=true) and synchronized_standby_slots naming a
// physical slot no standby streams from (that alone makes the walsender
// wait). Every change is held back in PostgreSQL: nothing is in flight, so
// before, no stall was ever said. Now within the stall timeout and a look
// after the first write the stall's reason names the standby's slot, and
// outbox_connector_walsender_held_by{by="slot:<name>"} is 1; with the
// setting emptied the events are delivered and the stall ends.
func TestStandbyHeldSaid(t *testing.T) {
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{BinDir: bin})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range []string{"SELECT pg_create_physical_replication_slot('standby_gone', true)",
		"ALTER SYSTEM SET synchronized_standby_slots = 'standby_gone'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	aggType := uniqueType("standbyheld")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.OffsetsTopic = "offsets." + aggType
	cfg.SlotFailover = true
	cfg.StallTimeout = 4 * time.Second
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 20, 5, 5)
	took, why := waitStalledSaying(t, run, cfg.StallTimeout+heldLook, "synchronized_standby_slots", `"standby_gone" (no standby streams from it`)
	t.Logf("stalled %v after the write: %s", took.Round(time.Millisecond), why)
	if v := heldByGauge(t, run, "standby", "slot:standby_gone"); v != 1 {
		t.Errorf(`outbox_connector_walsender_held_by{for="standby",by="slot:standby_gone"} = %v; want 1`, v)
	}
	if n := c.Count(); n != 0 {
		t.Fatalf("%d records delivered while the standby holds the changes back: the test shows nothing", n)
	}
	for _, q := range []string{"ALTER SYSTEM RESET synchronized_standby_slots", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitFor(t, w.Snapshot(), time.Minute)
	waitNotStalled(t, run, 5*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	c.Verify(t, w.Snapshot())
}
