// Package config is maintain's settings: every one a flag and an
// environment variable (MAINTAIN_*, and the connector's OUTBOX_TABLE), kept
// apart from main so that the deployment files' checks can ask which
// variables maintain reads.
package config

import (
	"flag"
	"time"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
)

// Settings are maintain's flags and environment variables.
type Settings struct {
	// DSN is MAINTAIN_PG_DSN; empty falls back to OUTBOX_PG_DSN, read
	// as it is (not its _FILE form) by maintain's main.
	DSN string
	// Mode is partitions (drop expired daily partitions) or delete
	// (batched DELETE) (MAINTAIN_MODE, default partitions).
	Mode string
	// Table is the outbox table (OUTBOX_TABLE, default public.outbox).
	Table string
	// Retention keeps events this long (MAINTAIN_RETENTION, default 72h).
	Retention time.Duration
	// Interval runs maintenance every interval until stopped
	// (MAINTAIN_INTERVAL, default 0: once).
	Interval time.Duration
	// LockTimeout and MoveTimeout bound each lock wait and each
	// partition step (MAINTAIN_LOCK_TIMEOUT 5s, MAINTAIN_MOVE_TIMEOUT 30s).
	LockTimeout time.Duration
	MoveTimeout time.Duration
	// Ahead is the days of partitions created after today
	// (MAINTAIN_AHEAD, default 2); Batch the rows per DELETE
	// (MAINTAIN_BATCH, default 1000).
	Ahead, Batch int
}

// Bind registers every setting on fs with getenv supplying defaults.
func (s *Settings) Bind(fs *flag.FlagSet, getenv func(string) string) *iconfig.Binder {
	b := iconfig.NewBinder(fs, getenv)
	b.Secret(&s.DSN, "pg-dsn", "MAINTAIN_PG_DSN", "PostgreSQL connection string (falls back to OUTBOX_PG_DSN)")
	b.String(&s.Mode, "mode", "MAINTAIN_MODE", "partitions", "partitions (drop expired daily partitions) or delete (batched DELETE)")
	b.String(&s.Table, "table", "OUTBOX_TABLE", "public.outbox", "outbox table, schema-qualified")
	b.Duration(&s.Retention, "retention", "MAINTAIN_RETENTION", 72*time.Hour, "keep events this long")
	b.Duration(&s.Interval, "interval", "MAINTAIN_INTERVAL", 0, "run every interval until stopped (0: once)")
	b.Int(&s.Ahead, "ahead", "MAINTAIN_AHEAD", 2, "days of partitions to create after today")
	b.Int(&s.Batch, "batch", "MAINTAIN_BATCH", 1000, "rows per DELETE in delete mode")
	b.Duration(&s.LockTimeout, "lock-timeout", "MAINTAIN_LOCK_TIMEOUT", 5*time.Second, "how long each step of partitions mode keeps asking for its locks (each request waits at most 50 ms, so writers never queue behind it for longer)")
	b.Duration(&s.MoveTimeout, "move-timeout", "MAINTAIN_MOVE_TIMEOUT", 30*time.Second,
		"longest run (and lock hold) of each partition creation, with its move of DEFAULT rows, or drop")
	return b
}

// EnvVars lists the environment variables maintain reads through its
// settings, sorted (each also as NAME_FILE). OUTBOX_PG_DSN, the fallback
// of MAINTAIN_PG_DSN, is not among them: maintain reads it only as it is.
func EnvVars() []string {
	var s Settings
	return s.Bind(flag.NewFlagSet("maintain", flag.ContinueOnError), func(string) string { return "" }).EnvVars()
}

// EnvRule: maintain refuses MAINTAIN_* variables it does not read. The
// OUTBOX_* it reads (OUTBOX_PG_DSN, OUTBOX_TABLE) are the connector's,
// which checks that namespace: maintain often runs with the connector's
// environment.
func EnvRule() iconfig.EnvRule {
	return iconfig.EnvRule{Prefixes: []string{"MAINTAIN_"}, Known: EnvVars()}
}
