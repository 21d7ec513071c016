package partition_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// insertAt writes n outbox rows dated at, through the parent table as a
// writer would, and returns their ids.
func insertAt(t *testing.T, conn *pgx.Conn, at time.Time, n int) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		SELECT gen_random_uuid(), 'Order', 'o-' || i, 'Placed', jsonb_build_object('i', i), $1
		FROM generate_series(1, $2) AS i RETURNING id::text`, at, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// where returns the partition holding each of ids ("" when the row is gone).
func where(t *testing.T, conn *pgx.Conn, ids []string) map[string]string {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`SELECT id::text, tableoid::regclass::text FROM outbox WHERE id = ANY($1::uuid[])`, ids)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, part string
		if err := rows.Scan(&id, &part); err != nil {
			t.Fatal(err)
		}
		got[id] = part
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// publishedInserts counts the inserts the publication hands a slot since the
// last call (pgoutput, as the connector reads it): moving rows out of the
// DEFAULT partition must publish nothing, or every moved event would reach
// Kafka again.
func publishedInserts(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_logical_slot_get_binary_changes('maintain_probe', NULL, NULL,
		'proto_version', '1', 'publication_names', 'outbox_pub') WHERE substr(data, 1, 1) = 'I'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMaintainMovesDefaultRows: rows written for a day that had no partition
// sit in DEFAULT. Maintenance creates that day's partition with the rows in
// it (the plain CREATE ... PARTITION OF fails with 23514 over them),
// publishes none of them again, still drops the expired partitions, and
// deletes DEFAULT rows whose day has expired while keeping the others.
func TestMaintainMovesDefaultRows(t *testing.T) {
	pg := partitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	now := time.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	for d := 3; d <= 5; d++ {
		day := today.AddDate(0, 0, -d)
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`,
			partition.Name("outbox", day), day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('maintain_probe', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	future := insertAt(t, conn, today.AddDate(0, 0, 2).Add(5*time.Hour), 50) // no partition yet: DEFAULT
	recent := insertAt(t, conn, today.AddDate(0, 0, -2).Add(time.Hour), 3)   // DEFAULT, its day not expired
	expired := insertAt(t, conn, today.AddDate(0, 0, -10), 4)                // DEFAULT, expired long ago
	if n := publishedInserts(t, conn); n != 57 {
		t.Fatalf("the writes published %d inserts, want 57", n)
	}
	for id, part := range where(t, conn, future) {
		if part != "outbox_default" {
			t.Fatalf("row %s is in %s before maintenance, want outbox_default", id, part)
		}
	}

	res, err := partition.Maintain(ctx, conn, partition.Config{Retention: 48 * time.Hour, Ahead: 2})
	if err != nil {
		t.Fatalf("maintain: %v (result %+v)", err, res)
	}
	day2 := partition.Name("outbox", today.AddDate(0, 0, 2))
	if fmt.Sprint(res.Created) != fmt.Sprint([]string{day2}) {
		t.Errorf("created %v, want [%s]", res.Created, day2)
	}
	wantDropped := []string{partition.Name("outbox", today.AddDate(0, 0, -5)), partition.Name("outbox", today.AddDate(0, 0, -4)),
		partition.Name("outbox", today.AddDate(0, 0, -3))}
	if fmt.Sprint(res.Dropped) != fmt.Sprint(wantDropped) {
		t.Errorf("dropped %v, want %v", res.Dropped, wantDropped)
	}
	if res.Moved != 50 || res.DefaultDeleted != 4 {
		t.Errorf("moved %d rows out of DEFAULT (want 50), deleted %d expired DEFAULT rows (want 4)", res.Moved, res.DefaultDeleted)
	}
	got := where(t, conn, append(append(append([]string(nil), future...), recent...), expired...))
	for _, id := range future {
		if got[id] != day2 {
			t.Errorf("row %s for day +2 is in %q, want %s", id, got[id], day2)
		}
	}
	for _, id := range recent {
		if got[id] != "outbox_default" {
			t.Errorf("row %s of an unexpired day without partition is in %q, want outbox_default", id, got[id])
		}
	}
	for _, id := range expired {
		if got[id] != "" {
			t.Errorf("expired row %s is still in %s", id, got[id])
		}
	}
	var payloads int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[]) AND payload ? 'i' AND type = 'Placed'`,
		future).Scan(&payloads); err != nil || payloads != 50 {
		t.Errorf("%d moved rows keep their columns (err %v), want 50", payloads, err)
	}
	if n := publishedInserts(t, conn); n != 0 {
		t.Errorf("maintenance published %d inserts: the moved rows would be delivered again", n)
	}
	// The moved-into partition is a real one: today's writers for that day
	// land in it, and a repeated run changes nothing.
	if ids := insertAt(t, conn, today.AddDate(0, 0, 2).Add(time.Hour), 1); where(t, conn, ids)[ids[0]] != day2 {
		t.Errorf("a new row for day +2 went to %s, want %s", where(t, conn, ids)[ids[0]], day2)
	}
	res, err = partition.Maintain(ctx, conn, partition.Config{Retention: 48 * time.Hour, Ahead: 2})
	if err != nil || len(res.Created)+len(res.Dropped) != 0 || res.Moved+res.DefaultDeleted != 0 {
		t.Errorf("a repeated run: %+v, err %v; want nothing done", res, err)
	}
}

// TestMaintainDropsDespiteFailedCreate: a create that fails (a stray table
// holds the partition's name) does not stop the drops, and is reported at
// the end. A transaction holding the DEFAULT partition (which both a create
// and a drop must lock) makes each give up after the lock timeout, reported,
// with nothing changed. A move that takes longer than MoveTimeout is rolled
// back whole: every row stays in DEFAULT, none is lost or doubled.
func TestMaintainDropsDespiteFailedCreate(t *testing.T) {
	pg := partitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	today := time.Now().UTC().Truncate(24 * time.Hour)
	day2 := partition.Name("outbox", today.AddDate(0, 0, 2))
	var olds []string
	for _, d := range []int{-7, -6} {
		old := today.AddDate(0, 0, d)
		olds = append(olds, partition.Name("outbox", old))
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`,
			partition.Name("outbox", old), old.Format(time.RFC3339), old.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	future := insertAt(t, conn, today.AddDate(0, 0, 2), 1)

	// A transaction holds the DEFAULT partition: every step gives up in time.
	holder := pg.Conn(t, "outbox")
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE ONLY outbox_default IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := partition.Maintain(ctx, conn, partition.Config{Retention: 72 * time.Hour, Ahead: 2, LockTimeout: 300 * time.Millisecond})
	took := time.Since(start)
	_ = tx.Rollback(ctx)
	var pgErr *pgconn.PgError
	if err == nil || !strings.Contains(err.Error(), "create "+day2) || !strings.Contains(err.Error(), "drop "+olds[0]) ||
		!errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("err = %v; want the create of %s and the drops reported, with the lock timeout (55P03)", err, day2)
	}
	if len(res.Created)+len(res.Dropped) != 0 {
		t.Errorf("with DEFAULT locked: %+v; want nothing done", res)
	}
	if took > 5*time.Second {
		t.Errorf("maintenance took %s with a 300ms lock timeout", took)
	}
	t.Logf("with DEFAULT locked by another transaction: gave up after %s: %v", took.Round(time.Millisecond), err)

	// A stray table holds day +2's name: its create fails, the drops go on.
	if _, err := conn.Exec(ctx, `CREATE TABLE `+day2+` (x int)`); err != nil {
		t.Fatal(err)
	}
	res, err = partition.Maintain(ctx, conn, partition.Config{Retention: 72 * time.Hour, Ahead: 2})
	if err == nil || !strings.Contains(err.Error(), "create "+day2) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("err = %v; want the failed create of %s reported", err, day2)
	}
	if fmt.Sprint(res.Dropped) != fmt.Sprint(olds) || len(res.Created) != 0 {
		t.Errorf("after a failed create: created %v, dropped %v; want none created, %v dropped", res.Created, res.Dropped, olds)
	}
	if got := where(t, conn, future)[future[0]]; got != "outbox_default" {
		t.Errorf("the row of the failed create is in %q, want outbox_default", got)
	}
	if _, err := conn.Exec(ctx, `DROP TABLE `+day2); err != nil {
		t.Fatal(err)
	}

	// A move longer than MoveTimeout: rolled back whole.
	many := insertAt(t, conn, today.AddDate(0, 0, 2).Add(time.Hour), 200_000)
	res, err = partition.Maintain(ctx, conn, partition.Config{Retention: 72 * time.Hour, Ahead: 2, MoveTimeout: 20 * time.Millisecond})
	if err == nil || len(res.Created) != 0 {
		t.Fatalf("a 200,000-row move within 20ms: created %v, err %v; want it cut off", res.Created, err)
	}
	t.Logf("cut off: %v", err)
	var inDefault int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox_default`).Scan(&inDefault); err != nil || inDefault != len(many)+1 {
		t.Errorf("%d rows in DEFAULT after the cut-off move (err %v), want %d", inDefault, err, len(many)+1)
	}
	res, err = partition.Maintain(ctx, conn, partition.Config{Retention: 72 * time.Hour, Ahead: 2})
	if err != nil || res.Moved != int64(len(many)+1) {
		t.Fatalf("the next run: %+v, err %v; want %d rows moved", res, err, len(many)+1)
	}
	var total int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&total); err != nil || total != len(many)+1 {
		t.Errorf("%d rows in the outbox after the move (err %v), want %d", total, err, len(many)+1)
	}
}

// TestMaintainMoveKeepsColumns: the move maps columns by name. A DEFAULT
// partition attached from a table whose columns are in another order than
// the parent's (aggregateid before aggregatetype, both varchar) must not
// swap them; a generated column of the parent, which an INSERT may not
// set, is computed again in the new partition.
func TestMaintainMoveKeepsColumns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string
	}{
		{"DEFAULT's columns in another order", []string{
			`ALTER TABLE outbox DETACH PARTITION outbox_default`,
			`DROP TABLE outbox_default`,
			`CREATE TABLE outbox_default (id uuid NOT NULL, aggregateid varchar(255) NOT NULL, aggregatetype varchar(255) NOT NULL,
				type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(), tracingspancontext text)`,
			`ALTER TABLE outbox ATTACH PARTITION outbox_default DEFAULT`,
		}},
		{"a generated column", []string{
			`ALTER TABLE outbox ADD COLUMN day date GENERATED ALWAYS AS ((created_at AT TIME ZONE 'UTC')::date) STORED`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := partitionedPostgres(t)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			for _, stmt := range tc.setup {
				if _, err := conn.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			today := time.Now().UTC().Truncate(24 * time.Hour)
			ids := insertAt(t, conn, today.AddDate(0, 0, 2).Add(time.Hour), 5)
			res, err := partition.Maintain(ctx, conn, partition.Config{Ahead: 2})
			if err != nil || res.Moved != 5 {
				t.Fatalf("maintain: %+v, err %v; want 5 rows moved", res, err)
			}
			day2 := partition.Name("outbox", today.AddDate(0, 0, 2))
			rows, err := conn.Query(ctx, `SELECT tableoid::regclass::text, aggregatetype, aggregateid, type, payload->>'i' FROM outbox WHERE id = ANY($1::uuid[])`, ids)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				var part, aggType, aggID, typ, i string
				if err := rows.Scan(&part, &aggType, &aggID, &typ, &i); err != nil {
					t.Fatal(err)
				}
				n++
				if part != day2 || aggType != "Order" || aggID != "o-"+i || typ != "Placed" {
					t.Errorf("moved row: partition %s, aggregatetype %q, aggregateid %q, type %q (payload i=%s); want %s, Order, o-%s, Placed",
						part, aggType, aggID, typ, i, day2, i)
				}
			}
			if err := rows.Err(); err != nil || n != 5 {
				t.Errorf("%d moved rows read (err %v), want 5", n, err)
			}
		})
	}
}

// TestMaintainBlockedWriterRetries: while a move holds the DEFAULT
// partition, a transaction writing a row of the day being moved waits for
// it and then fails with 23514 (its row no longer belongs in DEFAULT), with
// nothing written; the same transaction again succeeds, its row in the new
// partition. That is what the README tells writers: retry on 23514. A
// writer of a day that has its partition does not wait.
func TestMaintainBlockedWriterRetries(t *testing.T) {
	pg := partitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	today := time.Now().UTC().Truncate(24 * time.Hour)
	insertAt(t, conn, today.AddDate(0, 0, 2), 200_000) // a move of a few seconds
	maint := pg.Conn(t, "outbox")
	type result struct {
		res partition.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := partition.Maintain(ctx, maint, partition.Config{Ahead: 2})
		done <- result{res, err}
	}()
	holding := func() bool {
		var held bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'relation'
			AND relation = 'outbox_default'::regclass AND mode = 'AccessExclusiveLock' AND granted)`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return held
	}
	for deadline := time.Now().Add(20 * time.Second); !holding(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("maintenance never held the DEFAULT partition")
		}
	}

	writer := pg.Conn(t, "outbox")
	writeOne := func(at time.Time) (string, error) {
		var id string
		err := pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
				VALUES (gen_random_uuid(), 'Order', 'o-w', 'Placed', '{}', $1) RETURNING id::text`, at).Scan(&id)
		})
		return id, err
	}
	// A day with a partition: no wait, with the move still holding DEFAULT.
	other := pg.Conn(t, "outbox")
	if _, err := other.Exec(ctx, `SET lock_timeout = '500ms'`); err != nil {
		t.Fatal(err)
	}
	var id0 string
	if err := other.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		VALUES (gen_random_uuid(), 'Order', 'o-t', 'Placed', '{}', now()) RETURNING id::text`).Scan(&id0); err != nil {
		t.Errorf("a row for today while the move runs: %v; want it written without waiting", err)
	}
	if !holding() {
		t.Fatal("the move ended before the writer of today was tried; make it longer")
	}

	// The day being moved: waits, then 23514, nothing written.
	_, err := writeOne(today.AddDate(0, 0, 2).Add(time.Hour))
	r := <-done
	if r.err != nil || r.res.Moved != 200_000 {
		t.Fatalf("maintain: %+v, err %v", r.res, r.err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("the blocked writer got %v; want SQLSTATE 23514", err)
	}
	t.Logf("the blocked writer: %v", err)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregateid = 'o-w'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows of the failed writer (err %v), want 0", n, err)
	}
	id, err := writeOne(today.AddDate(0, 0, 2).Add(time.Hour))
	if err != nil {
		t.Fatalf("the retried writer: %v", err)
	}
	if got := where(t, conn, []string{id})[id]; got != partition.Name("outbox", today.AddDate(0, 0, 2)) {
		t.Errorf("the retried row is in %q, want the new partition", got)
	}
}
