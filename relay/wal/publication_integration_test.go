package wal

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// publicationSetup: a plain table, and a partitioned one two levels deep,
// each in a schema of its own so that each case has its own publication.
var publicationSetup = []string{
	`CREATE SCHEMA plain`,
	`CREATE TABLE plain.outbox (id int)`,
	`CREATE SCHEMA part`,
	`CREATE TABLE part.outbox (id int, created_at timestamptz) PARTITION BY RANGE (created_at)`,
	`CREATE TABLE part.outbox_2026 PARTITION OF part.outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01') PARTITION BY RANGE (id)`,
	`CREATE TABLE part.outbox_2026_low PARTITION OF part.outbox_2026 FOR VALUES FROM (0) TO (1000)`,
	`CREATE TABLE part.outbox_default PARTITION OF part.outbox DEFAULT`,
	`CREATE TABLE part.other (id int, created_at timestamptz) PARTITION BY RANGE (created_at)`,
	`CREATE TABLE part.other_default PARTITION OF part.other DEFAULT`,
}

// TestEnsurePublicationLive: EnsurePublication against PostgreSQL: it
// creates a publication that publishes a partitioned outbox via its root,
// refuses an existing one that does not (naming the ALTER that fixes it),
// one that lists only a partition, one that does not publish inserts, and
// says so when the table does not exist.
func TestEnsurePublicationLive(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range publicationSetup {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tests := []struct {
		name          string
		setup         string // run first: the operator's publication
		schema, table string
		created       bool
		fatal         string // a fatal.Error saying this; empty: success
		viaRoot       bool   // pubviaroot afterwards
	}{
		{name: "plain table, created", schema: "plain", table: "outbox", created: true},
		{name: "plain table, exists", setup: `CREATE PUBLICATION %s FOR TABLE plain.outbox WITH (publish = 'insert')`, schema: "plain", table: "outbox"},
		{name: "partitioned, created via its root", schema: "part", table: "outbox", created: true, viaRoot: true},
		{name: "partitioned, exists via its root", setup: `CREATE PUBLICATION %s FOR TABLE part.outbox WITH (publish = 'insert', publish_via_partition_root = true)`,
			schema: "part", table: "outbox", viaRoot: true},
		{name: "partitioned, exists without publish_via_partition_root", setup: `CREATE PUBLICATION %s FOR TABLE part.outbox WITH (publish = 'insert')`,
			schema: "part", table: "outbox", fatal: "SET (publish_via_partition_root = true)"},
		{name: "partitioned, for all tables without publish_via_partition_root", setup: `CREATE PUBLICATION %s FOR ALL TABLES WITH (publish = 'insert')`,
			schema: "part", table: "outbox", fatal: "SET (publish_via_partition_root = true)"},
		{name: "partitioned, only a partition listed", setup: `CREATE PUBLICATION %s FOR TABLE part.outbox_default WITH (publish = 'insert', publish_via_partition_root = true)`,
			schema: "part", table: "outbox", fatal: "does not include part.outbox; run: ALTER PUBLICATION", viaRoot: true},
		{name: "no inserts published", setup: `CREATE PUBLICATION %s FOR TABLE plain.outbox WITH (publish = 'update, delete')`,
			schema: "plain", table: "outbox", fatal: "does not publish inserts"},
		{name: "table missing", schema: "plain", table: "nothing", fatal: "table plain.nothing does not exist"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := "pub_" + string(rune('a'+i))
			if tt.setup != "" {
				if _, err := conn.Exec(ctx, strings.Replace(tt.setup, "%s", pub, 1)); err != nil {
					t.Fatal(err)
				}
			}
			created, err := EnsurePublication(ctx, conn, pub, tt.schema, tt.table, nil)
			if tt.fatal != "" {
				var fe *fatal.Error
				if !errors.As(err, &fe) || !strings.Contains(err.Error(), tt.fatal) {
					t.Fatalf("EnsurePublication: %v; want a fatal.Error saying %q", err, tt.fatal)
				}
				t.Logf("refused: %v", err)
			} else if err != nil {
				t.Fatalf("EnsurePublication: %v", err)
			}
			if created != tt.created {
				t.Errorf("created = %v, want %v", created, tt.created)
			}
			var viaRoot bool
			err = conn.QueryRow(ctx, `SELECT pubviaroot FROM pg_publication WHERE pubname = $1`, pub).Scan(&viaRoot)
			if errors.Is(err, pgx.ErrNoRows) && tt.table == "nothing" {
				return
			}
			if err != nil || viaRoot != tt.viaRoot {
				t.Errorf("pubviaroot = %v (%v), want %v", viaRoot, err, tt.viaRoot)
			}
		})
	}
}

// TestOutboxPartitionOfLive: the lookup the stream asks finds partitions of
// the outbox at any depth, and nothing else: not the outbox itself, not a
// partition of another table, not a plain table, not a relation that no
// longer exists.
func TestOutboxPartitionOfLive(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range publicationSetup {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	oid := func(name string) uint32 {
		var id uint32
		if err := conn.QueryRow(ctx, `SELECT $1::regclass::oid`, name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	lookup := OutboxPartitionOf(conn, "part", "outbox")
	for _, tt := range []struct {
		rel  string
		oid  uint32
		want bool
	}{
		{"part.outbox_2026", oid("part.outbox_2026"), true},
		{"part.outbox_2026_low", oid("part.outbox_2026_low"), true},
		{"part.outbox_default", oid("part.outbox_default"), true},
		{"part.outbox", oid("part.outbox"), false},
		{"part.other_default", oid("part.other_default"), false},
		{"plain.outbox", oid("plain.outbox"), false},
		{"a dropped relation", 4_000_000_000, false},
	} {
		got, err := lookup(ctx, tt.oid)
		if err != nil || got != tt.want {
			t.Errorf("%s: partition of part.outbox = %v, %v; want %v", tt.rel, got, err, tt.want)
		}
	}
}

// filterSetup: an outbox-shaped table with a generated column (never
// published, so never required of a column list), a partitioned one, and a
// second table for publications that list more than the outbox.
var filterSetup = []string{
	`CREATE SCHEMA filt`,
	`CREATE TABLE filt.outbox (id int, aggregatetype text, payload text, size int GENERATED ALWAYS AS (length(payload)) STORED)`,
	`CREATE TABLE filt.other (id int)`,
	`CREATE SCHEMA fpart`,
	`CREATE TABLE fpart.outbox (id int, aggregatetype text, payload text) PARTITION BY LIST (aggregatetype)`,
	`CREATE TABLE fpart.outbox_default PARTITION OF fpart.outbox DEFAULT`,
}

// TestEnsurePublicationFiltersLive: a publication whose entry for the
// outbox has a row filter, or a column list that leaves out a column the
// table has, would make pgoutput send some events not at all or without
// their columns while keepalives confirm past them: EnsurePublication
// refuses it with a fatal.Error naming the filter or the columns and the
// ALTER PUBLICATION ... SET TABLE that fixes it. A column list naming every
// column the table publishes is accepted (it publishes what no list would);
// so are no list and FOR ALL TABLES. A partitioned outbox published via its
// root is judged by the root's entry.
func TestEnsurePublicationFiltersLive(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range filterSetup {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tests := []struct {
		name   string
		setup  string // %s: the publication
		schema string
		fatal  []string // a fatal.Error saying each; empty: success
	}{
		{name: "row filter", setup: `CREATE PUBLICATION %s FOR TABLE filt.outbox WHERE (aggregatetype <> 'billing') WITH (publish = 'insert')`, schema: "filt",
			fatal: []string{"row filter", "aggregatetype <> 'billing'", "ALTER PUBLICATION %s SET TABLE filt.outbox;"}},
		{name: "row filter, other tables listed too", setup: `CREATE PUBLICATION %s FOR TABLE filt.other, filt.outbox WHERE (id > 10)`, schema: "filt",
			fatal: []string{"row filter", "ALTER PUBLICATION %s SET TABLE filt.outbox;", "list them after it"}},
		{name: "column list without payload", setup: `CREATE PUBLICATION %s FOR TABLE filt.outbox (id, aggregatetype) WITH (publish = 'insert')`, schema: "filt",
			fatal: []string{"column list", "payload", "ALTER PUBLICATION %s SET TABLE filt.outbox;"}},
		{name: "column list without id", setup: `CREATE PUBLICATION %s FOR TABLE filt.outbox (aggregatetype, payload)`, schema: "filt",
			fatal: []string{"column list", "leaves out id", "ALTER PUBLICATION %s SET TABLE filt.outbox;"}},
		{name: "column list of every column", setup: `CREATE PUBLICATION %s FOR TABLE filt.outbox (payload, id, aggregatetype) WITH (publish = 'insert')`, schema: "filt"},
		{name: "no filter", setup: `CREATE PUBLICATION %s FOR TABLE filt.outbox WITH (publish = 'insert')`, schema: "filt"},
		{name: "for all tables", setup: `CREATE PUBLICATION %s FOR ALL TABLES WITH (publish = 'insert')`, schema: "filt"},
		{name: "partitioned via its root, row filter on the root", setup: `CREATE PUBLICATION %s FOR TABLE fpart.outbox WHERE (aggregatetype <> 'billing') WITH (publish = 'insert', publish_via_partition_root = true)`,
			schema: "fpart", fatal: []string{"row filter", "ALTER PUBLICATION %s SET TABLE fpart.outbox;"}},
		{name: "partitioned via its root, column list on the root", setup: `CREATE PUBLICATION %s FOR TABLE fpart.outbox (id, aggregatetype) WITH (publish = 'insert', publish_via_partition_root = true)`,
			schema: "fpart", fatal: []string{"column list", "payload"}},
		{name: "partitioned via its root, no filter", setup: `CREATE PUBLICATION %s FOR TABLE fpart.outbox WITH (publish = 'insert', publish_via_partition_root = true)`, schema: "fpart"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := "fpub_" + string(rune('a'+i))
			if _, err := conn.Exec(ctx, strings.ReplaceAll(tt.setup, "%s", pub)); err != nil {
				t.Fatal(err)
			}
			_, err := EnsurePublication(ctx, conn, pub, tt.schema, "outbox", nil)
			if len(tt.fatal) == 0 {
				if err != nil {
					t.Fatalf("EnsurePublication: %v; want it accepted", err)
				}
				return
			}
			var fe *fatal.Error
			if !errors.As(err, &fe) {
				t.Fatalf("EnsurePublication: %v; want a fatal.Error", err)
			}
			for _, want := range tt.fatal {
				if want = strings.ReplaceAll(want, "%s", pub); !strings.Contains(err.Error(), want) {
					t.Errorf("EnsurePublication: %v; want it to say %q", err, want)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestEnsurePublicationOldServerLive: PostgreSQL 13 has neither row filters
// nor column lists (pg_publication_tables has no rowfilter or attnames):
// the check still reads the publication and accepts it.
func TestEnsurePublicationOldServerLive(t *testing.T) {
	bin, err := testenv.PGVersionBinDir(13)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 13: %v", err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, BinDir: bin})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range []string{`CREATE SCHEMA filt`, `CREATE TABLE filt.outbox (id int, payload text)`, `CREATE PUBLICATION old_pub FOR TABLE filt.outbox WITH (publish = 'insert')`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := EnsurePublication(ctx, conn, "old_pub", "filt", "outbox", nil); err != nil {
		t.Fatalf("EnsurePublication on %s: %v", pg.Version, err)
	}
	if _, err := EnsurePublication(ctx, conn, "old_created", "filt", "outbox", nil); err != nil {
		t.Fatalf("EnsurePublication (creating it) on %s: %v", pg.Version, err)
	}
}
