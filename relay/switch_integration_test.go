package relay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestSwitchWALToPoll: the README's procedure from the WAL relay to poll
// mode, under load. The variant is applied while the WAL relay streams
// (every row then reads published_at NULL); switch-to-poll (MarkDelivered)
// marks the rows the WAL relay's recovery point proves delivered; poll mode
// starts; the WAL relay stops. Nothing is lost, first deliveries keep each
// aggregate's order, and the duplicates are only the rows left unmarked and
// those written while both ran: before switch-to-poll, poll mode published
// the whole table again.
func TestSwitchWALToPoll(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("switch")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 20, 2*time.Millisecond)
	walCfg := testConfig(t, pg.DSN("outbox"), brokers)
	wal := startRelay(t, walCfg)
	wal.waitStreaming(t)
	waitCount(t, c, 1000)
	preparePoll(t, pg)
	var out bytes.Buffer
	// As the WAL relay's least-privilege role; it waits for a recovery
	// point newer than the variant's table rewrite.
	asConnector := walCfg
	asConnector.PGDSN = pg.DSNUser("outbox", "outbox_connector")
	marked, left, err := MarkDelivered(ctx, asConnector, "id", &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switch-to-poll: %s", strings.TrimSpace(out.String()))
	if marked == 0 {
		t.Fatalf("switch-to-poll marked no row; want those the WAL relay delivered")
	}
	pollRun := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	pollRun.waitPolling(t)
	time.Sleep(500 * time.Millisecond)
	if err := wal.stop(t); err != nil {
		t.Fatalf("WAL relay stopped with %v", err)
	}
	var atStop int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&atStop); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	events := load.Halt()
	c.WaitFor(t, events, 60*time.Second)
	dups := c.Verify(t, events)
	// A row marked is never published again: the duplicates are at most
	// the rows not marked that the WAL relay also delivered (those left
	// at the mark, and those written while both relays ran).
	bound := atStop - marked
	t.Logf("%d events, %d marked delivered, %d left to poll mode at the mark, %d rows when the WAL relay stopped; %d duplicates (bound %d)", len(events), marked, left, atStop, dups, bound)
	if int64(dups) > bound {
		t.Fatalf("%d duplicates; want at most the %d rows not marked (a marked row was published again)", dups, bound)
	}
}

// TestSwitchPollToWAL: from poll mode to the WAL relay. A slot created
// without a snapshot (OUTBOX_SNAPSHOT=never) streams only what commits
// after it: with rows poll mode has not published and no poll relay
// running, the start is refused (before: those events were never
// published). The README's procedure, the WAL relay started while poll mode
// still runs and poll mode stopped once every row written before it is
// published, loses nothing.
func TestSwitchPollToWAL(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	earlier := uniqueType("handover")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+earlier)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, earlier, 50, 5, 10) // unpublished, no poll relay
	walCfg := testConfig(t, pg.DSN("outbox"), brokers)
	walCfg.Snapshot = "never"
	refused := startRelay(t, walCfg)
	select {
	case err := <-refused.done:
		refused.cancel = nil
		if err == nil || !fatal.Is(err) || !strings.Contains(err.Error(), "OUTBOX_SNAPSHOT=never") {
			t.Fatalf("WAL relay with OUTBOX_SNAPSHOT=never over unpublished poll rows: %v; want a fatal refusal", err)
		}
		t.Logf("refused: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("WAL relay over unpublished poll rows neither refused nor stopped within 60s")
	}
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots after the refusal (%v); want none", slots, err)
	}

	// The procedure: poll mode runs, with a backlog of the same aggregates
	// (a small batch keeps it busy), and the WAL relay starts beside it.
	// It must not stream an aggregate's later events before poll mode has
	// published its earlier ones (before: the stream's events overtook the
	// backlog, first deliveries out of order).
	w.Write(t, ctx, conn, earlier, 3000, 5, 20)
	pcfg := pollConfig(t, pg.DSN("outbox"), brokers)
	pcfg.PollBatch = 20
	pollRun := startRelay(t, pcfg)
	pollRun.waitPolling(t)
	wal := startRelay(t, walCfg)
	// Written while the WAL relay creates its slot and waits: before the
	// slot they are poll mode's, after it the stream's too.
	w.Write(t, ctx, conn, earlier, 500, 5, 5)
	wal.waitStreaming(t)
	w.Write(t, ctx, conn, earlier, 200, 5, 5)
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NULL AND aggregatetype = $1", earlier).Scan(&left); err != nil {
		t.Fatal(err)
	}
	t.Logf("the WAL relay streams; %d rows poll mode has not published yet (written after the slot: the stream's)", left)
	if err := pollRun.stop(t); err != nil {
		t.Fatalf("poll relay stopped with %v", err)
	}
	events := w.Snapshot()
	c.WaitFor(t, events, 60*time.Second)
	dups := c.Verify(t, events)
	t.Logf("%d events delivered across the handover, first deliveries in order, %d duplicates", len(events), dups)
	if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll_undo.sql"); err != nil {
		t.Fatalf("the undo variant: %v", err)
	}
	if _, err := conn.Exec(ctx, "DELETE FROM outbox WHERE created_at < now()"); err != nil {
		t.Fatalf("after the undo, rows can be deleted again: %v", err)
	}
}

// TestSwitchPollToWALRestart: the poll relays restart (a rolling update)
// while the WAL relay waits for them to publish what was written before
// its slot: it waits on (before, it stopped at once), and streams once
// they have; nothing is lost and first deliveries stay in order.
func TestSwitchPollToWALRestart(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	agg := uniqueType("restart")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+agg)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, agg, 3000, 5, 20)
	pcfg := pollConfig(t, pg.DSN("outbox"), brokers)
	pcfg.PollBatch = 10
	pollRun := startRelay(t, pcfg)
	pollRun.waitPolling(t)
	walCfg := testConfig(t, pg.DSN("outbox"), brokers)
	walCfg.Snapshot = "never"
	walCfg.LeaseTTL = 2 * time.Second
	walCfg.StatusInterval = 100 * time.Millisecond
	if err := walCfg.Validate(); err != nil {
		t.Fatal(err)
	}
	wal := startRelay(t, walCfg)
	// The WAL relay waits for the backlog: restart the poll relay then.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", walCfg.Slot).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the WAL relay created no slot within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if wal.relay.Streaming() {
		t.Fatal("the WAL relay streams before poll mode published its backlog")
	}
	if err := pollRun.stop(t); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	select {
	case err := <-wal.done:
		wal.cancel = nil
		t.Fatalf("the WAL relay stopped while the poll relay restarted: %v", err)
	default:
	}
	pollRun = startRelay(t, pcfg)
	w.Write(t, ctx, conn, agg, 200, 5, 5)
	wal.waitStreaming(t)
	if err := pollRun.stop(t); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, agg, 200, 5, 5)
	events := w.Snapshot()
	c.WaitFor(t, events, 60*time.Second)
	t.Logf("%d events, %d duplicates, first deliveries in order", len(events), c.Verify(t, events))

}
