package wal

import (
	"context"
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestOutboxColumnsOfLive: OutboxColumnsOf against PostgreSQL gives a
// partitioned outbox's columns as pgoutput sends them (a dropped column
// and a generated one left out), in order, with their types; none for a
// plain table or a table that does not exist, without an error.
func TestOutboxColumnsOfLive(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range []string{
		`CREATE SCHEMA part`,
		`CREATE TABLE part.outbox (id uuid, gone int, payload jsonb, created_at timestamptz, n int GENERATED ALWAYS AS (1) STORED) PARTITION BY RANGE (created_at)`,
		`ALTER TABLE part.outbox DROP COLUMN gone`,
		`CREATE TABLE part.outbox_default PARTITION OF part.outbox DEFAULT`,
		`CREATE SCHEMA plain`,
		`CREATE TABLE plain.outbox (id uuid, payload jsonb)`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tt := range []struct {
		schema string
		want   []RelationColumn
	}{
		{"part", []RelationColumn{{Name: "id", Type: 2950}, {Name: "payload", Type: 3802}, {Name: "created_at", Type: 1184}}},
		{"plain", nil},
		{"missing", nil},
	} {
		got, err := OutboxColumnsOf(conn, tt.schema, "outbox")(ctx)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s.outbox: columns %v, %v; want %v", tt.schema, got, err, tt.want)
		}
	}
}
