package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestDetachedPartitionInsertStopsStream: inserts that PostgreSQL names by
// a partition of the outbox (written while the publication had
// publish_via_partition_root off) whose partition is detached, or dropped,
// before the connector reads them: the catalog no longer says the relation
// is a partition of the outbox, but it has exactly the outbox's columns, so
// the stream stops with a fatal error naming it instead of counting its
// inserts as another table's and confirming them unpublished. Nothing of
// them reaches Kafka and nothing of them is confirmed: the slot, decoded
// from its confirmed position, still holds every one.
func TestDetachedPartitionInsertStopsStream(t *testing.T) {
	for _, how := range []string{"detached", "dropped"} {
		t.Run(how, func(t *testing.T) {
			pg := partitionedOutbox(t)
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("detach")
			cfg := testConfig(t, pg.DSN("outbox"), brokers)

			// The slot exists and the connector is past its snapshot.
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			before := newPartWriter()
			before.write(t, ctx, conn, aggType, 20, 4, 5, func(i int) int { return i % 3 })
			c.WaitFor(t, before.Events, 20*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}

			// While the connector is down: events written with the
			// publication naming partitions, into tomorrow's partition,
			// which is then detached or dropped; the publication is
			// fixed again, so that the start check passes.
			var part string
			if err := conn.QueryRow(ctx, `SELECT 'outbox_p' || to_char((now() AT TIME ZONE 'UTC')::date + 1, 'YYYYMMDD')`).Scan(&part); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = false)"); err != nil {
				t.Fatal(err)
			}
			after := newPartWriter()
			after.write(t, ctx, conn, aggType+"x", 15, 3, 5, func(int) int { return partTomorrow })
			change := "ALTER TABLE public.outbox DETACH PARTITION public." + part
			if how == "dropped" {
				change = "DROP TABLE public." + part
			}
			if _, err := conn.Exec(ctx, change); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = true)"); err != nil {
				t.Fatal(err)
			}

			c2 := testenv.StartConsumer(t, brokers, "outbox.event."+aggType+"x")
			run = startRelay(t, cfg)
			err := run.waitExit(t, 20*time.Second, "inserts named by a "+how+" partition of the outbox must stop it")
			var fe *fatal.Error
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "public."+part) {
				t.Fatalf("stream of a %s partition's inserts: %v; want a fatal error naming public.%s", how, err, part)
			}
			t.Logf("stopped with: %v", err)

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
				t.Fatalf("the slot holds %d inserts after the stop; want at least the %d written into the %s partition: the rest were confirmed unpublished", inserts, len(after.Events), how)
			}
			time.Sleep(500 * time.Millisecond)
			if n := c2.Count(); n != 0 {
				t.Fatalf("%d records of the %s partition's inserts in Kafka; want none", n, how)
			}
		})
	}
}
