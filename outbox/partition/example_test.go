package partition_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// Run from cron (or the maintain command with MAINTAIN_INTERVAL) on a
// database with sql/variants/outbox_partitioned.sql applied. (Compiled, not
// run: the integration test runs it against the connector.)
func ExampleMaintain() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	res, err := partition.Maintain(ctx, pool, partition.Config{
		Table:     "public.outbox",
		Retention: 3 * 24 * time.Hour, // drop days that ended more than 3 days ago
		Ahead:     2,                  // today, tomorrow and the day after exist
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("created %v, dropped %v", res.Created, res.Dropped)
}
