package partition_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox/partition"
)

// pollPartitionedPostgres starts PostgreSQL 17 (the first major with an
// identity column on a partitioned table) with the partitioned outbox
// prepared for the poll relay by sql/variants/outbox_poll.sql.
func pollPartitionedPostgres(t *testing.T) *testenv.Postgres {
	t.Helper()
	bin, err := testenv.PGVersionBinDir(17)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL 17: %v", err)
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{NoSchema: true, BinDir: bin})
	root := testenv.RepoRoot()
	for _, f := range []string{"variants/outbox_partitioned.sql", "003_dead_letter.sql", "variants/outbox_poll.sql"} {
		if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", filepath.Join(root, "sql", f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return pg
}

// createDay makes the partition of day, as an earlier maintenance run would
// have.
func createDay(t testing.TB, conn *pgx.Conn, day time.Time) string {
	t.Helper()
	name := partition.Name("outbox", day)
	if _, err := conn.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`,
		name, day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	return name
}

// waitingFor waits until the backend pid waits for a lock, and returns
// what it waits for.
func waitingFor(t testing.TB, conn *pgx.Conn, pid uint32, within time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(2 * time.Millisecond) {
		var what string
		err := conn.QueryRow(context.Background(), `SELECT coalesce(relation::regclass::text, locktype) || ' ' || mode
			FROM pg_locks WHERE pid = $1 AND NOT granted LIMIT 1`, int32(pid)).Scan(&what)
		if err == nil {
			return what
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited for a lock within %s", pid, within)
		}
	}
}

// TestMaintainKeepsRowCommittedDuringDrop (issue 35, item 4): on an outbox
// prepared for the poll relay, an expired partition holding an unpublished
// row must be kept, whenever that row commits. Here a writer holds an
// uncommitted insert of an unpublished row dated in the expired day while
// Maintain runs, and commits it the moment Maintain waits for a lock: a
// check for unpublished rows made before that wait (outside the drop's
// transaction) saw none, and the drop that follows would take the row with
// it. The check must be made under a lock that keeps rows from coming in.
func TestMaintainKeepsRowCommittedDuringDrop(t *testing.T) {
	pg := pollPartitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	today := time.Now().UTC().Truncate(24 * time.Hour)
	old := createDay(t, conn, today.AddDate(0, 0, -5))

	inserter := pg.Conn(t, "outbox")
	tx, err := inserter.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	id := uuid.NewString()
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		VALUES ($1, 'Order', 'o-1', 'Placed', '{}', $2)`, id, today.AddDate(0, 0, -5).Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	maint := pg.Conn(t, "outbox")
	type result struct {
		res partition.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Ahead 1: today's and tomorrow's partitions come with the schema,
		// so the drop is the only step that takes a lock.
		res, err := partition.Maintain(ctx, maint, partition.Config{Retention: 48 * time.Hour, Ahead: 1})
		done <- result{res, err}
	}()
	what := waitingFor(t, conn, maint.PgConn().PID(), 10*time.Second)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	t.Logf("maintenance waited for %s; the row committed then; maintain: dropped %v, err %v", what, r.res.Dropped, r.err)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || slices.Contains(r.res.Dropped, old) {
		t.Fatalf("the unpublished row committed while maintenance ran: %d left, %s dropped: %v; want the row kept with its partition", n, old, r.res.Dropped)
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "keep "+old) || !strings.Contains(r.err.Error(), "published_at NULL") {
		t.Errorf("err = %v; want %s kept for its unpublished row, and said so", r.err, old)
	}
}

// maxWriterWaitBound is the longest an outbox INSERT may wait while
// maintenance tries to lock what a long reader holds: a writer queues
// behind a lock request of maintenance for at most one attempt (its 50 ms
// lock_timeout), plus the DDL's own moment once granted; the rest of 200 ms
// is headroom for this machine (2 shared cores, -race), where an
// uncontended INSERT itself takes up to a few tens of milliseconds.
const maxWriterWaitBound = 200 * time.Millisecond

// TestMaintainDoesNotQueueWriters (issue 35, item 16): a long transaction
// that read the outbox (slotwatch's audit snapshot, a session idle in
// transaction) holds ACCESS SHARE on it until it ends. Maintenance's
// ACCESS EXCLUSIVE requests (the parent for a drop, the DEFAULT partition
// for a create) wait behind it, and every writer that comes after queues
// behind the request: with one long wait per request, each INSERT waited
// the whole LockTimeout. Requests of a few tens of milliseconds, retried
// within LockTimeout, keep each INSERT's wait under maxWriterWaitBound;
// the step fails for the run naming the blocker, and the next run, once
// the reader ended, does it.
//
// Two readers: one of the whole outbox (it holds every partition, the
// expired one and DEFAULT included, so the drop waits for the expired
// partition and the create for DEFAULT) and one of today's rows alone
// (pruned to today's partition: the drop gets the expired partition and
// waits for the parent).
func TestMaintainDoesNotQueueWriters(t *testing.T) {
	pg := partitionedPostgres(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	today := time.Now().UTC().Truncate(24 * time.Hour)

	// DETACH PARTITION ... CONCURRENTLY takes only SHARE UPDATE EXCLUSIVE
	// on the parent, which writers do not wait for, but PostgreSQL refuses
	// it on a table with a DEFAULT partition, as the partitioned variant
	// has: maintenance cannot use it (see dropExpired).
	probe := createDay(t, conn, today.AddDate(0, 0, -30))
	_, err := conn.Exec(ctx, `ALTER TABLE outbox DETACH PARTITION `+probe+` CONCURRENTLY`)
	t.Logf("DETACH PARTITION CONCURRENTLY with a DEFAULT partition: %v", err)
	if err == nil {
		t.Errorf("DETACH PARTITION CONCURRENTLY worked on a table with a DEFAULT partition; dropExpired's comment is out of date")
	}
	if _, err := conn.Exec(ctx, `DROP TABLE `+probe); err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name   string
		reader string
	}{
		{"a reader of the whole outbox", `SELECT id FROM outbox LIMIT 1`},
		{"a reader of today's rows", fmt.Sprintf(`SELECT id FROM outbox WHERE created_at >= '%s' AND created_at < '%s' LIMIT 1`,
			today.Format(time.RFC3339), today.AddDate(0, 0, 1).Format(time.RFC3339))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := createDay(t, conn, today.AddDate(0, 0, -5-i))
			insertAt(t, conn, today.Add(time.Hour), 10)
			cfg := partition.Config{Retention: 48 * time.Hour, Ahead: 2 + i} // a day to create: its DEFAULT lock too

			reader := pg.Conn(t, "outbox")
			rtx, err := reader.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer rtx.Rollback(ctx) //nolint:errcheck // ended below
			if _, err := rtx.Exec(ctx, tc.reader); err != nil {
				t.Fatal(err)
			}

			// The writer puts rows of today (their partition exists) and
			// of a day 10 days ahead (none: DEFAULT) while maintenance runs.
			writer := pg.Conn(t, "outbox")
			stop := make(chan struct{})
			var (
				wg      sync.WaitGroup
				maxWait time.Duration
				slowest string
				writes  int
				werr    error
			)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; ; k++ {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					at, kind := time.Now(), "today"
					if k%2 == 1 {
						at, kind = today.AddDate(0, 0, 10), "a day without partition"
					}
					start := time.Now()
					_, err := writer.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
						VALUES (gen_random_uuid(), 'Order', 'o-w', 'Placed', '{}', $1)`, at)
					took := time.Since(start)
					if err != nil {
						werr = err
						return
					}
					writes++
					if took > maxWait {
						maxWait, slowest = took, kind
					}
				}
			}()
			start := time.Now()
			res, err := partition.Maintain(ctx, pg.Conn(t, "outbox"), cfg)
			ran := time.Since(start)
			close(stop)
			wg.Wait()
			if werr != nil {
				t.Fatalf("writer: %v", werr)
			}
			t.Logf("with %s open: maintenance ran %s (created %v, dropped %v, err %v); %d INSERTs, the longest waited %s (a row of %s)",
				tc.name, ran.Round(time.Millisecond), res.Created, res.Dropped, err, writes, maxWait.Round(time.Millisecond), slowest)
			if maxWait > maxWriterWaitBound {
				t.Errorf("an INSERT waited %s behind maintenance (a row of %s); want under %s", maxWait.Round(time.Millisecond), slowest, maxWriterWaitBound)
			}
			var pgErr *pgconn.PgError
			if slices.Contains(res.Dropped, old) || err == nil || !strings.Contains(err.Error(), "drop "+old) ||
				!strings.Contains(err.Error(), "a long transaction on the outbox") || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Errorf("dropped %v, err %v; want the drop of %s failed for this run, naming a long transaction on the outbox (55P03)", res.Dropped, err, old)
			}

			// The reader ends: the next run drops the partition.
			if err := rtx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			res, err = partition.Maintain(ctx, conn, cfg)
			if err != nil || !slices.Contains(res.Dropped, old) {
				t.Errorf("once the reader ended: dropped %v, created %v, err %v; want %s dropped", res.Dropped, res.Created, err, old)
			}
		})
	}
}
