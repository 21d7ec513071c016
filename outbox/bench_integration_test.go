package outbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// BenchmarkWrite measures a business transaction (one INSERT, COMMIT) with
// and without its outbox event, per mode, on a cluster with fsync on and a
// logical slot on the outbox publication (as in production). The overhead
// of outbox.Write is the difference from plain-insert.
func BenchmarkWrite(b *testing.B) {
	// OUTBOX_BENCH_FSYNC=off isolates the CPU and round-trip cost from the
	// disk's flush latency.
	pg := testenv.StartPostgres(b, testenv.PGOptions{Fsync: os.Getenv("OUTBOX_BENCH_FSYNC") != "off"})
	ctx := context.Background()
	conn := pg.Conn(b, "outbox")
	for _, q := range []string{`CREATE TABLE bench_orders (id bigserial PRIMARY KEY, customer text, total_cents bigint)`,
		`SELECT pg_create_logical_replication_slot('bench_slot', 'pgoutput')`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	payload := map[string]any{"order_id": "o-1", "customer": "ada", "total_cents": 1299, "lines": []string{"sku-1", "sku-2"}}
	cases := []struct {
		name   string
		mode   outbox.Mode
		events int // 0: no outbox write
	}{
		{"plain-insert", outbox.ModeTable, 0},
		{"table", outbox.ModeTable, 1},
		{"delete-after-insert", outbox.ModeDeleteAfterInsert, 1},
		{"message", outbox.ModeMessage, 1},
		{"table-batch10", outbox.ModeTable, 10},
		{"message-batch10", outbox.ModeMessage, 10},
	}
	for _, c := range cases {
		w, _ := outbox.New(outbox.Config{Mode: c.mode})
		evs := make([]outbox.Event, c.events)
		for i := range evs {
			evs[i] = outbox.Event{AggregateType: "Order", AggregateID: fmt.Sprint("o-", i), Type: "OrderPlaced", Payload: payload}
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO bench_orders (customer, total_cents) VALUES ($1, $2)`, "ada", 1299); err != nil {
						return err
					}
					if len(evs) == 0 {
						return nil
					}
					_, err := w.Write(ctx, tx, evs...)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
