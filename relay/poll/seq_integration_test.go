package poll

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestMarkSharedSeq: two unpublished rows share a seq value (a cutover that
// kept the rows but not the sequence, OVERRIDING SYSTEM VALUE, a restarted
// sequence), in different buckets. The reader of one bucket marks only the
// row it read: the other's event is still to publish. Before, the mark was
// by seq alone and marked the unread row too, whose event was then never
// sent.
func TestMarkSharedSeq(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	// A table prepared by an older variant (or a partitioned one, where a
	// unique index must include the partition key) has no unique seq.
	if _, err := admin.Exec(ctx, `DROP INDEX IF EXISTS public.outbox_seq_key`); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 2, Batch: 10, BatchBytes: 1 << 20}
	// Two aggregates in different buckets.
	var keys []string
	buckets := map[int]string{}
	for i := 0; len(buckets) < 2; i++ {
		k := "agg-" + string(rune('a'+i))
		var b int
		if err := admin.QueryRow(ctx, `SELECT (hashtext($1) & 2147483647) % 2`, k).Scan(&b); err != nil {
			t.Fatal(err)
		}
		if _, ok := buckets[b]; !ok {
			buckets[b] = k
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if _, err := admin.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, seq) OVERRIDING SYSTEM VALUE
			VALUES (gen_random_uuid(), 'Order', $1, 'Placed', '{}', 7)`, k); err != nil {
			t.Fatal(err)
		}
	}
	// The sequence is ahead: this test is about the mark, not the start
	// check.
	if _, err := admin.Exec(ctx, `SELECT setval(pg_get_serial_sequence('public.outbox', 'seq'), 100)`); err != nil {
		t.Fatal(err)
	}
	r, err := Open(ctx, pg.Conn(t, "outbox"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mine int
	for b, k := range buckets {
		if k == keys[0] {
			mine = b
		}
	}
	r.own = []int{mine}
	rows, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("read %d rows of bucket %d; want 1", len(rows), mine)
	}
	if err := r.Mark(ctx, rows); err != nil {
		t.Fatal(err)
	}
	var left []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(array_agg(aggregateid), '{}') FROM public.outbox WHERE published_at IS NULL`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != keys[1] {
		t.Fatalf("unpublished after marking %s's row: %v; want [%s] (the row of the other bucket, never read)", keys[0], left, keys[1])
	}
}

// TestMarkMoreThanRead: a mark that would change more rows than the batch
// read (two rows with the same seq and id: a copy loaded twice) is an
// error, and changes nothing.
func TestMarkMoreThanRead(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, q := range []string{
		`DROP INDEX IF EXISTS public.outbox_seq_key`,
		`ALTER TABLE public.outbox DROP CONSTRAINT outbox_pkey`,
		`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, seq) OVERRIDING SYSTEM VALUE
		 VALUES ('00000000-0000-0000-0000-000000000001', 'Order', 'o1', 'Placed', '{}', 7),
		        ('00000000-0000-0000-0000-000000000001', 'Order', 'o1', 'Placed', '{}', 7)`,
		`SELECT setval(pg_get_serial_sequence('public.outbox', 'seq'), 100)`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Open(ctx, pg.Conn(t, "outbox"), Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 1, BatchBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r.own = []int{0}
	rows, err := r.Read(ctx)
	if err != nil || len(rows) != 1 {
		t.Fatalf("read %d rows (%v); want 1", len(rows), err)
	}
	if err := r.Mark(ctx, rows); !errors.Is(err, ErrMarkedMore) {
		t.Fatalf("Mark of one row matching two: %v; want ErrMarkedMore", err)
	}
	var left int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM public.outbox WHERE published_at IS NULL`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Fatalf("%d rows left unpublished after the refused mark; want 2 (rolled back)", left)
	}
}

// TestOpenRefusesSequenceBehind: a sequence behind the table's largest seq
// (logical replication carries rows, not sequences) would hand new events
// values that sort before older unpublished ones of their aggregate, and
// share values with them: Open refuses, naming setval.
func TestOpenRefusesSequenceBehind(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, q := range []string{
		`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', 'o1', 'Placed', '{}')`,
		`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, seq) OVERRIDING SYSTEM VALUE
		 VALUES (gen_random_uuid(), 'Order', 'o1', 'Shipped', '{}', 50)`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 10, BatchBytes: 1 << 20}
	_, err := Open(ctx, pg.Conn(t, "outbox"), cfg)
	if !errors.Is(err, ErrNotPrepared) || !strings.Contains(err.Error(), "setval") {
		t.Fatalf("Open with the sequence at 1 and a row at 50: %v; want ErrNotPrepared naming setval", err)
	}
	t.Logf("refused: %v", err)
	// Published rows count too: a new value equal to theirs is a
	// duplicate key, and their order is the aggregate's history.
	if _, err := admin.Exec(ctx, `UPDATE public.outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, pg.Conn(t, "outbox"), cfg); !errors.Is(err, ErrNotPrepared) {
		t.Fatalf("Open with the sequence behind published rows: %v; want ErrNotPrepared", err)
	}
	if _, err := admin.Exec(ctx, `SELECT setval(pg_get_serial_sequence('public.outbox', 'seq'), (SELECT max(seq) FROM public.outbox))`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, pg.Conn(t, "outbox"), cfg); err != nil {
		t.Fatalf("Open after setval: %v", err)
	}
}

// TestVariantSeqUnique: the variant makes seq unique on a plain table, so
// a writer whose sequence fell behind fails loudly instead of sharing a
// value with an unpublished row.
func TestVariantSeqUnique(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	if _, err := admin.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, seq) OVERRIDING SYSTEM VALUE
		VALUES (gen_random_uuid(), 'Order', 'o1', 'Placed', '{}', 1)`); err != nil {
		t.Fatal(err)
	}
	_, err := admin.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', 'o2', 'Placed', '{}')`)
	if err == nil || !strings.Contains(err.Error(), "23505") {
		t.Fatalf("a second row taking seq 1: %v; want a unique violation (23505)", err)
	}
}

// TestOpenRefusesRowSecurity: row-level security that applies to the
// relay's role would hide rows from every read (their events never
// published) and from the oldest-row check alike: Open refuses, naming
// BYPASSRLS; a role that bypasses it, or owns the table, opens. A policy
// enabled after Open fails the reads instead of filtering them.
func TestOpenRefusesRowSecurity(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, q := range []string{
		`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', 'o1', 'Placed', '{}'), (gen_random_uuid(), 'Secret', 's1', 'Placed', '{}')`,
		`CREATE POLICY not_secrets ON public.outbox FOR ALL USING (aggregatetype <> 'Secret')`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 10, BatchBytes: 1 << 20}
	poller := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, pg.DSNUser("outbox", "outbox_poller"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	// Before row security is on: opens and reads both rows.
	r, err := Open(ctx, poller(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.own = []int{0}
	if rows, err := r.Read(ctx); err != nil || len(rows) != 2 {
		t.Fatalf("read %d rows (%v); want 2", len(rows), err)
	}
	if _, err := admin.Exec(ctx, `ALTER TABLE public.outbox ENABLE ROW LEVEL SECURITY`); err != nil {
		t.Fatal(err)
	}
	// Enabled under a running reader: its reads fail, they do not skip.
	if rows, err := r.Read(ctx); err == nil {
		t.Fatalf("a read after row security was enabled returned %d rows and no error; want an error (row_security off)", len(rows))
	} else {
		t.Logf("running reader: %v", err)
	}
	_, err = Open(ctx, poller(), cfg)
	if !errors.Is(err, ErrNotPrepared) || !strings.Contains(err.Error(), "BYPASSRLS") {
		t.Fatalf("Open under row-level security: %v; want ErrNotPrepared naming BYPASSRLS", err)
	}
	t.Logf("refused: %v", err)
	// The owner (the superuser here) is not subject to it.
	if _, err := Open(ctx, pg.Conn(t, "outbox"), cfg); err != nil {
		t.Fatalf("Open as the owner: %v", err)
	}
	if _, err := admin.Exec(ctx, `ALTER ROLE outbox_poller BYPASSRLS`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, poller(), cfg); err != nil {
		t.Fatalf("Open as a BYPASSRLS role: %v", err)
	}
}

// TestMarkCharID: a char(n) event id reads padded, and its text cast drops
// the padding: compared as text, the mark matched no row and said nothing,
// and every batch was published again for ever. The id read is cast back
// to the column's type.
func TestMarkCharID(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, q := range []string{
		`ALTER TABLE outbox ALTER COLUMN id TYPE char(40) USING id::text`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('abc', 'Order', 'o1', 'Placed', '{}'), ('def', 'Order', 'o2', 'Placed', '{}')`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Open(ctx, pg.Conn(t, "outbox"), Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 10, BatchBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r.own = []int{0}
	rows, err := r.Read(ctx)
	if err != nil || len(rows) != 2 {
		t.Fatalf("read %d rows (%v); want 2", len(rows), err)
	}
	if err := r.Mark(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if again, err := r.Read(ctx); err != nil || len(again) != 0 {
		t.Fatalf("after the mark a read returned %d rows (%v); want none", len(again), err)
	}
}

// TestOpenSequenceStates: the start check reads the sequence itself, as
// the relay's least-privilege role: a sequence restarted ahead of the
// table (nothing handed out since: pg_sequences shows no last value) is
// ahead, and another schema's sequence the role may not use does not stop
// the check (a cast of every sequence's name to regclass checked USAGE on
// each schema, and was refused).
func TestOpenSequenceStates(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	for _, q := range []string{
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'Order', 'o' || g, 'Placed', '{}' FROM generate_series(1, 5) g`,
		`ALTER TABLE outbox ALTER COLUMN seq RESTART WITH 1000`,
		`CREATE SCHEMA billing`,
		`CREATE SEQUENCE billing.invoice_no`,
		`REVOKE ALL ON SCHEMA billing FROM PUBLIC`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, pg.DSNUser("outbox", "outbox_poller"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := Open(ctx, conn, Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 10, BatchBytes: 1 << 20}); err != nil {
		t.Fatalf("Open as outbox_poller, the sequence restarted at 1000 above a table at 5, beside a schema it may not use: %v", err)
	}
}

// TestOpenRefusesIDWithoutEquality: an event id of a type without
// equality (json) would fail every mark, the batch published again and
// again: Open refuses it, naming the column.
func TestOpenRefusesIDWithoutEquality(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	if _, err := pg.Conn(t, "outbox").Exec(ctx, `ALTER TABLE outbox DROP CONSTRAINT outbox_pkey, ALTER COLUMN id TYPE json USING to_json(id::text)`); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, pg.Conn(t, "outbox"), Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: 10, BatchBytes: 1 << 20})
	if !errors.Is(err, ErrNotPrepared) || !strings.Contains(err.Error(), "equality") {
		t.Fatalf("Open with a json id: %v; want ErrNotPrepared about equality", err)
	}
}
