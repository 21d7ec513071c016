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
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

func main() { cli.Main("maintain", envRule(), run) }

// settings are maintain's flags and environment variables.
type settings struct {
	dsn, mode, table    string
	retention, interval time.Duration
	lockTimeout         time.Duration
	moveTimeout         time.Duration
	ahead, batch        int
}

func (s *settings) bind(fs *flag.FlagSet, getenv func(string) string) *config.Binder {
	b := config.NewBinder(fs, getenv)
	b.Secret(&s.dsn, "pg-dsn", "MAINTAIN_PG_DSN", "PostgreSQL connection string (falls back to OUTBOX_PG_DSN)")
	b.String(&s.mode, "mode", "MAINTAIN_MODE", "partitions", "partitions (drop expired daily partitions) or delete (batched DELETE)")
	b.String(&s.table, "table", "OUTBOX_TABLE", "public.outbox", "outbox table, schema-qualified")
	b.Duration(&s.retention, "retention", "MAINTAIN_RETENTION", 72*time.Hour, "keep events this long")
	b.Duration(&s.interval, "interval", "MAINTAIN_INTERVAL", 0, "run every interval until stopped (0: once)")
	b.Int(&s.ahead, "ahead", "MAINTAIN_AHEAD", 2, "days of partitions to create after today")
	b.Int(&s.batch, "batch", "MAINTAIN_BATCH", 1000, "rows per DELETE in delete mode")
	b.Duration(&s.lockTimeout, "lock-timeout", "MAINTAIN_LOCK_TIMEOUT", 5*time.Second, "longest wait for each lock in partitions mode")
	b.Duration(&s.moveTimeout, "move-timeout", "MAINTAIN_MOVE_TIMEOUT", 30*time.Second,
		"longest run (and lock hold) of each partition creation, with its move of DEFAULT rows, or drop")
	return b
}

// envRule: maintain refuses MAINTAIN_* variables it does not read. The
// OUTBOX_* it reads (OUTBOX_PG_DSN, OUTBOX_TABLE) are the connector's, which
// checks that namespace: maintain often runs with the connector's
// environment.
func envRule() config.EnvRule {
	var s settings
	known := s.bind(flag.NewFlagSet("maintain", flag.ContinueOnError), func(string) string { return "" }).EnvVars()
	return config.EnvRule{Prefixes: []string{"MAINTAIN_"}, Known: known}
}

func run(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("maintain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s settings
	b := s.bind(fs, getenv)
	if err := b.Err(); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.dsn == "" {
		s.dsn = getenv("OUTBOX_PG_DSN")
	}
	if s.dsn == "" {
		return errors.New("MAINTAIN_PG_DSN: missing; set it to postgres://user@host:5432/db")
	}
	if s.mode != "partitions" && s.mode != "delete" {
		return fmt.Errorf("MAINTAIN_MODE: %q; want partitions or delete", s.mode)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "maintain", "table", s.table)
	pool, err := pgxpool.New(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	once := func() error {
		if s.mode == "delete" {
			n, err := outbox.Cleaner{Table: s.table, Retention: s.retention, BatchSize: s.batch}.DeleteExpired(ctx, pool)
			log.Info("deleted expired outbox rows", "rows", n)
			return err
		}
		res, err := partition.Maintain(ctx, pool, partition.Config{Table: s.table, Retention: s.retention, Ahead: s.ahead,
			LockTimeout: s.lockTimeout, MoveTimeout: s.moveTimeout})
		log.Info("partitions maintained", "created", res.Created, "dropped", res.Dropped,
			"moved_from_default", res.Moved, "deleted_from_default", res.DefaultDeleted)
		return err
	}
	if s.interval <= 0 {
		return once()
	}
	for {
		if err := once(); err != nil && ctx.Err() == nil {
			log.Error("maintenance failed; retrying at the next interval", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.interval):
		}
	}
}
