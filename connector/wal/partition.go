package wal

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what OutboxPartitionOf needs of a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
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
// dropped or detached since the insert was written is no longer one.
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
