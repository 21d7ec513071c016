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
// are delivered (initial snapshot), then streamed rows follow.
func TestSnapshotThenStream(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("snap")
	seqs := map[string]int{}
	before := writeEvents(t, ctx, conn, aggType, 300, 10, 20, seqs)

	c := startConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	run.waitStreaming(t)
	after := writeEvents(t, ctx, conn, aggType, 300, 10, 20, seqs)
	all := append(before, after...)
	c.waitFor(t, all, 60*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.verify(t, all)
	t.Logf("delivered %d events (%d before the first start), %d duplicates", len(all), len(before), dups)
	if dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	var done bool
	if err := conn.QueryRow(ctx, "SELECT snapshot_done FROM outbox_connector_state WHERE slot_name = 'outbox_slot'").Scan(&done); err != nil || !done {
		t.Fatalf("snapshot_done = %v, %v; want true", done, err)
	}
}
