package partition_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// partitionedPostgresMajor is partitionedPostgres on PostgreSQL major
// (Debian's where installed, else zonky's build).
func partitionedPostgresMajor(t *testing.T, major int) *testenv.Postgres {
	t.Helper()
	bin, err := testenv.PGVersionBinDir(major)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL %d: %v", major, err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, BinDir: bin})
	if err := pg.Psql("outbox", "-f", filepath.Join(testenv.RepoRoot(), "sql", "variants", "outbox_partitioned.sql")); err != nil {
		t.Fatal(err)
	}
	files, err := testenv.SchemaFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "001_") || strings.HasPrefix(base, "002_") {
			continue
		}
		if err := pg.Psql("outbox", "-f", f); err != nil {
			t.Fatal(err)
		}
	}
	return pg
}

// peekInserts decodes what pgoutput (protocol 1, as the connector reads it)
// hands the slot under pub since the slot's confirmed position, without
// consuming it, and counts the inserts by the relation they name.
func peekInserts(t *testing.T, conn *pgx.Conn, slot, pub string) map[string]int {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2)`, slot, pub)
	if err != nil {
		t.Fatalf("peek slot %s under %s: %v", slot, pub, err)
	}
	msgs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatalf("peek slot %s under %s: %v", slot, pub, err)
	}
	rels := map[uint32]string{}
	got := map[string]int{}
	for _, data := range msgs {
		m, err := pglogrepl.Parse(data)
		if err != nil {
			t.Fatalf("decode a pgoutput message under %s: %v", pub, err)
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			rels[m.RelationID] = m.Namespace + "." + m.RelationName
		case *pglogrepl.InsertMessage:
			got[rels[m.RelationID]]++
		}
	}
	return got
}

func describe(inserts map[string]int) string {
	if len(inserts) == 0 {
		return "none"
	}
	var out []string
	for rel, n := range inserts {
		out = append(out, fmt.Sprintf("%d into %s", n, rel))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// TestMaintainMovePublishesNothing (issue 14, review finding 1): a row for
// a day without a partition sits in DEFAULT, and maintenance moves it into
// the partition it creates for that day. Under every kind of publication
// the connector accepts for a partitioned outbox (FOR TABLE the outbox; FOR
// TABLES IN SCHEMA public, 15 and later; FOR ALL TABLES; each with
// publish_via_partition_root = true) the move must publish no insert: an
// insert into the outbox would deliver the moved events again, and one into
// the new partition under its own name stops the connector (it refuses
// inserts named by a partition, and every restart reads it again). On every
// major the project supports, 13 to 18, since the move relies on how
// logical decoding treats the table it moves the rows into.
func TestMaintainMovePublishesNothing(t *testing.T) {
	for major := 13; major <= 18; major++ {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			t.Parallel()
			pg := partitionedPostgresMajor(t, major)
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			pubs := []string{"outbox_pub", "pub_all"}
			if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub_all FOR ALL TABLES WITH (publish_via_partition_root = true)`); err != nil {
				t.Fatal(err)
			}
			if major >= 15 {
				pubs = append(pubs, "pub_schema")
				if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA public WITH (publish_via_partition_root = true)`); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('move_probe', 'pgoutput')`); err != nil {
				t.Fatal(err)
			}
			today := time.Now().UTC().Truncate(24 * time.Hour)
			future := insertAt(t, conn, today.AddDate(0, 0, 2).Add(5*time.Hour), 5) // no partition yet: DEFAULT
			for _, pub := range pubs {
				if got := peekInserts(t, conn, "move_probe", pub); got["public.outbox"] != 5 || len(got) != 1 {
					t.Fatalf("the writes published under %s: %s; want 5 into public.outbox", pub, describe(got))
				}
			}
			if _, err := conn.Exec(ctx, `SELECT pg_replication_slot_advance('move_probe', pg_current_wal_lsn())`); err != nil {
				t.Fatal(err)
			}

			res, err := partition.Maintain(ctx, conn, partition.Config{Ahead: 2})
			if err != nil {
				t.Fatalf("maintain: %v (result %+v)", err, res)
			}
			day2 := partition.Name("outbox", today.AddDate(0, 0, 2))
			if res.Moved != 5 {
				t.Errorf("moved %d rows, want 5 (result %+v)", res.Moved, res)
			}
			for id, part := range where(t, conn, future) {
				if part != day2 {
					t.Errorf("row %s is in %s after maintenance, want %s", id, part, day2)
				}
			}
			for _, pub := range pubs {
				if got := peekInserts(t, conn, "move_probe", pub); len(got) != 0 {
					t.Errorf("PostgreSQL %d: the move published under %s: %s; want none", major, pub, describe(got))
				}
			}
			// The partition is a real, logged one: a new row for its day is
			// published as the outbox's, under every publication.
			insertAt(t, conn, today.AddDate(0, 0, 2).Add(time.Hour), 1)
			for _, pub := range pubs {
				if got := peekInserts(t, conn, "move_probe", pub); got["public.outbox"] != 1 || len(got) != 1 {
					t.Errorf("PostgreSQL %d: a write after the move published under %s: %s; want 1 into public.outbox", major, pub, describe(got))
				}
			}
			var persistence string
			if err := conn.QueryRow(ctx, `SELECT relpersistence::text FROM pg_class WHERE oid = $1::regclass`, day2).Scan(&persistence); err != nil || persistence != "p" {
				t.Errorf("%s: relpersistence %q (err %v), want p (logged)", day2, persistence, err)
			}
		})
	}
}

// TestMaintainRefusesUnverifiedMove: on a major the move is not proved on
// (the test pretends 15 is one), a day whose rows a FOR TABLES IN SCHEMA
// publication could publish is not moved: its create is reported as failed,
// saying why and what to do, its rows stay in DEFAULT, nothing is
// published, and the other days are still created and the expired ones
// dropped. Without such a publication the move goes ahead.
func TestMaintainRefusesUnverifiedMove(t *testing.T) {
	pg := partitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	today := time.Now().UTC().Truncate(24 * time.Hour)
	var olds []string
	for _, d := range []int{-7, -6} {
		old := today.AddDate(0, 0, d)
		olds = append(olds, partition.Name("outbox", old))
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`,
			partition.Name("outbox", old), old.Format(time.RFC3339), old.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA public WITH (publish_via_partition_root = true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('move_probe', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	future := insertAt(t, conn, today.AddDate(0, 0, 2).Add(time.Hour), 3)
	if _, err := conn.Exec(ctx, `SELECT pg_replication_slot_advance('move_probe', pg_current_wal_lsn())`); err != nil {
		t.Fatal(err)
	}
	defer partition.SetVerifiedMajors(13, 14)()

	day2, day3 := partition.Name("outbox", today.AddDate(0, 0, 2)), partition.Name("outbox", today.AddDate(0, 0, 3))
	res, err := partition.Maintain(ctx, conn, partition.Config{Ahead: 3})
	for _, want := range []string{"create " + day2, `"pub_schema" (FOR TABLES IN SCHEMA public)`, "not verified", "stay in",
		"Publish only the outbox"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v; want it to say %q", err, want)
		}
	}
	t.Logf("refused: %v", err)
	if fmt.Sprint(res.Created) != fmt.Sprint([]string{day3}) || fmt.Sprint(res.Dropped) != fmt.Sprint(olds) || res.Moved != 0 {
		t.Errorf("result %+v; want %s created (it has no DEFAULT rows), %v dropped, nothing moved", res, day3, olds)
	}
	for id, part := range where(t, conn, future) {
		if part != "outbox_default" {
			t.Errorf("row %s is in %s after the refused move, want outbox_default", id, part)
		}
	}
	if got := peekInserts(t, conn, "move_probe", "pub_schema"); len(got) != 0 {
		t.Errorf("the refused move published %s; want none", describe(got))
	}

	// Only FOR TABLE publications left: the move cannot be published, so
	// it goes ahead on this major too.
	if _, err := conn.Exec(ctx, `DROP PUBLICATION pub_schema`); err != nil {
		t.Fatal(err)
	}
	res, err = partition.Maintain(ctx, conn, partition.Config{Ahead: 3})
	if err != nil || fmt.Sprint(res.Created) != fmt.Sprint([]string{day2}) || res.Moved != 3 {
		t.Errorf("without a covering publication: %+v, err %v; want %s created with 3 rows moved", res, err, day2)
	}
	if got := peekInserts(t, conn, "move_probe", "outbox_pub"); len(got) != 0 {
		t.Errorf("the move published %s under outbox_pub; want none", describe(got))
	}
}

// TestMaintainMoveWhileConnectorRunsAllTables: the connector streams through
// a FOR ALL TABLES publication (publish_via_partition_root = true, which its
// preflight accepts) while maintenance moves DEFAULT rows into a new
// partition: it keeps running, every event is delivered exactly once
// (none again because of the move), also those written into the new
// partition afterwards.
func TestMaintainMoveWhileConnectorRunsAllTables(t *testing.T) {
	pg := partitionedPostgres(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION pub_all FOR ALL TABLES WITH (publish_via_partition_root = true)`); err != nil {
		t.Fatal(err)
	}
	aggType := fmt.Sprintf("moveall%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	p := startConnectorEnv(t, pg, brokers, map[string]string{"OUTBOX_PUBLICATION": "pub_all"})
	today := time.Now().UTC().Truncate(24 * time.Hour)
	var ids []string
	write := func(at time.Time, n int) {
		t.Helper()
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = outbox.Event{AggregateType: aggType, AggregateID: fmt.Sprintf("a%d", i%7), Type: "T",
				Payload: map[string]int{"i": i}, Columns: map[string]any{"created_at": at}}
		}
		var got []uuid.UUID
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) { got, err = outbox.Write(ctx, tx, evs...); return err }); err != nil {
			t.Fatal(err)
		}
		for _, id := range got {
			ids = append(ids, id.String())
		}
	}
	write(today.AddDate(0, 0, 2).Add(time.Hour), 50) // DEFAULT: no partition for day +2 yet
	write(today.Add(time.Hour), 10)
	wait := func() {
		t.Helper()
		want := make([]testenv.Event, len(ids))
		for i, id := range ids {
			want[i] = testenv.Event{ID: id}
		}
		deadline := time.Now().Add(30 * time.Second)
		for c.Count() < len(ids) && !p.Exited() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p.Exited() {
			t.Fatalf("the connector stopped; output:\n%s", p.Output())
		}
		c.WaitFor(t, want, 30*time.Second)
	}
	wait()

	res, err := partition.Maintain(ctx, conn, partition.Config{Ahead: 2})
	if err != nil || res.Moved != 50 {
		t.Fatalf("maintain: %+v, err %v; want 50 rows moved", res, err)
	}
	write(today.AddDate(0, 0, 2).Add(2*time.Hour), 20) // into the new partition
	write(today.Add(2*time.Hour), 10)
	wait()
	// Anything the move published would arrive around the later writes:
	// give it the time a status interval or two takes.
	time.Sleep(2 * time.Second)
	if p.Exited() {
		t.Fatalf("the connector stopped after the move; output:\n%s", p.Output())
	}
	n := map[string]int{}
	for _, r := range c.Records() {
		n[testenv.Header(r, "id")]++
	}
	for _, id := range ids {
		if n[id] != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n[id])
		}
	}
	if len(n) != len(ids) || c.Count() != len(ids) {
		t.Errorf("%d records of %d ids consumed, want %d of %d", c.Count(), len(n), len(ids), len(ids))
	}
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 60*time.Second)
}
