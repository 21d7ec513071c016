package relay

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestKafkaOutage: the broker stopped for 30 s, and frozen with SIGSTOP for
// 400 ms, while events are written: nothing is lost, nothing is delivered
// twice (exactly-once).
func TestKafkaOutage(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	k := testenv.StartKafka(t)
	aggType := uniqueType("kout")
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), k.Brokers))
	run.waitStreaming(t)
	lw := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 100, 2*time.Millisecond)

	time.Sleep(time.Second)
	if err := k.Freeze(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if err := k.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	k.Stop()
	t.Log("broker stopped")
	time.Sleep(30 * time.Second)
	if err := k.Restart(); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	t.Log("broker restarted")
	time.Sleep(2 * time.Second)
	want := lw.Halt()
	c := testenv.StartConsumer(t, k.Brokers, "outbox.event."+aggType)
	c.WaitFor(t, want, 3*time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events written across a 400 ms freeze and a 30 s broker outage; all delivered in order; %d duplicates", len(want), dups)
	if dups != 0 {
		t.Errorf("%d duplicates across a broker outage in exactly-once mode; want 0", dups)
	}
}

// TestPostgresImmediateRestart: PostgreSQL stopped in immediate mode and
// restarted under load: nothing is lost, and nothing is delivered twice,
// though the slot restarts from its last checkpointed position, behind
// what Kafka holds (the exactly-once position decides what is new).
func TestPostgresImmediateRestart(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	aggType := uniqueType("pgout")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	lw := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 100, time.Millisecond)
	for i := 0; i < 2; i++ {
		time.Sleep(2 * time.Second)
		if err := pg.Stop("immediate"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := pg.Start(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second)
	want := lw.Halt()
	c.WaitFor(t, want, 2*time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events across two immediate PostgreSQL restarts (%d writer errors); all delivered in order; %d duplicates; reconnects: %s",
		len(want), lw.Errors(), dups, metricValue(t, run, "outbox_connector_reconnects_total"))
	t.Logf("events skipped as already in Kafka: %s", metricValue(t, run, "outbox_connector_exactly_once_skipped_events_total"))
	if dups != 0 {
		t.Errorf("%d duplicates across PostgreSQL crashes in exactly-once mode; want 0", dups)
	}
}

// TestQuietOutboxBusyDatabase: with no outbox events, 64 MiB of WAL written
// to other tables; the slot's lag (current WAL minus confirmed flush) falls
// under 1 MiB within 30 s, and its retained WAL (current WAL minus restart
// LSN) under 16 MiB within 2 minutes. Afterwards an idle database stays idle:
// the connector writes no more WAL of its own.
func TestQuietOutboxBusyDatabase(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	if _, err := conn.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)"); err != nil {
		t.Fatal(err)
	}
	var startLSN string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&startLSN); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := conn.Exec(ctx, "INSERT INTO busy (pad) SELECT repeat(md5(i::text), 30) FROM generate_series(1, 5000) AS i"); err != nil {
			t.Fatal(err)
		}
		var written int64
		if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", startLSN).Scan(&written); err != nil {
			t.Fatal(err)
		}
		if written >= 64<<20 {
			t.Logf("wrote %.1f MiB of WAL to another table", float64(written)/(1<<20))
			break
		}
	}
	doneAt := time.Now()
	lag := func() (lag, retained int64) {
		t.Helper()
		err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
			pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = 'outbox_slot'`).Scan(&lag, &retained)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	for {
		l, _ := lag()
		if l < 1<<20 {
			t.Logf("slot lag %d bytes after %s", l, time.Since(doneAt).Round(time.Millisecond))
			break
		}
		if time.Since(doneAt) > 30*time.Second {
			t.Fatalf("slot lag still %d bytes 30 s after the writes", l)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for {
		_, r := lag()
		if r < 16<<20 {
			t.Logf("retained WAL %.1f MiB after %s", float64(r)/(1<<20), time.Since(doneAt).Round(time.Second))
			break
		}
		if time.Since(doneAt) > 2*time.Minute {
			t.Fatalf("retained WAL still %.1f MiB 2 minutes after the writes", float64(r)/(1<<20))
		}
		// No CHECKPOINT here: the restart point must follow from what the
		// server logs by itself (a running-xacts record every 15 s after
		// activity) and what the connector confirms.
		time.Sleep(time.Second)
	}
	// Idle database: once caught up, the connector writes nothing more.
	time.Sleep(3 * time.Second)
	var before, after string
	if err := conn.QueryRow(ctx, "SELECT updated_at::text FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&before); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if err := conn.QueryRow(ctx, "SELECT updated_at::text FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("the connector kept writing its state on an idle database (updated_at %s -> %s)", before, after)
	}
}

// TestSlotAdvancedRefusesStart: a slot advanced with
// pg_replication_slot_advance while the connector was stopped makes it
// refuse to start, with a message that says what happened; with
// OUTBOX_ACCEPT_SLOT_RESET it continues.
func TestSlotAdvancedRefusesStart(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("adv")
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 100, 10, 10)
	time.Sleep(time.Second)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 50, 10, 10)
	if _, err := conn.Exec(ctx, "SELECT pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())"); err != nil {
		t.Fatal(err)
	}
	run = startRelay(t, cfg)
	var err error
	select {
	case err = <-run.done:
		run.cancel = nil
	case <-time.After(30 * time.Second):
		t.Fatal("connector did not refuse a slot advanced behind its back")
	}
	var fe *fatal.Error
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "moved behind the connector's back") || !strings.Contains(err.Error(), "OUTBOX_ACCEPT_SLOT_RESET") {
		t.Fatalf("start after slot advance: %v; want a fatal error naming the move and OUTBOX_ACCEPT_SLOT_RESET", err)
	}
	t.Logf("refused with: %v", err)
	cfg.AcceptSlotReset = true
	run = startRelay(t, cfg)
	run.waitStreaming(t)
	if err := run.stop(t); err != nil {
		t.Fatalf("with OUTBOX_ACCEPT_SLOT_RESET=true: %v", err)
	}
}

// TestSavepointRollback: a savepoint rolled back inside a transaction drops
// only that savepoint's rows; the rest of the transaction is delivered. The
// transaction is larger than logical_decoding_work_mem, so PostgreSQL
// spills it to disk while decoding.
func TestSavepointRollback(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"logical_decoding_work_mem": "'64kB'"}})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("sp")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	insert := func(tx pgx.Tx, tag string, n int) {
		t.Helper()
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), $1, $2, 'T', jsonb_build_object('i', i, 'pad', repeat('y', 200)) FROM generate_series(1, $3) AS i`, aggType, tag, n); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(tx, "kept-before", 1000)
	if _, err := tx.Exec(ctx, "SAVEPOINT s1"); err != nil {
		t.Fatal(err)
	}
	insert(tx, "rolled-back", 1000)
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT s2"); err != nil {
		t.Fatal(err)
	}
	insert(tx, "kept-savepoint", 500)
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT s2"); err != nil {
		t.Fatal(err)
	}
	insert(tx, "kept-after", 1000)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for c.Count() < 2500 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range c.Records() {
		counts[string(r.Key)]++
	}
	want := map[string]int{"kept-before": 1000, "kept-savepoint": 500, "kept-after": 1000}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("aggregate %s: %d records, want %d", k, counts[k], n)
		}
	}
	if counts["rolled-back"] != 0 {
		t.Errorf("%d records of the rolled-back savepoint were published", counts["rolled-back"])
	}
	var spilled int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(sum(spill_txns), 0) FROM pg_stat_replication_slots").Scan(&spilled); err != nil {
		t.Fatal(err)
	}
	t.Logf("records per aggregate: %v; transactions spilled to disk by the decoder: %d", counts, spilled)
	if spilled == 0 {
		t.Errorf("the transaction did not exceed logical_decoding_work_mem (no spill)")
	}
}

func metricValue(t testing.TB, run *running, name string) string {
	t.Helper()
	mfs, err := run.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			parts = append(parts, strings.Join(labels, ",")+":"+strconv.FormatFloat(v, 'f', -1, 64))
		}
	}
	return strings.Join(parts, " ")
}
