package relay

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// Tests of a partitioned outbox (sql/variants/outbox_partitioned.sql): the
// connector must see every partition's inserts as the outbox's, and where the
// publication would make PostgreSQL name a partition instead, stop before it
// confirms anything (issue 13, defect 2).

// partitionedOutbox starts a cluster with the partitioned variant in place
// of sql/001 and sql/002 (it creates the publication outbox_pub with
// publish_via_partition_root), and the rest of sql/ as usual.
func partitionedOutbox(t *testing.T) *testenv.Postgres {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	if err := pg.Psql("outbox", "-f", filepath.Join(testenv.RepoRoot(), "sql", "variants", "outbox_partitioned.sql")); err != nil {
		t.Fatal(err)
	}
	files, err := testenv.SchemaFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base := filepath.Base(f); strings.HasPrefix(base, "001_") || strings.HasPrefix(base, "002_") {
			continue
		}
		if err := pg.Psql("outbox", "-f", f); err != nil {
			t.Fatal(err)
		}
	}
	return pg
}

// The partitions the tests write into: the variant creates today's and
// tomorrow's (UTC days); a row a month ahead lands in outbox_default.
const (
	partToday = iota
	partTomorrow
	partDefault
)

// partWriter writes outbox events with an explicit created_at, so that
// the rows land in the partition a test chooses, and remembers them in
// commit order with their per-aggregate sequence (testenv.Consumer.Verify
// checks it). created_at grows with every event written, so that an order
// by created_at (the initial snapshot's) is also the order written.
type partWriter struct {
	seqs   map[string]int
	n      int
	Events []testenv.Event
}

func newPartWriter() *partWriter { return &partWriter{seqs: map[string]int{}} }

// write inserts n events over aggs aggregates in transactions of 1..maxTx
// events; event i of them goes to partition part(i).
func (w *partWriter) write(t testing.TB, ctx context.Context, conn *pgx.Conn, aggType string, n, aggs, maxTx int, part func(i int) int) {
	t.Helper()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	starts := [...]time.Time{partToday: today, partTomorrow: today.Add(24 * time.Hour), partDefault: today.Add(30 * 24 * time.Hour)}
	for written := 0; written < n; {
		size := min(1+(written*7)%maxTx, n-written)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b := &pgx.Batch{}
		var evs []testenv.Event
		for i := written; i < written+size; i++ {
			agg := fmt.Sprintf("agg-%d", i%aggs)
			w.seqs[aggType+"/"+agg]++
			ev := testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Tested", Seq: w.seqs[aggType+"/"+agg]}
			ev.Payload = fmt.Sprintf(`{"agg": "%s", "seq": %d}`, agg, ev.Seq)
			w.n++
			created := starts[part(i)].Add(time.Duration(w.n) * time.Millisecond)
			b.Queue(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
				ev.ID, ev.AggType, ev.AggID, ev.Type, ev.Payload, created)
			evs = append(evs, ev)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("write outbox events: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit outbox events: %v", err)
		}
		w.Events = append(w.Events, evs...)
		written += size
	}
}

// partitionsHolding counts the partitions that hold rows of aggType.
func partitionsHolding(t testing.TB, ctx context.Context, conn *pgx.Conn, aggType string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM outbox WHERE aggregatetype = $1`, aggType).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitExit waits for the relay to end on its own and returns its error.
func (r *running) waitExit(t testing.TB, timeout time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.cancel = nil
		return err
	case <-time.After(timeout):
		t.Fatalf("relay did not stop within %s: %s", timeout, what)
		return nil
	}
}

// TestPartitionedOutboxCreatedPublication: on a partitioned outbox with no
// publication, the connector creates one that publishes every partition's
// inserts as the outbox's; events written into three partitions, one
// aggregate's events spread over all of them, all arrive in per-aggregate
// commit order.
func TestPartitionedOutboxCreatedPublication(t *testing.T) {
	pg := partitionedOutbox(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, "DROP PUBLICATION outbox_pub"); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("part")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	w := newPartWriter()
	w.write(t, ctx, conn, aggType, 300, 7, 20, func(i int) int { return i % 3 })
	if n := partitionsHolding(t, ctx, conn, aggType); n != 3 {
		t.Fatalf("events landed in %d partitions, want 3", n)
	}
	c.WaitFor(t, w.Events, 20*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	var viaRoot bool
	if err := conn.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_pub'").Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("created publication: pubviaroot = %v, %v; want true", viaRoot, err)
	}
}

// TestPartitionedOutboxPublicationWithoutViaRoot: an operator's publication
// of the partitioned outbox without publish_via_partition_root stops the
// connector at start with a fatal error naming the ALTER that fixes it,
// before it creates the slot or publishes anything; the events written
// before and during the stop are all published once the publication is
// fixed, and so are those written after.
func TestPartitionedOutboxPublicationWithoutViaRoot(t *testing.T) {
	pg := partitionedOutbox(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, "DROP PUBLICATION outbox_pub; CREATE PUBLICATION outbox_pub FOR TABLE public.outbox WITH (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("noroot")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	w := newPartWriter()
	w.write(t, ctx, conn, aggType, 60, 5, 10, func(i int) int { return partToday + i*2/60 })

	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	run := startRelay(t, cfg)
	err := run.waitExit(t, 20*time.Second, "a publication without publish_via_partition_root must stop it")
	const fix = "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = true)"
	var fe *fatal.Error
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), fix) {
		t.Fatalf("start with a publication without publish_via_partition_root: %v; want a fatal error naming %q", err, fix)
	}
	t.Logf("refused with: %v", err)
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d replication slots after the refusal (%v); want none: nothing may be read or confirmed", slots, err)
	}
	if n := c.Count(); n != 0 {
		t.Fatalf("%d records in Kafka after the refusal; want none", n)
	}
	// Written while the connector is stopped: the initial snapshot, taken
	// once the publication is fixed, must carry them.
	w.write(t, ctx, conn, aggType, 30, 5, 10, func(int) int { return partDefault })

	if _, err := conn.Exec(ctx, fix); err != nil {
		t.Fatal(err)
	}
	run = startRelay(t, cfg)
	run.waitStreaming(t)
	w.write(t, ctx, conn, aggType, 90, 5, 10, func(i int) int { return i % 3 })
	if n := partitionsHolding(t, ctx, conn, aggType); n != 3 {
		t.Fatalf("events landed in %d partitions, want 3", n)
	}
	c.WaitFor(t, w.Events, 20*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
}

// TestPartitionInsertStopsStream: the publication is altered while the
// connector streams, so that PostgreSQL names the partition in the inserts
// it sends (the start check cannot see it): the stream stops with a fatal
// error naming the partition, publishes none of those inserts and confirms
// none of them: decoding the slot afterwards still yields every one.
func TestPartitionInsertStopsStream(t *testing.T) {
	pg := partitionedOutbox(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("leaf")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	before := newPartWriter()
	before.write(t, ctx, conn, aggType, 40, 5, 10, func(i int) int { return i % 3 })
	c.WaitFor(t, before.Events, 20*time.Second)

	if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = false)"); err != nil {
		t.Fatal(err)
	}
	after := newPartWriter()
	after.write(t, ctx, conn, aggType+"x", 30, 5, 10, func(i int) int { return i % 3 })
	err := run.waitExit(t, 20*time.Second, "inserts named by a partition of the outbox must stop it")
	var fe *fatal.Error
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "partition") || !strings.Contains(err.Error(), "publish_via_partition_root = true") {
		t.Fatalf("stream of a partition's inserts: %v; want a fatal error naming the partition and the fix", err)
	}
	t.Logf("stopped with: %v", err)

	// Nothing of them confirmed: the slot, decoded from its confirmed
	// position (peek consumes nothing), still holds every insert. The
	// walsender may take a moment to let go of the slot.
	const peek = `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('outbox_slot', NULL, NULL,
		'proto_version', '1', 'publication_names', 'outbox_pub') WHERE get_byte(data, 0) = ascii('I')`
	var inserts int
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := conn.QueryRow(ctx, peek).Scan(&inserts)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode the slot: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if inserts < len(after.Events) {
		t.Fatalf("the slot still holds %d inserts after the stop; want at least the %d written after the change: the rest were confirmed unpublished", inserts, len(after.Events))
	}
	c2 := testenv.StartConsumer(t, brokers, "outbox.event."+aggType+"x")
	time.Sleep(time.Second)
	if n := c2.Count(); n != 0 {
		t.Fatalf("%d records of the partition's inserts in Kafka; want none", n)
	}

	// As the error says: PostgreSQL decodes those transactions with the
	// publication as it was when they were written, so fixing it does not
	// change how they arrive; the connector stops at them again, and still
	// confirms nothing of them.
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = true)"); err != nil {
		t.Fatal(err)
	}
	run = startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	err = run.waitExit(t, 20*time.Second, "the transactions written before the fix must stop it again")
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "a partition of the outbox table public.outbox") {
		t.Fatalf("restart after the fix: %v; want the same fatal error", err)
	}
	if n := c2.Count(); n != 0 {
		t.Fatalf("%d records of the partition's inserts in Kafka after the restart; want none", n)
	}
}
