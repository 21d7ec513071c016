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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/maintain/config"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

func main() { cli.Main("maintain", config.EnvRule(), run) }

func run(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("maintain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s config.Settings
	b := s.Bind(fs, getenv)
	if err := b.Err(); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.DSN == "" {
		s.DSN = getenv("OUTBOX_PG_DSN")
	}
	if s.DSN == "" {
		return errors.New("MAINTAIN_PG_DSN: missing; set it to postgres://user@host:5432/db")
	}
	if s.Mode != "partitions" && s.Mode != "delete" {
		return fmt.Errorf("MAINTAIN_MODE: %q; want partitions or delete", s.Mode)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "maintain", "table", s.Table)
	pool, err := pgxpool.New(ctx, s.DSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	once := func() error {
		if s.Mode == "delete" {
			n, err := outbox.Cleaner{Table: s.Table, Retention: s.Retention, BatchSize: s.Batch}.DeleteExpired(ctx, pool)
			log.Info("deleted expired outbox rows", "rows", n)
			return err
		}
		res, err := partition.Maintain(ctx, pool, partition.Config{Table: s.Table, Retention: s.Retention, Ahead: s.Ahead,
			LockTimeout: s.LockTimeout, MoveTimeout: s.MoveTimeout})
		log.Info("partitions maintained", "created", res.Created, "dropped", res.Dropped,
			"moved_from_default", res.Moved, "deleted_from_default", res.DefaultDeleted)
		return err
	}
	if s.Interval <= 0 {
		return once()
	}
	for {
		if err := once(); err != nil && ctx.Err() == nil {
			log.Error("maintenance failed; retrying at the next interval", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.Interval):
		}
	}
}
