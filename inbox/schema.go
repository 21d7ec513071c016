package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Schema creates the processed-events table, or brings one created by an
// earlier version up to date (adding columns only); %[1]s is the quoted
// table name and %[2]s a name for its index. EnsureSchema applies it.
//
// It locks nothing on a table that is up to date: each column and the index
// are looked up in the catalog first, since ALTER TABLE ... ADD COLUMN IF NOT
// EXISTS takes ACCESS EXCLUSIVE and CREATE INDEX IF NOT EXISTS a SHARE lock
// before they look, and every member runs this at start: waiting for the
// longest open transaction on the table, with every inbox insert queued
// behind. An upgrade that does need the lock waits for it at most 2s
// (lock_timeout, restored afterwards), so writers wait no longer than that;
// on a busy table it fails with 55P03: apply it again at a quieter time.
const Schema = `CREATE TABLE IF NOT EXISTS %[1]s (
    consumer        text        NOT NULL,   -- the consumer group: the dedupe scope
    id              text        NOT NULL,   -- the event id (the id header)
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    outcome         text        NOT NULL,   -- processed | dead-lettered
    processed_at    timestamptz NOT NULL DEFAULT now(),
    payload_sha256  bytea,                  -- SHA-256 of the record value; NULL in rows written before it existed
    redriven_sha256 bytea,                  -- SHA-256 of the value a redrive applied, when there was one
    PRIMARY KEY (consumer, id)
);
DO $inbox$
DECLARE
    tbl regclass := '%[1]s'::regclass;
    was text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '2s', true);
    -- Tables created before payload_sha256 existed get it; their rows keep
    -- NULL (a repeat of such an id is a duplicate, whatever its payload).
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = tbl AND attname = 'payload_sha256' AND NOT attisdropped) THEN
        ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS payload_sha256 bytea;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = tbl AND attname = 'redriven_sha256' AND NOT attisdropped) THEN
        ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS redriven_sha256 bytea;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                   WHERE i.indrelid = tbl AND a.attname = 'processed_at') THEN
        CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (processed_at);
    END IF;
    PERFORM set_config('lock_timeout', was, true);
END
$inbox$;`

// Execer is what EnsureSchema and Cleanup need: *pgxpool.Pool, *pgx.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// EnsureSchema creates the processed-events table when it is missing and
// brings an older one up to date (see Schema: no lock when nothing is to do).
func EnsureSchema(ctx context.Context, db Execer, table string) error {
	if table == "" {
		table = "public.inbox"
	}
	q, err := quoteTable(table)
	if err != nil {
		return err
	}
	name := table[strings.LastIndexByte(table, '.')+1:]
	idx := pgx.Identifier{name + "_processed_at_idx"}.Sanitize()
	if _, err := db.Exec(ctx, fmt.Sprintf(Schema, q, idx)); err != nil {
		if sqlState(err) == "55P03" {
			return fmt.Errorf("inbox: upgrade table %s: the table is busy (its lock not had within 2s, so that inserts are not held up); "+
				"run EnsureSchema again when it is quieter: %w", table, err)
		}
		return fmt.Errorf("inbox: create table %s: %w", table, err)
	}
	return nil
}

const cleanupSQL = `DELETE FROM %s WHERE (consumer, id) IN (
	SELECT consumer, id FROM %[1]s WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2)
	LIMIT $3)`

// Cleanup deletes this consumer's ids processed more than Retention ago, in
// batches of CleanupBatch (each its own short transaction), and returns how
// many it deleted. Run calls it every CleanupInterval.
func (c *Consumer) Cleanup(ctx context.Context) (int64, error) {
	stmt := fmt.Sprintf(cleanupSQL, c.table)
	var total int64
	for {
		tag, err := c.db.Exec(ctx, stmt, c.cfg.Group, c.cfg.Retention.Seconds(), c.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: delete expired ids: %w", err)
		}
		total += tag.RowsAffected()
		c.cleaned.Add(tag.RowsAffected())
		if tag.RowsAffected() < int64(c.cfg.CleanupBatch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

func (c *Consumer) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := c.Cleanup(ctx); err != nil && ctx.Err() == nil {
			c.cleanFail.Add(1) // inbox_cleanup_failures_total: the table stops shrinking
			c.log.Warn("inbox cleanup failed; retrying at the next interval", "err", err, "failures", c.cleanFail.Load())
		} else if n > 0 {
			c.log.Debug("inbox cleanup", "deleted", n)
		}
	}
}
