package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestQuotedOutboxTable: an outbox table whose schema and name must be
// quoted in SQL works end to end, the initial snapshot (rows written before
// the first start) and the stream after it, with a publication the
// connector creates itself: reserved words in lower case (valid plain
// names for OUTBOX_TABLE, which broke CREATE PUBLICATION and the
// snapshot's SELECT unquoted), and mixed case (Sales.OutBox is the table
// "Sales"."OutBox", as the outbox package writes it). Every event is
// delivered, first deliveries in order per aggregate.
func TestQuotedOutboxTable(t *testing.T) {
	for _, tc := range []struct{ name, schema, table string }{
		{"reserved", "order", "select"},
		{"mixed-case", "Sales", "OutBox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			qualified := pgx.Identifier{tc.schema, tc.table}.Sanitize()
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s; CREATE TABLE %s (LIKE public.outbox INCLUDING ALL)",
				pgx.Identifier{tc.schema}.Sanitize(), qualified)); err != nil {
				t.Fatal(err)
			}
			aggType := uniqueType("quoted")
			var want []testenv.Event
			seq := map[string]int{}
			write := func(n int) {
				t.Helper()
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
				var evs []testenv.Event
				for i := range n {
					agg := fmt.Sprintf("agg-%d", i%3)
					seq[agg]++
					ev := testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Tested", Seq: seq[agg],
						Payload: fmt.Sprintf(`{"seq": %d}`, seq[agg])}
					if _, err := tx.Exec(ctx, "INSERT INTO "+qualified+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)",
						ev.ID, ev.AggType, ev.AggID, ev.Type, ev.Payload); err != nil {
						t.Fatal(err)
					}
					evs = append(evs, ev)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				want = append(want, evs...)
			}
			for range 4 {
				write(5)
			}
			before := len(want)

			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.Publication = "quoted_pub"
			if err := errors.Join(cfg.Table.Set(tc.schema+"."+tc.table), cfg.Validate()); err != nil {
				t.Fatalf("OUTBOX_TABLE=%s: %v", cfg.Table, err)
			}
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			run := startRelay(t, cfg)
			run.waitStreaming(t)
			for range 4 {
				write(5)
			}
			c.WaitFor(t, want, 60*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			dups := c.Verify(t, want)
			t.Logf("delivered %d events from %s (%d by the initial snapshot), %d duplicates", len(want), qualified, before, dups)
		})
	}
}
