package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestSnapshotOrder: where the application serialises an aggregate's
// writes, the initial snapshot publishes the aggregate's events in the order
// they were written, although the transaction that wrote second began first
// (so its created_at, the time it began, is the earlier one). Per aggregate:
// T1 begins; T2 begins, writes events 1 and 2, commits; T1 then writes
// events 3 and 4 and commits. Once with the sequence column of
// sql/variants/outbox_snapshot_order.sql, once with track_commit_timestamp.
func TestSnapshotOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings map[string]string
		variant  bool
	}{
		{name: "sequence-column", variant: true},
		{name: "commit-timestamp", settings: map[string]string{"track_commit_timestamp": "on"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: tc.settings})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			if tc.variant {
				if err := pg.Psql("outbox", "-f", testenv.RepoRoot()+"/sql/variants/outbox_snapshot_order.sql"); err != nil {
					t.Fatal(err)
				}
			}
			aggType := uniqueType("sorder")
			c1, c2 := pg.Conn(t, "outbox"), pg.Conn(t, "outbox")
			var want []testenv.Event
			for a := 0; a < 10; a++ {
				agg := fmt.Sprintf("agg-%d", a)
				ev := func(seq int) testenv.Event {
					return testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Ordered", Seq: seq, Payload: fmt.Sprintf(`{"seq": %d}`, seq)}
				}
				t1, err := c1.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// T1 takes its snapshot and start time now.
				if _, err := t1.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond)
				t2, err := c2.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range []testenv.Event{ev(1), ev(2)} {
					if _, err := t2.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`, e.ID, e.AggType, e.AggID, e.Type, e.Payload); err != nil {
						t.Fatal(err)
					}
					want = append(want, e)
				}
				if err := t2.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				for _, e := range []testenv.Event{ev(3), ev(4)} {
					if _, err := t1.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`, e.ID, e.AggType, e.AggID, e.Type, e.Payload); err != nil {
						t.Fatal(err)
					}
					want = append(want, e)
				}
				if err := t1.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var inverted int
			if err := c1.QueryRow(ctx, `SELECT count(*) FROM outbox a JOIN outbox b USING (aggregateid)
				WHERE (a.payload->>'seq')::int < (b.payload->>'seq')::int AND a.created_at > b.created_at`).Scan(&inverted); err != nil {
				t.Fatal(err)
			}
			if inverted == 0 {
				t.Fatal("created_at is in write order for every aggregate: the test proves nothing")
			}
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
			run.waitStreaming(t)
			c.WaitFor(t, want, 60*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			if dups := c.Verify(t, want); dups != 0 {
				t.Errorf("%d duplicates", dups)
			}
			t.Logf("%d snapshot events over 10 aggregates in write order (%d pairs whose created_at is inverted)", len(want), inverted)
		})
	}
}

// TestSnapshotOrderInTransaction: one transaction's events of an aggregate
// come out of the snapshot in the order its statements wrote them, although
// a later statement's row lies on an earlier page: the table's free space
// (left by a transaction that rolled back, freed by VACUUM while this one
// is open) is reused once the page this transaction was filling is full.
// Some of its rows are written in a savepoint. On the table of sql/ with neither a sequence column nor commit
// timestamps (the order CI once saw broken by the step-fault test's
// rollbacks), and with commit timestamps.
func TestSnapshotOrderInTransaction(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings map[string]string
	}{
		{name: "created-at"},
		{name: "commit-timestamp", settings: map[string]string{"track_commit_timestamp": "on"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: tc.settings})
			brokers := testenv.SharedKafka(t)
			ctx := context.Background()
			aggType := uniqueType("txorder")
			c1, c2 := pg.Conn(t, "outbox"), pg.Conn(t, "outbox")
			insert := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`
			// Pages of rows that roll back, then a committed row after
			// them (VACUUM would otherwise truncate the empty pages).
			if _, err := c2.Exec(ctx, `BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
				SELECT gen_random_uuid(), 'rolledback', 'x', 'Gone', '{}' FROM generate_series(1, 2000); ROLLBACK`); err != nil {
				t.Fatal(err)
			}
			var want []testenv.Event
			seq := map[string]int{}
			write := func(tx pgx.Tx, n int) {
				for i := 0; i < n; i++ {
					agg := fmt.Sprintf("agg-%d", i%5)
					seq[agg]++
					e := testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Ordered", Seq: seq[agg], Payload: fmt.Sprintf(`{"seq": %d}`, seq[agg])}
					if _, err := tx.Exec(ctx, insert, e.ID, e.AggType, e.AggID, e.Type, e.Payload); err != nil {
						t.Fatal(err)
					}
					want = append(want, e)
				}
			}
			tx, err := c1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			write(tx, 10)
			// A savepoint's rows have the subtransaction's xmin, larger
			// than the rows written before and after it: what an ORM's
			// nested transaction block writes.
			if _, err := tx.Exec(ctx, "SAVEPOINT nested"); err != nil {
				t.Fatal(err)
			}
			write(tx, 5)
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT nested"); err != nil {
				t.Fatal(err)
			}
			if _, err := c2.Exec(ctx, "VACUUM outbox"); err != nil {
				t.Fatal(err)
			}
			write(tx, 285)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var inverted int
			if err := c1.QueryRow(ctx, `SELECT count(*) FROM outbox a JOIN outbox b USING (aggregateid)
				WHERE a.aggregatetype = $1 AND b.aggregatetype = $1
				  AND (a.payload->>'seq')::int < (b.payload->>'seq')::int AND a.ctid > b.ctid`, aggType).Scan(&inverted); err != nil {
				t.Fatal(err)
			}
			if inverted == 0 {
				t.Fatal("the physical order is the write order for every aggregate: the test proves nothing")
			}
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			run := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
			run.waitStreaming(t)
			c.WaitFor(t, want, 60*time.Second)
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			if dups := c.Verify(t, want); dups != 0 {
				t.Errorf("%d duplicates", dups)
			}
			if t.Failed() {
				return
			}
			t.Logf("%d snapshot events of one transaction in write order (%d pairs whose physical order is inverted)", len(want), inverted)
		})
	}
}

// TestSnapshotOrderChoice: which order the snapshot takes for each shape of
// table, and whether it is exact.
func TestSnapshotOrderChoice(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range []string{
		"CREATE SCHEMA s",
		"CREATE TABLE s.identity (id int, created_at timestamptz, seq bigint GENERATED ALWAYS AS IDENTITY)",
		"CREATE TABLE s.serial (id int, n bigserial)",
		"CREATE TABLE s.cached (id int, created_at timestamptz, seq bigint GENERATED ALWAYS AS IDENTITY (CACHE 20))",
		"CREATE SEQUENCE s.free",
		"CREATE TABLE s.unowned (id int, created_at timestamptz, seq bigint DEFAULT nextval('s.free'))",
		"CREATE TABLE s.plain (id int, created_at timestamptz)",
		"CREATE TABLE s.bare (id int)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tc := range []struct {
		table, order string
		exact        bool
	}{
		{"identity", `"seq"`, true},
		{"serial", `"n"`, true},
		// A session takes 20 values at a time: a later write may get a
		// smaller one.
		{"cached", "created_at, cmin::text::bigint, ctid", false},
		// Not owned by the table: nothing says who else takes its values.
		{"unowned", "created_at, cmin::text::bigint, ctid", false},
		{"plain", "created_at, cmin::text::bigint, ctid", false},
		{"bare", "ctid", false},
	} {
		r := &Relay{schema: "s", table: tc.table}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		order, exact, err := r.snapshotOrder(ctx, tx)
		_ = tx.Rollback(ctx)
		if err != nil || order != tc.order || exact != tc.exact {
			t.Errorf("%s: order %q exact %v (%v), want %q %v", tc.table, order, exact, err, tc.order, tc.exact)
		}
	}
}
