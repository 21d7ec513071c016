package wal

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/route"
)

// Querier is what OutboxPartitionOf and ColumnInfoOf need of a pool or a
// connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// queryOutboxPartition asks whether relation $1 has the outbox table
// ($2.$3) among its ancestors, at any depth (pg_partition_ancestors,
// PostgreSQL 12+, lists the relation itself first: excluded). A relation
// that no longer exists has no ancestors.
const queryOutboxPartition = `
SELECT EXISTS (
    SELECT 1 FROM pg_partition_ancestors($1::oid::regclass) a
    JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $2 AND c.relname = $3 AND a.relid <> $1::oid)`

// partitionLookupTimeout bounds one lookup: the stream waits for it.
const partitionLookupTimeout = 10 * time.Second

// OutboxPartitionOf returns a Stream.IsOutboxPartition that asks q, a
// normal (not replication) connection or pool, whether a relation is a
// partition of schema.table. It reads the catalog as it is now: a partition
// dropped or detached since the insert was written is no longer one
// (OutboxColumnsOf catches those).
func OutboxPartitionOf(q Querier, schema, table string) func(ctx context.Context, relID uint32) (bool, error) {
	return func(ctx context.Context, relID uint32) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, partitionLookupTimeout)
		defer cancel()
		var is bool
		if err := q.QueryRow(ctx, queryOutboxPartition, relID, schema, table).Scan(&is); err != nil {
			return false, fmt.Errorf("look up the ancestors of relation %d: %w", relID, err)
		}
		return is, nil
	}
}

// queryOutboxColumns reads the columns of the outbox table ($1.$2), as
// pgoutput sends them (not dropped, not generated), when it is partitioned:
// no row otherwise. (array_agg of no rows is NULL, so an outbox that is not
// partitioned gives one row of NULLs.)
const queryOutboxColumns = `
SELECT array_agg(a.attname::text ORDER BY a.attnum), array_agg(a.atttypid::int8 ORDER BY a.attnum)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p'
  AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''`

// OutboxColumnsOf returns a Stream.OutboxColumns that asks q, a normal (not
// replication) connection or pool, for the columns of schema.table when it
// is a partitioned table, and for none when it is not: a plain outbox has
// no partition to lose, and a table with its columns is another table.
func OutboxColumnsOf(q Querier, schema, table string) func(ctx context.Context) ([]RelationColumn, error) {
	return func(ctx context.Context) ([]RelationColumn, error) {
		ctx, cancel := context.WithTimeout(ctx, partitionLookupTimeout)
		defer cancel()
		var names []string
		var types []int64
		if err := q.QueryRow(ctx, queryOutboxColumns, schema, table).Scan(&names, &types); err != nil {
			return nil, fmt.Errorf("read the columns of the outbox table %s.%s: %w", schema, table, err)
		}
		if len(names) != len(types) {
			return nil, fmt.Errorf("read the columns of the outbox table %s.%s: %d names, %d types", schema, table, len(names), len(types))
		}
		cols := make([]RelationColumn, len(names))
		for i := range names {
			cols[i] = RelationColumn{Name: names[i], Type: uint32(types[i])}
		}
		return cols, nil
	}
}

// RoutingColumns are the columns of the outbox that the connector reads
// to route and publish an event with cfg: the event id, the routing field,
// the key (when one is configured) and the payload. The event type is not
// read (route.Config.FieldEventType), so it is not one. The look-alike
// check requires these only, not the outbox's current column set: a
// relation written before ALTER TABLE outbox ADD (or DROP) COLUMN has the
// columns of then, and would not match today's.
func RoutingColumns(cfg route.Config) []string {
	var cols []string
	for _, c := range []string{cfg.FieldEventID, cfg.RouteByField, cfg.FieldEventKey, cfg.FieldPayload} {
		if c != "" && !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	return cols
}

// hasColumns reports whether a relation has every column in names, of any
// type (a column's type may have changed since), and names has at least
// one. Fewer columns required means more relations refused: the check
// fails closed.
func hasColumns(rel []RelationColumn, names []string) bool {
	if len(names) == 0 {
		return false
	}
	for _, n := range names {
		if !slices.ContainsFunc(rel, func(c RelationColumn) bool { return c.Name == n }) {
			return false
		}
	}
	return true
}
