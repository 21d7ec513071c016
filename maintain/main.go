// Command maintain keeps a table-mode outbox small. With the daily
// partitioned outbox (sql/variants/outbox_partitioned.sql) it creates the
// coming days' partitions and drops the expired ones (MAINTAIN_MODE=
// partitions, the default); with the plain table it deletes expired rows in
// small batches (MAINTAIN_MODE=delete). It runs once and exits, or every
// MAINTAIN_INTERVAL until SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "maintain:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("maintain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := config.NewBinder(fs, getenv)
	var dsn, mode, table string
	var retention, interval time.Duration
	var ahead, batch int
	b.Secret(&dsn, "pg-dsn", "MAINTAIN_PG_DSN", "PostgreSQL connection string (falls back to OUTBOX_PG_DSN)")
	b.String(&mode, "mode", "MAINTAIN_MODE", "partitions", "partitions (drop expired daily partitions) or delete (batched DELETE)")
	b.String(&table, "table", "OUTBOX_TABLE", "public.outbox", "outbox table, schema-qualified")
	b.Duration(&retention, "retention", "MAINTAIN_RETENTION", 72*time.Hour, "keep events this long")
	b.Duration(&interval, "interval", "MAINTAIN_INTERVAL", 0, "run every interval until stopped (0: once)")
	b.Int(&ahead, "ahead", "MAINTAIN_AHEAD", 2, "days of partitions to create after today")
	b.Int(&batch, "batch", "MAINTAIN_BATCH", 1000, "rows per DELETE in delete mode")
	if err := b.Err(); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dsn == "" {
		dsn = getenv("OUTBOX_PG_DSN")
	}
	if dsn == "" {
		return errors.New("MAINTAIN_PG_DSN: missing; set it to postgres://user@host:5432/db")
	}
	if mode != "partitions" && mode != "delete" {
		return fmt.Errorf("MAINTAIN_MODE: %q; want partitions or delete", mode)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "maintain", "table", table)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	once := func() error {
		if mode == "delete" {
			n, err := outbox.Cleaner{Table: table, Retention: retention, BatchSize: batch}.DeleteExpired(ctx, pool)
			log.Info("deleted expired outbox rows", "rows", n)
			return err
		}
		res, err := partition.Maintain(ctx, pool, partition.Config{Table: table, Retention: retention, Ahead: ahead})
		log.Info("partitions maintained", "created", res.Created, "dropped", res.Dropped)
		return err
	}
	if interval <= 0 {
		return once()
	}
	for {
		if err := once(); err != nil && ctx.Err() == nil {
			log.Error("maintenance failed; retrying at the next interval", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
