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
	// A transaction after the variant's: the WAL relay's recovery point
	// passes it within a state write or two.
	var after int64
	if err := conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&after); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var point int64
		if err := conn.QueryRow(ctx, "SELECT coalesce(recover_xmin, 0) FROM outbox_connector_state WHERE slot_name = $1", walCfg.Slot).Scan(&point); err != nil {
			t.Fatal(err)
		}
		if point > after {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the WAL relay's recovery point stayed at %d, below %d, for 30s", point, after)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var out bytes.Buffer
	marked, left, err := MarkDelivered(ctx, walCfg, "id", &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switch-to-poll: %s", strings.TrimSpace(out.String()))
	if marked == 0 {
		t.Fatalf("switch-to-poll marked no row; want those the WAL relay delivered")
	}
	var atMark int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&atMark); err != nil {
		t.Fatal(err)
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
	bound := left + (atStop - atMark)
	t.Logf("%d events, %d marked delivered, %d left to poll mode, %d written while both relays ran; %d duplicates (bound %d)", len(events), marked, left, atStop-atMark, dups, bound)
	if int64(dups) > bound {
		t.Fatalf("%d duplicates; want at most the %d rows left unmarked plus the %d written while both relays ran", dups, left, atStop-atMark)
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
	aggType, earlier := uniqueType("handover"), uniqueType("earlier")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType, "outbox.event."+earlier)
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

	// The procedure: poll mode runs, the WAL relay starts beside it.
	load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 20, 2*time.Millisecond)
	pollRun := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	pollRun.waitPolling(t)
	wal := startRelay(t, walCfg)
	wal.waitStreaming(t)
	var started time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&started); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var before int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NULL AND created_at < $1", started).Scan(&before); err != nil {
			t.Fatal(err)
		}
		if before == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows written before the WAL relay started still unpublished after 60s", before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := pollRun.stop(t); err != nil {
		t.Fatalf("poll relay stopped with %v", err)
	}
	time.Sleep(time.Second)
	events := append(w.Snapshot(), load.Halt()...)
	c.WaitFor(t, events, 60*time.Second)
	dups := c.Verify(t, events)
	t.Logf("%d events delivered across the handover, %d duplicates", len(events), dups)
	if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll_undo.sql"); err != nil {
		t.Fatalf("the undo variant: %v", err)
	}
	if _, err := conn.Exec(ctx, "DELETE FROM outbox WHERE created_at < now()"); err != nil {
		t.Fatalf("after the undo, rows can be deleted again: %v", err)
	}
}
