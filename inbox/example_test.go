package inbox_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// A consumer of OrderPlaced events that charges each order once, however
// often its event is delivered. (Compiled, not run: it needs Kafka; see
// examples/fulfillment for the whole service and its tests.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := inbox.EnsureSchema(ctx, pool, "public.inbox"); err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		// Everything through tx: it commits with the "processed" mark.
		_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, payload) VALUES ($1, $2)`, string(rec.Key), rec.Value)
		return err
	}
	c, err := inbox.New(pool, charge, inbox.Config{
		Brokers:  []string{"127.0.0.1:9092"},
		Group:    "billing",
		Topics:   []string{"outbox.event.Order"},
		DLQTopic: "billing.dlq",
		// Retention: inbox.DefaultRetention (20 days) exceeds the duplicate
		// window on the defaults; a deployment with other figures states
		// them, and New refuses a Retention inside them.
		Window: &inbox.Window{OutboxRows: 96 * time.Hour, TopicRetention: 7 * 24 * time.Hour,
			TopicSegment: 24 * time.Hour, Lag: 24 * time.Hour}, // topics created with segment.ms of a day
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
}
