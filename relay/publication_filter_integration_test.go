package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestRowFilteredPublicationRefused: an operator adds a row filter to the
// publication while the connector is stopped. PostgreSQL would never send the
// filtered inserts and the keepalives would confirm past them; instead the
// connector refuses to start, with a fatal error naming the ALTER that fixes
// it, and the slot's confirmed position does not move past the events
// written meanwhile. Once the publication is fixed the connector starts
// again and every event the filter let through, and every event written
// after the fix, arrives in per-aggregate order. The filtered events written
// while the filter was in place do not come from the slot (PostgreSQL
// decodes each transaction with the publication as it was then, as the
// error says): they are still in the outbox table.
func TestRowFilteredPublicationRefused(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	kept, billing := uniqueType("kept"), uniqueType("billing")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+kept, "outbox.event."+billing)
	keptW, billingW, windowW := testenv.NewWriter(), testenv.NewWriter(), testenv.NewWriter()

	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	keptW.Write(t, ctx, conn, kept, 20, 3, 5)
	billingW.Write(t, ctx, conn, billing, 20, 3, 5)
	c.WaitFor(t, append(keptW.Snapshot(), billingW.Snapshot()...), 20*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}

	if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET TABLE public.outbox WHERE (aggregatetype <> '"+billing+"')"); err != nil {
		t.Fatal(err)
	}
	var mark string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&mark); err != nil {
		t.Fatal(err)
	}
	keptW.Write(t, ctx, conn, kept, 30, 3, 5)
	windowW.Write(t, ctx, conn, billing, 30, 3, 5)

	run = startRelay(t, cfg)
	err := run.waitExit(t, 20*time.Second, "a row-filtered publication must stop it")
	const fix = "ALTER PUBLICATION outbox_pub SET TABLE public.outbox;"
	var fe *fatal.Error
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "row filter") || !strings.Contains(err.Error(), fix) {
		t.Fatalf("start with a row-filtered publication: %v; want a fatal error naming the filter and %q", err, fix)
	}
	t.Logf("refused with: %v", err)
	var confirmed string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'outbox_slot'").Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if c, m := mustLSN(t, confirmed), mustLSN(t, mark); c > m {
		t.Fatalf("slot confirmed %s after the refusal, past %s where the events written under the filter begin", confirmed, mark)
	}

	if _, err := conn.Exec(ctx, "ALTER PUBLICATION outbox_pub SET TABLE public.outbox"); err != nil {
		t.Fatal(err)
	}
	run = startRelay(t, cfg)
	run.waitStreaming(t)
	keptW.Write(t, ctx, conn, kept, 20, 3, 5)
	billingW.Write(t, ctx, conn, billing, 20, 3, 5)
	want := append(keptW.Snapshot(), billingW.Snapshot()...)
	c.WaitFor(t, want, 20*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, want); dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	// The filtered window: not in Kafka, still in the table.
	window := windowW.Snapshot()
	for _, r := range c.Records() {
		for _, e := range window {
			if testenv.Header(r, "id") == e.ID {
				t.Fatalf("event %s, written under the filter, arrived: the error's advice that they stay filtered is wrong", e.ID)
			}
		}
	}
	var inTable int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE aggregatetype = $1", billing).Scan(&inTable); err != nil || inTable != 40+len(window) {
		t.Fatalf("%d billing rows in the outbox (%v), want %d", inTable, err, 40+len(window))
	}
}

func mustLSN(t testing.TB, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
