// Package partition maintains the daily-partitioned outbox of
// sql/variants/outbox_partitioned.sql: it creates the coming days' partitions
// and drops the partitions whose whole day is older than the retention.
// Dropping a partition is a catalog change that takes a moment's lock, where
// deleting the same rows one by one would write WAL for each, leave dead
// tuples and keep vacuum busy.
//
// Partitions are UTC days named <table>_pYYYYMMDD; partitions with other
// names (the DEFAULT partition, a partition an operator made by hand) are
// never dropped.
package partition

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what Maintain needs: *pgx.Conn and *pgxpool.Pool have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config says what Maintain keeps.
type Config struct {
	// Table is the partitioned outbox, "schema.name" (default "public.outbox").
	Table string
	// Retention: a partition is dropped once its day ended more than
	// Retention ago (default 72h). Keep it longer than the relay's worst lag
	// if the rows are to stay readable during an incident; events are never
	// lost by a drop (the relay reads them from the WAL).
	Retention time.Duration
	// Ahead is the number of days after today to create (default 2), so
	// that a maintenance run that fails for a day does not send inserts to
	// the DEFAULT partition.
	Ahead int
	// LockTimeout bounds the wait for each DROP/CREATE lock, so that
	// maintenance never queues writers behind it for long (default 5s).
	LockTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Result lists what Maintain changed.
type Result struct {
	Created []string
	Dropped []string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c *Config) defaults() (schema, table string, err error) {
	if c.Table == "" {
		c.Table = "public.outbox"
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) == 1 {
		parts = []string{"public", parts[0]}
	}
	if len(parts) != 2 || !identRE.MatchString(parts[0]) || !identRE.MatchString(parts[1]) {
		return "", "", fmt.Errorf("partition: table %q: want schema.name of plain identifiers", c.Table)
	}
	if c.Retention <= 0 {
		c.Retention = 72 * time.Hour
	}
	if c.Ahead <= 0 {
		c.Ahead = 2
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return parts[0], parts[1], nil
}

// Name is the partition of day (UTC) of table (without schema).
func Name(table string, day time.Time) string {
	return table + "_p" + day.UTC().Format("20060102")
}

const listSQL = `SELECT c.relname
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = $1::regclass`

// Maintain creates the partitions of today and the next Ahead days that are
// missing, then drops the expired ones. It is idempotent; run it at least
// daily. An error leaves what was already done in place.
func Maintain(ctx context.Context, db DB, cfg Config) (Result, error) {
	schema, table, err := cfg.defaults()
	if err != nil {
		return Result{}, err
	}
	parent := pgx.Identifier{schema, table}.Sanitize()
	existing, err := list(ctx, db, parent)
	if err != nil {
		return Result{}, err
	}
	var res Result
	today := cfg.Now().UTC().Truncate(24 * time.Hour)
	for i := 0; i <= cfg.Ahead; i++ {
		day := today.AddDate(0, 0, i)
		name := Name(table, day)
		if existing[name] {
			continue
		}
		stmt := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
			pgx.Identifier{schema, name}.Sanitize(), parent,
			day.Format("2006-01-02 15:04:05Z07:00"), day.AddDate(0, 0, 1).Format("2006-01-02 15:04:05Z07:00"))
		if err := withLockTimeout(ctx, db, cfg.LockTimeout, stmt); err != nil {
			return res, fmt.Errorf("partition: create %s: %w", name, err)
		}
		res.Created = append(res.Created, name)
	}
	cutoff := cfg.Now().Add(-cfg.Retention)
	var names []string
	for name := range existing {
		names = append(names, name)
	}
	sort.Strings(names)
	prefix := table + "_p"
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) || len(name) != len(prefix)+8 {
			continue
		}
		day, err := time.Parse("20060102", name[len(prefix):])
		if err != nil {
			continue // not one of ours
		}
		if end := day.AddDate(0, 0, 1); !end.Before(cutoff) {
			continue
		}
		stmt := "DROP TABLE IF EXISTS " + pgx.Identifier{schema, name}.Sanitize()
		if err := withLockTimeout(ctx, db, cfg.LockTimeout, stmt); err != nil {
			return res, fmt.Errorf("partition: drop %s: %w", name, err)
		}
		res.Dropped = append(res.Dropped, name)
	}
	return res, nil
}

func list(ctx context.Context, db DB, parent string) (map[string]bool, error) {
	rows, err := db.Query(ctx, listSQL, parent)
	if err != nil {
		return nil, fmt.Errorf("partition: list partitions of %s: %w", parent, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("partition: list partitions of %s: %w", parent, err)
	}
	if len(names) == 0 {
		// Either not partitioned or not yet: say which, for the operator.
		rows, err := db.Query(ctx, "SELECT relkind::text FROM pg_class WHERE oid = $1::regclass", parent)
		if err != nil {
			return nil, fmt.Errorf("partition: look up %s: %w", parent, err)
		}
		kind, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("partition: look up %s: %w", parent, err)
		}
		if kind != "p" {
			return nil, fmt.Errorf("partition: %s is not a partitioned table (apply sql/variants/outbox_partitioned.sql)", parent)
		}
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// withLockTimeout runs stmt in its own transaction with a lock timeout, so
// that a long transaction holding the outbox does not make the DROP wait
// for it while every writer queues behind the DROP.
func withLockTimeout(ctx context.Context, db DB, timeout time.Duration, stmt string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", timeout.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, stmt); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return fmt.Errorf("lock not granted within %s (a long transaction on the outbox?); the next run retries: %w", timeout, err)
		}
		return err
	}
	return tx.Commit(ctx)
}
