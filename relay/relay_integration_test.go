package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

func uniqueType(prefix string) string { return fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()%1e9) }

// TestSnapshotThenStream: rows written before the connector's first start
// are delivered (initial snapshot), then streamed rows follow, in order.
func TestSnapshotThenStream(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("snap")
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 300, 10, 20)
	before := len(w.Events)

	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	w.Write(t, ctx, conn, aggType, 300, 10, 20)
	c.WaitFor(t, w.Events, 60*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, w.Events)
	t.Logf("delivered %d events (%d before the first start), %d duplicates", len(w.Events), before, dups)
	if dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	var done bool
	if err := conn.QueryRow(ctx, "SELECT snapshot_done FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&done); err != nil || !done {
		t.Fatalf("snapshot_done = %v, %v; want true", done, err)
	}
}

// TestDelivers100k: 100,000 events in transactions of 1 to 50 events over
// 1,000 aggregates: every event delivered with exact topic, key, value and
// id header; per aggregate, first deliveries in commit order.
func TestDelivers100k(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("bulk")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	w := testenv.NewWriter()
	start := time.Now()
	w.Write(t, ctx, conn, aggType, 100_000, 1000, 50)
	t.Logf("wrote 100000 events in %s", time.Since(start).Round(time.Millisecond))
	c.WaitFor(t, w.Events, 5*time.Minute)
	t.Logf("all delivered %s after the first write", time.Since(start).Round(time.Millisecond))
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
}
