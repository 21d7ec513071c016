package poll

import (
	"context"
	"testing"
)

// TestReadSkewedBacklog: one hot aggregate has a large backlog; a reader
// whose buckets hold nothing of it reads nothing, and must not walk the hot
// bucket's entries to find that out (before: every empty read fetched every
// unpublished row of the table, ~230 ms per read at 1M rows, every 100 ms,
// per idle instance). The hot bucket's own reader reads a batch, not the
// backlog.
func TestReadSkewedBacklog(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	const hot = 50000
	for _, q := range []string{
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'Order', 'hot', 'T', '{}' FROM generate_series(1, 50000) g`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', 'cold', 'T', '{}')`,
		`ANALYZE outbox`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	const buckets = 16
	var hotBucket, coldBucket int
	if err := admin.QueryRow(ctx, `SELECT (hashtext('hot') & 2147483647) % 16, (hashtext('cold') & 2147483647) % 16`).Scan(&hotBucket, &coldBucket); err != nil {
		t.Fatal(err)
	}
	var empty []int
	for b := range buckets {
		if b != hotBucket && b != coldBucket {
			empty = append(empty, b)
		}
	}
	cfg := Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: buckets, Batch: 1000, BatchBytes: 1 << 22}
	// fetched is what one read fetched from the table's indexes and heap,
	// by the server's own counters (flushed by the reader's session).
	fetched := func(own []int) (rows int, tuples int64) {
		t.Helper()
		conn := pg.Conn(t, "outbox")
		r, err := Open(ctx, conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !r.BucketIndexed() {
			t.Fatalf("the variant's bucket index does not serve a reader of %d buckets of aggregateid; it would create: %s", buckets, r.BucketIndex())
		}
		r.own = own
		count := func() int64 {
			var n int64
			if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
				t.Fatal(err)
			}
			if err := admin.QueryRow(ctx, `SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes WHERE relid = 'outbox'::regclass`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := count()
		got, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(got), count() - before
	}
	rows, tuples := fetched(empty)
	t.Logf("a reader of the %d empty buckets: %d rows read, %d index entries fetched", len(empty), rows, tuples)
	if rows != 0 {
		t.Fatalf("a reader of empty buckets read %d rows", rows)
	}
	if tuples > 100 {
		t.Fatalf("a reader of empty buckets fetched %d index entries beside a hot backlog of %d rows; want a handful (one probe a bucket)", tuples, hot)
	}
	own := []int{hotBucket}
	if coldBucket != hotBucket {
		own = append(own, coldBucket)
	}
	rows, tuples = fetched(own)
	t.Logf("the hot bucket's reader: %d rows read, %d index entries fetched", rows, tuples)
	if rows != 1000 {
		t.Fatalf("the hot bucket's reader read %d rows; want a batch of 1000", rows)
	}
	if tuples > 3000 {
		t.Fatalf("the hot bucket's reader fetched %d index entries for a batch of 1000; want about a batch", tuples)
	}
}
