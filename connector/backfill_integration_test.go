package main

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestBackfill: 30,000 rows (100,000 under make soak) of one aggregate type, streamed once by the
// running connector, are published again by connector backfill (that type,
// a time range) while the connector goes on streaming another type's
// events. The backfill prints its progress, is killed (kill -9) once it has
// published some, and the same command resumes it after the last batch
// Kafka acknowledged. Every backfilled event is in Kafka at least twice
// (the stream's and the backfill's, same id), at most one batch more; the
// streamed type's events are all delivered meanwhile.
func TestBackfill(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	suffix := time.Now().UnixNano() % 1e9
	old, live := fmt.Sprintf("bfold%d", suffix), fmt.Sprintf("bflive%d", suffix)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+old, "outbox.event."+live)
	env := connectorEnv(pg, brokers)
	p := testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=streaming", 60*time.Second)

	from := time.Now().Add(-time.Second).UTC()
	n := 30_000
	if os.Getenv("OUTBOX_SOAK") == "1" {
		n = 100_000
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'agg-' || (g % 100), 'Backfilled', jsonb_build_object('n', g) FROM generate_series(1, $2) g`, old, n); err != nil {
		t.Fatal(err)
	}
	waitDistinct(t, c, old, n, 2*time.Minute)
	load := testenv.StartLoad(t, pg.DSN("outbox"), live, 20, 2*time.Millisecond)

	// No -to: the first run fixes the end of the range at its start, and
	// the same command resumes that run.
	args := []string{"backfill", "-from", from.Format(time.RFC3339Nano), "-aggregate-type", old, "-batch", "500"}
	b1 := testenv.StartProc(t, bin, env, args...)
	// Killed once the run has recorded more than 5000 rows done, read from
	// its table: the printed progress comes every few seconds, and in CI
	// its first line came at 27,500 of 30,000, so that the run finished
	// before the kill and the second one had nothing to resume.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var done int64
		if err := conn.QueryRow(ctx, "SELECT done FROM outbox_backfill").Scan(&done); err == nil && done > 5000 {
			break
		}
		if b1.Exited() || time.Now().After(deadline) {
			t.Fatalf("the backfill recorded no progress past 5000 rows (exited %v):\n%s", b1.Exited(), tail(b1.Output()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Duration(rand.Intn(300)) * time.Millisecond)
	b1.Signal(syscall.SIGKILL)
	b1.Wait(t, 10*time.Second)
	var doneAtKill int64
	if err := conn.QueryRow(ctx, "SELECT done FROM outbox_backfill").Scan(&doneAtKill); err != nil {
		t.Fatal(err)
	}

	b2 := testenv.StartProc(t, bin, env, args...)
	if code := b2.Wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("the resumed backfill exited %d:\n%s", code, tail(b2.Output()))
	}
	if !strings.Contains(b2.Output(), "resuming backfill") || !strings.Contains(b2.Output(), fmt.Sprintf("%d of %d rows (100.0%%)", n, n)) {
		t.Fatalf("the second run did not resume and finish:\n%s", tail(b2.Output()))
	}
	want := load.Halt()
	c.WaitFor(t, want, 2*time.Minute)
	// Every backfilled event twice: wait until the topic holds them all.
	var counts map[string]int
	eventually := time.Now().Add(2 * time.Minute)
	for {
		counts = map[string]int{}
		for _, r := range c.Records() {
			if r.Topic == "outbox.event."+old {
				counts[testenv.Header(r, "id")]++
			}
		}
		twice := 0
		for _, k := range counts {
			if k >= 2 {
				twice++
			}
		}
		if twice == n {
			break
		}
		if time.Now().After(eventually) {
			t.Fatalf("%d of %d backfilled events are in Kafka twice", twice, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	extra := 0
	for _, k := range counts {
		extra += k - 2
	}
	if extra > 500 {
		t.Errorf("%d records beyond two per event: the resumed run repeated more than one batch", extra)
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Errorf("connector exit code %d", code)
	}
	dups := c.Verify(t, want)
	var progress []string
	re := regexp.MustCompile(`: (\d+) of (\d+) rows`)
	for _, l := range strings.Split(b1.Output()+b2.Output(), "\n") {
		if re.MatchString(l) {
			progress = append(progress, l)
		}
	}
	t.Logf("backfill of %d rows while streaming: killed at %d recorded done, resumed; %d records beyond two per event; %d live events delivered (%d duplicates). Progress lines: %d, last: %s",
		n, doneAtKill, extra, len(want), dups, len(progress), progress[len(progress)-1])
}

// waitDistinct waits until c consumed n distinct events of aggType.
func waitDistinct(t *testing.T, c *testenv.Consumer, aggType string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.Records() {
			if r.Topic == "outbox.event."+aggType {
				seen[testenv.Header(r, "id")] = true
			}
		}
		if len(seen) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events of %s consumed within %s", len(seen), n, aggType, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// backfillOnce runs connector backfill to its end and returns its exit code
// and output.
func backfillOnce(t testing.TB, bin string, env map[string]string, args ...string) (int, string) {
	t.Helper()
	p := testenv.StartProc(t, bin, env, append([]string{"backfill"}, args...)...)
	code := p.Wait(t, 2*time.Minute)
	return code, p.Output()
}

// backfillState is a run's progress row and its rows recorded failed (id:
// reason).
func backfillState(t testing.TB, conn *pgx.Conn) (done, failed int64, finished bool, rows map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := conn.QueryRow(ctx, "SELECT done, failed, finished_at IS NOT NULL FROM outbox_backfill").Scan(&done, &failed, &finished); err != nil {
		t.Fatalf("the backfill's progress row: %v", err)
	}
	rows = map[string]string{}
	r, err := conn.Query(ctx, "SELECT id, reason FROM outbox_backfill_failed")
	if err != nil {
		t.Fatalf("the backfill's failed rows: %v", err)
	}
	defer r.Close()
	for r.Next() {
		var id, reason string
		if err := r.Scan(&id, &reason); err != nil {
			t.Fatal(err)
		}
		rows[id] = reason
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return done, failed, finished, rows
}

// insertEvents writes n events of aggType and returns their ids.
func insertEvents(t testing.TB, conn *pgx.Conn, aggType string, n int) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'agg-' || (g % 7), 'Backfilled', jsonb_build_object('n', g) FROM generate_series(1, $2) g RETURNING id::text`, aggType, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitIDs waits until c consumed every one of ids on topic.
func waitIDs(t testing.TB, c *testenv.Consumer, topic string, ids []string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.Records() {
			if r.Topic == topic {
				seen[testenv.Header(r, "id")] = true
			}
		}
		var missing []string
		for _, id := range ids {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events missing from %s after %s, e.g. %s", len(missing), len(ids), topic, timeout, missing[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBackfillRetriesRegistry: routing that fails because of the schema
// registry (Avro; a registry answering 503) is retried, never counted
// failed. A run stopped (SIGTERM) while the registry is down has recorded
// nothing past the row; once the registry answers again (after refusing
// twice more), the same command publishes every row and finishes with 0
// failed. A registry down for longer than -retry-for stops the run
// unfinished, again with nothing recorded past the row.
func TestBackfillRetriesRegistry(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("bfreg%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType

	reg := srfake.New()
	t.Cleanup(reg.Close)
	var down atomic.Bool
	var refuse, refused atomic.Int32
	reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, aggType) || !down.Load() && refuse.Add(-1) < 0 {
			return false
		}
		refused.Add(1)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error_code":50003,"message":"injected: registry unavailable"}`))
		return true
	})
	env := connectorEnv(pg, brokers, "OUTBOX_ROUTE_VALUE_FORMAT", "avro", "OUTBOX_ROUTE_REGISTRY_URL", reg.URL())
	c := testenv.StartConsumer(t, brokers, topic)
	from := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	ids := insertEvents(t, conn, aggType, 40)
	args := []string{"backfill", "-from", from, "-aggregate-type", aggType, "-batch", "10"}
	unharmed := func(when string, out string) {
		t.Helper()
		if done, failed, finished, rows := backfillState(t, conn); done != 0 || failed != 0 || finished || len(rows) != 0 {
			t.Fatalf("%s: done %d, failed %d, finished %v, %d rows recorded failed; want 0, 0, false, 0: a passing failure made a hole\n%s",
				when, done, failed, finished, len(rows), tail(out))
		}
	}

	down.Store(true)
	p := testenv.StartProc(t, bin, env, args...)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(p.Output(), "routing needs the schema registry, which failed; retrying"); time.Sleep(20 * time.Millisecond) {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("with the registry down, the backfill did not wait retrying (exited %v):\n%s", p.Exited(), tail(p.Output()))
		}
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code == 0 {
		t.Fatalf("stopped while retrying: exit 0; want 1:\n%s", tail(p.Output()))
	}
	unharmed("stopped while the registry was down", p.Output())

	down.Store(false)
	refused.Store(0)
	refuse.Store(2)
	code, out := backfillOnce(t, bin, env, args[1:]...)
	if code != 0 || !strings.Contains(out, "40 of 40 rows (100.0%)") || !strings.Contains(out, "0 failed; done") {
		t.Fatalf("with the registry refusing twice, then answering: exit %d, want 0 and 40 of 40 rows, 0 failed; done:\n%s", code, tail(out))
	}
	if n := refused.Load(); n < 2 {
		t.Fatalf("the registry refused %d requests; want 2 (the test injected nothing)", n)
	}
	if done, failed, finished, rows := backfillState(t, conn); done != 40 || failed != 0 || !finished || len(rows) != 0 {
		t.Fatalf("done %d, failed %d, finished %v, %d rows recorded failed; want 40, 0, true, 0", done, failed, finished, len(rows))
	}
	waitIDs(t, c, topic, ids, time.Minute)

	// -retry-for: a run of its own (the first is finished).
	if _, err := conn.Exec(context.Background(), "DELETE FROM outbox_backfill"); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	code, out = backfillOnce(t, bin, env, append(args[1:], "-retry-for", "1s")...)
	if code != 1 || !strings.Contains(out, "retried for 1s (-retry-for), and it still fails") {
		t.Fatalf("with the registry down past -retry-for 1s: exit %d; want 1, saying so:\n%s", code, tail(out))
	}
	unharmed("with the registry down past -retry-for", out)
}

// TestBackfillFailedRows: a row that cannot be published as it is (its
// aggregate type is no legal topic name) is recorded in
// outbox_backfill_failed with its id and why, the others are published,
// and the run exits 1 saying how many failed and where, never a plain
// "done". Started again, the finished run says so again, and how to retry
// them; with the row fixed, -retry-failed publishes exactly it. As
// outbox_connector (sql/005_roles.sql), whose grants it needs.
func TestBackfillFailedRows(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("bffail%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType
	env := connectorEnv(pg, brokers, "OUTBOX_PG_DSN", pg.DSNUser("outbox", "outbox_connector"))
	c := testenv.StartConsumer(t, brokers, topic)
	from := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	ids := insertEvents(t, conn, aggType, 20)
	badID := insertEvents(t, conn, "bad type!"+aggType, 1)[0]
	ids = append(ids, insertEvents(t, conn, aggType, 20)...)
	args := []string{"-from", from, "-batch", "7", "-name", "bf-failed"}

	code, out := backfillOnce(t, bin, env, args...)
	if code != 1 || !strings.Contains(out, "41 of 41 rows (100.0%)") || !strings.Contains(out, "1 failed; finished, but 1 not published") ||
		!strings.Contains(out, "outbox_backfill_failed") || !strings.Contains(out, "-retry-failed") || strings.Contains(out, "failed; done") {
		t.Fatalf("first run: exit %d; want 1, saying 1 row failed, where, and how to retry it:\n%s", code, tail(out))
	}
	done, failed, finished, rows := backfillState(t, conn)
	if done != 40 || failed != 1 || !finished || len(rows) != 1 || !strings.Contains(rows[badID], "invalid-topic") {
		t.Fatalf("after the first run: done %d, failed %d, finished %v, failed rows %q; want 40, 1, true, {%s: invalid-topic …}", done, failed, finished, rows, badID)
	}
	waitIDs(t, c, topic, ids, time.Minute)

	code, out = backfillOnce(t, bin, env, args...)
	if code != 1 || !strings.Contains(out, "already finished, with 40 of 41 rows published and 1 NOT published") || !strings.Contains(out, "-retry-failed") {
		t.Fatalf("run again: exit %d; want 1, saying the run finished with 1 row not published, and how to retry it:\n%s", code, tail(out))
	}

	if _, err := conn.Exec(ctx, "UPDATE outbox SET aggregatetype = $1 WHERE id = $2", aggType, badID); err != nil {
		t.Fatal(err)
	}
	before := len(c.Records())
	code, out = backfillOnce(t, bin, env, append(args, "-retry-failed")...)
	if code != 0 || !strings.Contains(out, "-retry-failed: 1 published, 0 still failed") || !strings.Contains(out, "already finished (41 of 41 rows)") {
		t.Fatalf("-retry-failed: exit %d; want 0, the failed row published:\n%s", code, tail(out))
	}
	if done, failed, _, rows := backfillState(t, conn); done != 41 || failed != 0 || len(rows) != 0 {
		t.Fatalf("after -retry-failed: done %d, failed %d, failed rows %q; want 41, 0, none", done, failed, rows)
	}
	waitIDs(t, c, topic, []string{badID}, time.Minute)
	time.Sleep(time.Second)
	if n := len(c.Records()) - before; n != 1 {
		t.Errorf("-retry-failed published %d records; want exactly the failed one", n)
	}
}

// TestBackfillHeadersCountInSize: a record under
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES by its key and value but over it with its
// headers (the payload placed in a header too) is measured as the producer
// measures it: recorded failed as too large, never offered to Kafka, whose
// refusal would stop every run at its batch; the others are published.
func TestBackfillHeadersCountInSize(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("bfsize%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType
	env := connectorEnv(pg, brokers, "OUTBOX_KAFKA_MAX_MESSAGE_BYTES", "200000",
		"OUTBOX_ROUTE_FIELDS_ADDITIONAL_PLACEMENT", "payload:header:payloadCopy")
	c := testenv.StartConsumer(t, brokers, topic)
	from := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	ids := insertEvents(t, conn, aggType, 10)
	var bigID string
	// About 120 kB of value, and as much again in the header.
	if err := conn.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), $1, 'agg-big', 'Big', jsonb_build_object('pad', repeat('z', 120000))) RETURNING id::text`, aggType).Scan(&bigID); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, insertEvents(t, conn, aggType, 10)...)

	code, out := backfillOnce(t, bin, env, "-from", from, "-aggregate-type", aggType, "-batch", "100")
	if code != 1 || !strings.Contains(out, "21 of 21 rows (100.0%)") || !strings.Contains(out, "1 failed; finished") {
		t.Fatalf("exit %d; want 1, with 21 of 21 rows and 1 failed (the record too large with its headers):\n%s", code, tail(out))
	}
	if done, failed, finished, rows := backfillState(t, conn); done != 20 || failed != 1 || !finished || !strings.Contains(rows[bigID], "record-too-large") {
		t.Fatalf("done %d, failed %d, finished %v, failed rows %q; want 20, 1, true, {%s: record-too-large …}", done, failed, finished, rows, bigID)
	}
	waitIDs(t, c, topic, ids, time.Minute)
}

// TestBackfillRowSecurity: a policy that hides rows of the outbox table
// from the backfill's role (row-level security, the role neither owner nor
// BYPASSRLS) makes the backfill refuse, naming the fix, before it reads or
// records anything: it would have skipped the hidden rows and called itself
// done. With BYPASSRLS granted, it publishes every row.
func TestBackfillRowSecurity(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("bfrls%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType
	for _, q := range []string{
		"ALTER TABLE outbox ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY only_even ON outbox FOR SELECT TO outbox_connector USING ((payload->>'n')::int % 2 = 0)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	env := connectorEnv(pg, brokers, "OUTBOX_PG_DSN", pg.DSNUser("outbox", "outbox_connector"))
	c := testenv.StartConsumer(t, brokers, topic)
	from := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	ids := insertEvents(t, conn, aggType, 10)
	args := []string{"-from", from, "-aggregate-type", aggType}

	code, out := backfillOnce(t, bin, env, args...)
	if code == 0 || !strings.Contains(out, "BYPASSRLS") {
		t.Fatalf("under a policy hiding half the rows: exit %d; want a refusal naming BYPASSRLS:\n%s", code, tail(out))
	}
	var runs int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox_backfill").Scan(&runs); err != nil || runs != 0 {
		t.Fatalf("the refused backfill recorded %d runs (%v); want none", runs, err)
	}

	if _, err := conn.Exec(ctx, "ALTER ROLE outbox_connector BYPASSRLS"); err != nil {
		t.Fatal(err)
	}
	code, out = backfillOnce(t, bin, env, args...)
	if code != 0 || !strings.Contains(out, "10 of 10 rows (100.0%)") {
		t.Fatalf("with BYPASSRLS: exit %d; want 0 and 10 of 10 rows:\n%s", code, tail(out))
	}
	waitIDs(t, c, topic, ids, time.Minute)
}
