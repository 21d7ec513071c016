package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cleaner deletes old rows of a table-mode outbox in small batches, each its
// own short transaction, so that no long lock or long-running transaction
// (which would hold back vacuum) is taken.
//
// Deleting a row never loses its event: the connector reads the WAL, not the
// table, and the insert is in the WAL from the moment it committed. The table
// only matters for the initial snapshot of a new slot, and for people reading
// it; keep Retention longer than the relay's worst lag so that the rows are
// there to look at while an incident is investigated.
type Cleaner struct {
	// Table is the outbox table (default "public.outbox").
	Table string
	// Retention: rows whose created_at is older are deleted (default 24h).
	// The connector's initial snapshot republishes every row still there,
	// so the consumers' inbox must keep ids longer than this (plus the time
	// between runs) plus the topic's retention (inbox.Window.OutboxRows).
	Retention time.Duration
	// BatchSize is the number of rows per DELETE (default 1000).
	BatchSize int
	// Pause is the sleep between batches, leaving room for the writers
	// (default 10ms).
	Pause time.Duration
}

// cleanupSQL deletes a batch of expired rows. On a table prepared for the
// connector's poll mode (sql/variants/outbox_poll.sql) it keeps the rows not
// yet published (published_at NULL), whatever their age: deleting one would
// lose its event. The row's JSON finds the column where it exists and is
// NULL SQL where it does not, so one statement serves both tables.
const cleanupSQL = `DELETE FROM %[1]s WHERE id IN (
	SELECT id FROM %[1]s o WHERE created_at < now() - make_interval(secs => $1)
	  AND (to_jsonb(o) -> 'published_at') IS DISTINCT FROM 'null'::jsonb
	ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

// DeleteExpired deletes every expired row, batch by batch, and returns how
// many it deleted. db must not be inside a transaction (a pool or a
// connection), so that each batch commits on its own.
func (c Cleaner) DeleteExpired(ctx context.Context, db Execer) (int64, error) {
	table := c.Table
	if table == "" {
		table = "public.outbox"
	}
	q, err := QuoteTable(table)
	if err != nil {
		return 0, err
	}
	retention := c.Retention
	if retention <= 0 {
		retention = 24 * time.Hour
	}
	batch := c.BatchSize
	if batch <= 0 {
		batch = 1000
	}
	pause := c.Pause
	if pause == 0 {
		pause = 10 * time.Millisecond
	}
	stmt := fmt.Sprintf(cleanupSQL, q)
	var total int64
	for {
		var tag pgconn.CommandTag
		tag, err = db.Exec(ctx, stmt, retention.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("outbox cleanup: delete from %s: %w", table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
}
