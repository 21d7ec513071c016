package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// watchRole gives outbox_watch (sql/006_watch.sql) a password and returns
// its DSN: the end-to-end tests run the canary and the audit with the
// least privilege the docs give them.
func watchRole(t testing.TB, pg *testenv.Postgres) string {
	t.Helper()
	pw := "watch-" + uuid.NewString()
	if _, err := pg.Conn(t, "outbox").Exec(context.Background(), fmt.Sprintf("ALTER ROLE outbox_watch PASSWORD '%s'", pw)); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://outbox_watch:%s@127.0.0.1:%d/outbox?sslmode=disable", pw, pg.Port)
}

func watchPG(t testing.TB) *testenv.Postgres {
	return testenv.StartPostgres(t, testenv.PGOptions{HBA: []string{"host all outbox_watch 127.0.0.1/32 scram-sha-256"}})
}

func startConnector(t testing.TB, pg *testenv.Postgres, brokers string, extra ...string) *testenv.Proc {
	t.Helper()
	env := map[string]string{
		"OUTBOX_PG_DSN":           pg.DSN("outbox"),
		"OUTBOX_KAFKA_BROKERS":    brokers,
		"OUTBOX_HTTP_ADDR":        "127.0.0.1:0",
		"OUTBOX_STATUS_INTERVAL":  "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	p := testenv.StartProc(t, testenv.Binary(t, "connector"), env)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.Output(), "msg=streaming") {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("connector never streamed (exited=%v):\n%s", p.Exited(), tailString(p.Output(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// TestCanaryStall: slotwatch's canary goes through the real connector and
// broker; freezing the connector with SIGSTOP fires PipelineStalled within
// SLOTWATCH_CANARY_TIMEOUT + 2 intervals, SIGCONT resolves it, and the
// canary's latency histogram agrees with the latency the test measures for
// its own events over the same path.
func TestCanaryStall(t *testing.T) {
	// The server stamps each commit (pg_xact_commit_timestamp): the test
	// times the canaries from their commit without slotwatch's word.
	pg := testenv.StartPostgres(t, testenv.PGOptions{HBA: []string{"host all outbox_watch 127.0.0.1/32 scram-sha-256"},
		Settings: map[string]string{"track_commit_timestamp": "on"}})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("lat%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType
	// Create the test's topic before measuring: the first event's latency
	// would include the topic's creation.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'w', 'Warm', '{}')`, uuid.New(), aggType); err != nil {
		t.Fatal(err)
	}
	p := startConnector(t, pg, brokers)

	hook := newHook(t)
	const interval, timeout = time.Second, 5 * time.Second
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":            pg.DSN("outbox"),
		"SLOTWATCH_INTERVAL":          "1s",
		"SLOTWATCH_OUTBOX_DSN":        watchRole(t, pg),
		"SLOTWATCH_CANARY_INTERVAL":   interval.String(),
		"SLOTWATCH_CANARY_TIMEOUT":    timeout.String(),
		"SLOTWATCH_AUDIT_INTERVAL":    "0",
		"SLOTWATCH_ALERT_WEBHOOK_URL": hook.srv.URL,
		"OUTBOX_KAFKA_BROKERS":        brokers,
	})

	// The test's own events, one a second like the canary's, each one
	// statement in its own transaction as the canary's is (an explicit
	// BEGIN … COMMIT read 0.6 to 1 ms faster through the pipeline, and the
	// canary 25% above it), timed from the commit to the record arriving
	// at a read_committed consumer. The consumer also reads the canary
	// topic, to time the canaries themselves.
	// Arrival times are kept by id and matched with commit times at the
	// end: a record may arrive before the test has noted its commit.
	var mu sync.Mutex
	committed := map[string]time.Time{}
	arrived := map[string]time.Time{}
	// One consumer per topic, each on its own goroutine, as slotwatch's
	// canary reader is: one client reading both topics timed the canaries
	// 1 to 1.5 ms (10 to 15%) later than slotwatch did.
	cctx, stopConsumer := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, tp := range []string{topic, "outbox.event.__canary"} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(tp), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(time.Second), kgo.MetadataMinAge(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for cctx.Err() == nil {
				fs := cl.PollFetches(cctx)
				now := time.Now()
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					if id := testenv.Header(r, "id"); arrived[id].IsZero() {
						arrived[id] = now
					}
					mu.Unlock()
				})
			}
		}()
	}
	t.Cleanup(func() { stopConsumer(); wg.Wait() })

	// Let the canary settle, then sample both for 30 s.
	eventually(t, 60*time.Second, func() (bool, string) {
		v, _ := sw.metric(t, "slotwatch_canary_received_total", nil)
		return v >= 3, fmt.Sprintf("%v canaries received", v)
	})
	hist := func() (count, sum float64) {
		h := sw.scrape(t)["slotwatch_canary_latency_seconds"].GetMetric()[0].GetHistogram()
		return float64(h.GetSampleCount()), h.GetSampleSum()
	}
	countBefore, sumBefore := hist()
	logBefore := len(sw.log.String())
	const samples = 30
	for i := 0; i < samples; i++ {
		id := uuid.New()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'a', 'T', '{}')`, id, aggType); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		committed[id.String()] = time.Now()
		mu.Unlock()
		time.Sleep(time.Second)
	}
	var lat []float64
	eventually(t, 30*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		lat = lat[:0]
		for id, at := range committed {
			if got, ok := arrived[id]; ok {
				lat = append(lat, got.Sub(at).Seconds())
			}
		}
		return len(lat) == samples, fmt.Sprintf("%d of %d own events timed", len(lat), samples)
	})
	// The same events from the commit time the server stamped: a client
	// notes a commit's return late by however long its goroutine waits
	// for a core, up to 7 ms on two busy cores, which made the test's own
	// figure read low by as much as it made the canary's.
	var own []float64
	for id := range committed {
		var srv time.Time
		if err := conn.QueryRow(ctx, `SELECT pg_xact_commit_timestamp(xmin) FROM outbox WHERE id = $1`, id).Scan(&srv); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		own = append(own, arrived[id].Sub(srv).Seconds())
		mu.Unlock()
	}
	countAfter, sumAfter := hist()
	window := sw.log.String()[logBefore:]
	if countAfter-countBefore < samples/2 {
		t.Fatalf("only %v canaries timed in %d s", countAfter-countBefore, samples)
	}
	// The canaries' own latencies, as slotwatch logged them beside each
	// observation of the histogram: the histogram holds these (its mean
	// is theirs), and their median is compared with the test's. Medians,
	// not means: at a few milliseconds, one pause of a busy machine in 20
	// samples moved a mean by 40% (7.0 against 5.0 ms in CI).
	var canary []float64
	// The same canaries as the test's consumer saw them: from the commit's
	// return as slotwatch noted it (the start its histogram times from, a
	// service's view of its commit), and from the commit time the server
	// stamped. The two starts differ by the commit's reply reaching
	// slotwatch's goroutine: 0.4 to 1.7 ms of 4 to 10 ms on two busy cores,
	// up to 17% of a median that way, so the gate times both from the same
	// start and holds the arrivals to each other; the server's figure is
	// logged, and each noted start is checked against the server's stamp.
	var seen, seenSrv []float64
	for _, m := range regexp.MustCompile(`msg="canary: read back" .*?id=(\S+) latency_seconds=(\S+) committed_at=(\S+)`).FindAllStringSubmatch(window, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		canary = append(canary, v)
		noted, err := time.Parse(time.RFC3339Nano, m[3])
		if err != nil {
			t.Fatal(err)
		}
		var srv time.Time
		if err := conn.QueryRow(ctx, `SELECT pg_xact_commit_timestamp(xmin) FROM outbox WHERE id = $1`, m[1]).Scan(&srv); err != nil {
			t.Fatal(err)
		}
		// Noted when the commit returned (or just before it was sent, if
		// the record came back first): around the server's stamp, never a
		// second away from it.
		if d := noted.Sub(srv); d < -time.Second || d > time.Second {
			t.Errorf("canary %s: slotwatch noted its commit at %s, the server stamped it %s", m[1], noted.Format(time.RFC3339Nano), srv.Format(time.RFC3339Nano))
		}
		mu.Lock()
		if got, ok := arrived[m[1]]; ok {
			seen = append(seen, got.Sub(noted).Seconds())
			seenSrv = append(seenSrv, got.Sub(srv).Seconds())
		}
		mu.Unlock()
	}
	histMean := (sumAfter - sumBefore) / (countAfter - countBefore)
	if len(canary) < samples/2 || len(seen) < samples/2 {
		t.Fatalf("only %d canaries logged in the window (%v in the histogram), %d of them seen by the test", len(canary), countAfter-countBefore, len(seen))
	}
	logMean := 0.0
	for _, v := range canary {
		logMean += v
	}
	logMean /= float64(len(canary))
	if math.Abs(histMean-logMean) > 0.05*logMean+0.0005 {
		t.Errorf("the histogram's mean %.2f ms over %v is not the logged canaries' %.2f ms over %d", histMean*1000, countAfter-countBefore, logMean*1000, len(canary))
	}
	canaryMedian, ownMedian, seenMedian := median(canary), median(own), median(seen)
	t.Logf("commit→consumer latency: canary median %.2f ms (histogram mean %.2f ms) over %d canaries; the test's consumer: the canaries %.2f ms over %d from their commit's return (%.2f ms from the server's commit stamps), its own events %.2f ms over %d from the server's stamps (%.2f ms from the commit's return)",
		canaryMedian*1000, histMean*1000, len(canary), seenMedian*1000, len(seen), median(seenSrv)*1000, ownMedian*1000, len(own), median(lat)*1000)
	// Within 20% of the same canaries as the test's consumer timed them:
	// the histogram must say what a consumer of the canary topic sees.
	// The test's own events are logged beside, not held to 20%: they take
	// the same path but not at the same moments, and on a shared CI runner
	// their median differed from the canaries' by 30% in either direction
	// from run to run (11.61 against 8.78 ms, the same canaries 13.31 ms
	// from the server's stamps).
	if d := math.Abs(canaryMedian - seenMedian); d > 0.2*seenMedian {
		t.Errorf("canary latency %.2f ms is not within 20%% of the same canaries as the test's consumer timed them: %.2f ms", canaryMedian*1000, seenMedian*1000)
	}
	// The gate above shares slotwatch's own start: were that start late
	// (noted after the commit had long returned), both figures would
	// shrink alike. So the canary figure is also held to the same
	// canaries timed from the server's commit stamps, a start slotwatch
	// does not choose: within 20%, plus 2 ms for the commit's reply to
	// reach slotwatch (0.4 to 1.7 ms seen on two busy cores), which only
	// ever makes slotwatch's figure the smaller.
	if srvMedian := median(seenSrv); canaryMedian < 0.8*srvMedian-0.002 || canaryMedian > 1.2*srvMedian {
		t.Errorf("canary latency %.2f ms is not within 20%% (and 2 ms for the commit's reply) of the same canaries timed from the server's commit stamps: %.2f ms", canaryMedian*1000, srvMedian*1000)
	}
	if hook.count("PipelineStalled", "", "firing") != 0 {
		t.Fatalf("PipelineStalled fired while the pipeline ran:\n%s", hook.summary())
	}

	// Freeze the connector.
	stopped := time.Now()
	p.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
	hook.waitFor(t, "PipelineStalled", "", "firing", timeout+2*interval+10*time.Second)
	fired := time.Since(stopped)
	t.Logf("PipelineStalled fired %s after SIGSTOP (timeout %s, interval %s)", fired.Round(10*time.Millisecond), timeout, interval)
	if fired > timeout+2*interval {
		t.Errorf("PipelineStalled fired %s after the connector froze; want within %s", fired, timeout+2*interval)
	}
	if age, _ := sw.metric(t, "slotwatch_canary_age_seconds", nil); age < timeout.Seconds() {
		t.Errorf("slotwatch_canary_age_seconds = %v while stalled; want > %v", age, timeout.Seconds())
	}
	thawed := time.Now()
	p.Signal(syscall.SIGCONT)
	hook.waitFor(t, "PipelineStalled", "", "resolved", time.Minute)
	t.Logf("PipelineStalled resolved %s after SIGCONT", time.Since(thawed).Round(10*time.Millisecond))

	// The canaries went in through outbox_write_canary (outbox_watch may
	// not INSERT into the outbox); their rows are the only ones it may
	// delete, and none younger than 10 minutes (TestWatchRoleGrants
	// deletes an old one).
	var canaries int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregatetype = '__canary' AND type = 'Canary'`).Scan(&canaries); err != nil || canaries == 0 {
		t.Errorf("canary rows in the outbox: %d, %v; want some", canaries, err)
	}
	wc, err := pgx.Connect(ctx, watchRole(t, pg))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close(ctx)
	if _, err := wc.Exec(ctx, `DELETE FROM outbox WHERE aggregatetype = $1`, aggType); err == nil {
		t.Error("outbox_watch deleted real events; want permission denied")
	}
	var deleted int64
	if err := wc.QueryRow(ctx, `SELECT outbox_delete_canaries('0 seconds')`).Scan(&deleted); err != nil || deleted != 0 {
		t.Errorf("outbox_delete_canaries('0 seconds'): %d, %v; want none of the canaries of the last minutes deleted", deleted, err)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregatetype <> '__canary'`).Scan(&left); err != nil || left != samples+1 {
		t.Errorf("real events left after the canary cleanup: %d, %v; want %d (the warm-up event and the samples)", left, err, samples+1)
	}
}

// TestWatchRoleGrants: outbox_watch, as sql/006_watch.sql leaves it,
// writes canaries only through outbox_write_canary (aggregate type
// __canary, whatever it is given), cannot insert any other row, read a
// payload, change or delete a real event, and outbox_delete_canaries keeps
// canaries younger than 10 minutes whatever interval it is passed.
func TestWatchRoleGrants(t *testing.T) {
	pg := watchPG(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	realID, oldCanary, freshCanary := uuid.New(), uuid.New(), uuid.New()
	execAll(t, pg, "outbox",
		fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'Order', 'o1', 'OrderPlaced', '{}')`, realID),
		fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ('%s', '__canary', 'old', 'Canary', '{}', now() - interval '2 hours')`, oldCanary),
		fmt.Sprintf(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ('%s', '__canary', 'new', 'Canary', '{}', now() - interval '9 minutes')`, freshCanary))
	wc, err := pgx.Connect(ctx, watchRole(t, pg))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close(ctx)
	ids := func() []string {
		t.Helper()
		rows, _ := conn.Query(ctx, `SELECT id::text FROM outbox ORDER BY id`)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	// A canary not yet relayed (9 minutes old) is kept, whatever the
	// interval asked for.
	var deleted int64
	if err := wc.QueryRow(ctx, `SELECT outbox_delete_canaries('0 seconds')`).Scan(&deleted); err != nil {
		t.Fatalf("outbox_delete_canaries: %v", err)
	}
	want := []string{realID.String(), freshCanary.String()}
	slices.Sort(want)
	if left := ids(); deleted != 1 || !slices.Equal(left, want) {
		t.Errorf("outbox_delete_canaries('0 seconds') deleted %d, left %v; want the 2-hour-old canary deleted, the 9-minute-old one and the real event kept %v", deleted, left, want)
	}

	denied := func(what, q string, args ...any) {
		t.Helper()
		_, err := wc.Exec(ctx, q, args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("outbox_watch %s: err %v; want permission denied (42501)", what, err)
		}
	}
	denied("inserted a forged event", `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'o1', 'OrderPlaced', '{"forged":true}')`, uuid.New())
	denied("inserted a canary row directly", `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, '__canary', 'x', 'Canary', '{}')`, uuid.New())
	denied("read a payload", `SELECT payload FROM outbox`)
	denied("changed a real event", `UPDATE outbox SET aggregatetype = '__canary' WHERE id = $1`, realID)
	denied("deleted a real event", `DELETE FROM outbox WHERE id = $1`, realID)

	canary := uuid.Must(uuid.NewV7())
	if _, err := wc.Exec(ctx, `SELECT public.outbox_write_canary($1, $2, $3)`, canary, "sw-1", `{"instance":"sw-1","seq":1}`); err != nil {
		t.Fatalf("outbox_write_canary: %v", err)
	}
	var aggType, aggID, typ string
	if err := conn.QueryRow(ctx, `SELECT aggregatetype, aggregateid, type FROM outbox WHERE id = $1`, canary).Scan(&aggType, &aggID, &typ); err != nil {
		t.Fatalf("the canary written: %v", err)
	}
	if aggType != "__canary" || aggID != "sw-1" || typ != "Canary" {
		t.Errorf("canary row %s/%s/%s; want __canary/sw-1/Canary", aggType, aggID, typ)
	}
	if _, err := wc.Exec(ctx, `SELECT public.outbox_write_canary($1, 'sw-1', $2)`, uuid.New(), `{"pad":"`+strings.Repeat("x", 2000)+`"}`); err == nil {
		t.Error("outbox_write_canary took a 2 kB payload; want it refused")
	}
	if n := len(ids()); n != 3 {
		t.Errorf("%d rows in the outbox; want 3 (the real event, two canaries)", n)
	}
}

// auditLines runs the slotwatch binary's audit and returns its exit code
// and its stdout's lines.
func auditLines(t testing.TB, env map[string]string, args ...string) (int, []string, string) {
	t.Helper()
	cmd := exec.Command(testenv.Binary(t, "slotwatch"), append([]string{"audit"}, args...)...)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("slotwatch audit: %v", err)
		}
		code = ee.ExitCode()
	}
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return code, lines, stderr.String()
}

func missingIDs(lines []string) []string {
	var ids []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "missing" {
			ids = append(ids, f[1])
		}
	}
	slices.Sort(ids)
	return ids
}

// TestAuditSkippedWindow: a window skipped on purpose (connector stopped,
// 500 events written, the slot advanced past them, the connector restarted
// with OUTBOX_ACCEPT_SLOT_RESET=true) is found by the audit, exactly those
// 500 ids and no others, within 60 s by the continuous audit (which fires
// EventsMissing); after `connector backfill` of the window both report 0.
func TestAuditSkippedWindow(t *testing.T) {
	pg := watchPG(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("skip%d", time.Now().UnixNano()%1e9)
	write := func(n int) []string {
		t.Helper()
		var ids []string
		batch := &pgx.Batch{}
		for i := 0; i < n; i++ {
			id := uuid.Must(uuid.NewV7())
			ids = append(ids, id.String())
			batch.Queue(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`, id, aggType, fmt.Sprint(i%7))
		}
		if err := conn.SendBatch(ctx, batch).Close(); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	start := time.Now().Add(-time.Second)
	p := startConnector(t, pg, brokers)
	before := write(200)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	eventually(t, time.Minute, func() (bool, string) { return c.Count() >= 200, fmt.Sprintf("%d of 200", c.Count()) })
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 30*time.Second)

	time.Sleep(20 * time.Millisecond)
	skipFrom := time.Now()
	skipped := write(500)
	var skipTo time.Time
	if err := conn.QueryRow(ctx, `SELECT max(created_at) + interval '1 millisecond' FROM outbox`).Scan(&skipTo); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_replication_slot_advance('outbox_slot', pg_current_wal_lsn())`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	startConnector(t, pg, brokers, "OUTBOX_ACCEPT_SLOT_RESET", "true")
	after := write(100)
	eventually(t, time.Minute, func() (bool, string) { return c.Count() >= 300, fmt.Sprintf("%d of 300", c.Count()) })
	_ = before
	_ = after

	env := map[string]string{
		"SLOTWATCH_OUTBOX_DSN":  watchRole(t, pg),
		"OUTBOX_KAFKA_BROKERS":  brokers,
		"SLOTWATCH_AUDIT_GRACE": "1s",
	}
	hook := newHook(t)
	found := time.Now()
	sw := startSlotwatch(t, map[string]string{
		"SLOTWATCH_PG_DSN":            pg.DSN("outbox"),
		"SLOTWATCH_INTERVAL":          "1s",
		"SLOTWATCH_OUTBOX_DSN":        env["SLOTWATCH_OUTBOX_DSN"],
		"SLOTWATCH_CANARY_INTERVAL":   "0",
		"SLOTWATCH_AUDIT_INTERVAL":    "2s",
		"SLOTWATCH_AUDIT_WINDOW":      "10m",
		"SLOTWATCH_AUDIT_GRACE":       "1s",
		"SLOTWATCH_ALERT_WEBHOOK_URL": hook.srv.URL,
		"OUTBOX_KAFKA_BROKERS":        brokers,
	})
	hook.waitFor(t, "EventsMissing", "", "firing", 60*time.Second)
	t.Logf("EventsMissing fired %s after slotwatch started", time.Since(found).Round(10*time.Millisecond))
	if v, _ := sw.metric(t, "slotwatch_audit_missing_events", nil); v != 500 {
		t.Errorf("slotwatch_audit_missing_events = %v; want 500", v)
	}

	since := start.UTC().Format(time.RFC3339Nano)
	code, lines, stderr := auditLines(t, env, "-since", since)
	got := missingIDs(lines)
	want := slices.Clone(skipped)
	slices.Sort(want)
	if code != 1 || !slices.Equal(got, want) {
		t.Fatalf("slotwatch audit: exit %d, %d missing (want exit 1 and exactly the 500 skipped ids); first lines %q; stderr %s",
			code, len(got), lines[:min(5, len(lines))], stderr)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "audited 800 events") || !strings.Contains(last, "500 missing") {
		t.Errorf("summary line %q; want 800 audited, 500 missing", last)
	}
	if !strings.Contains(lines[0], "aggregatetype="+aggType) || !strings.Contains(lines[0], "topic=outbox.event."+aggType) {
		t.Errorf("a missing line names no aggregate type or topic: %q", lines[0])
	}

	// Publish the window again.
	bf := exec.Command(testenv.Binary(t, "connector"), "backfill", "-from", skipFrom.UTC().Format(time.RFC3339Nano), "-to", skipTo.UTC().Format(time.RFC3339Nano))
	bf.Env = []string{"OUTBOX_PG_DSN=" + pg.DSN("outbox"), "OUTBOX_KAFKA_BROKERS=" + brokers, "OUTBOX_TOPIC_PARTITIONS=3"}
	if out, err := bf.CombinedOutput(); err != nil {
		t.Fatalf("connector backfill: %v\n%s", err, out)
	}
	code, lines, stderr = auditLines(t, env, "-since", since)
	if code != 0 || len(missingIDs(lines)) != 0 {
		t.Fatalf("after the backfill: exit %d, lines %q, stderr %s; want exit 0 and none missing", code, lines[:min(5, len(lines))], stderr)
	}
	t.Logf("after the backfill: %s", lines[len(lines)-1])
	hook.waitFor(t, "EventsMissing", "", "resolved", 60*time.Second)
	if v, _ := sw.metric(t, "slotwatch_audit_missing_events", nil); v != 0 {
		t.Errorf("slotwatch_audit_missing_events = %v after the backfill; want 0", v)
	}
}

// TestAuditMillion audits a window of 1,000,000 events (OUTBOX_AUDIT_EVENTS
// sets another size) with the slotwatch binary: a handful left out of Kafka
// and a handful sent twice are found exactly, and the peak resident set
// stays bounded (the Kafka side goes through the external sort).
func TestAuditMillion(t *testing.T) {
	n := 1_000_000
	if v := os.Getenv("OUTBOX_AUDIT_EVENTS"); v != "" {
		fmt.Sscan(v, &n)
	}
	pg := watchPG(t)
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := fmt.Sprintf("mil%d", time.Now().UnixNano()%1e9)
	topic := "outbox.event." + aggType
	start := time.Now().Add(-time.Hour)
	load := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		SELECT gen_random_uuid(), $1, (i % 1000)::text, 'T', NULL, $2::timestamptz + (i * interval '1 millisecond')
		FROM generate_series(1, $3) AS i`, aggType, start, n); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(kgoClient(t, brokers))
	if _, err := adm.CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// Produce every id but every n/7th, and send every n/3rd twice.
	cl := kgoClient(t, brokers, kgo.ProducerLinger(5*time.Millisecond), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
		kgo.MaxBufferedRecords(100_000), kgo.ProducerBatchCompression(kgo.NoCompression()))
	rows, err := conn.Query(ctx, `SELECT id::text FROM outbox WHERE aggregatetype = $1`, aggType)
	if err != nil {
		t.Fatal(err)
	}
	var left, twice []string
	var perr error
	var pmu sync.Mutex
	produce := func(id string) {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: []byte(`{}`), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}},
			func(_ *kgo.Record, err error) {
				if err != nil {
					pmu.Lock()
					perr = err
					pmu.Unlock()
				}
			})
	}
	i := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		i++
		switch {
		case i%(n/7) == 0:
			left = append(left, id)
			continue
		case i%(n/3) == 1:
			twice = append(twice, id)
			produce(id)
		}
		produce(id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Flush(ctx); err != nil || perr != nil {
		t.Fatalf("produce: %v %v", err, perr)
	}
	t.Logf("loaded %d rows and %d records in %s", n, n-len(left)+len(twice), time.Since(load).Round(time.Millisecond))

	cmd := exec.Command(testenv.Binary(t, "slotwatch"), "audit", "-since", start.Add(-time.Second).UTC().Format(time.RFC3339Nano))
	cmd.Env = []string{"SLOTWATCH_OUTBOX_DSN=" + watchRole(t, pg), "OUTBOX_KAFKA_BROKERS=" + brokers, "SLOTWATCH_AUDIT_GRACE=0s"}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	took := time.Since(began)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("slotwatch audit: %v (want exit 1); stderr %s", err, stderr.String())
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss * 1024
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	got := missingIDs(lines)
	slices.Sort(left)
	if !slices.Equal(got, left) {
		t.Errorf("missing %v; want %v", got, left)
	}
	var dups []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "duplicate" && f[2] == "copies=2" {
			dups = append(dups, f[1])
		}
	}
	slices.Sort(dups)
	slices.Sort(twice)
	if !slices.Equal(dups, twice) {
		t.Errorf("duplicates %v; want %v", dups, twice)
	}
	summary := lines[len(lines)-1]
	t.Logf("audit of %d events: %s; the process took %s, peak RSS %.1f MiB", n, summary, took.Round(time.Millisecond), float64(rss)/(1<<20))
	if !strings.HasPrefix(summary, fmt.Sprintf("audited %d events", n)) {
		t.Errorf("summary %q; want %d audited", summary, n)
	}
	// The audit's heap stays near 20 MiB whatever the window (a few sort
	// chunks and one fetch, under a 32 MiB soft limit); the resident set
	// measured 52 to 166 MiB across runs, the most when other tests kept
	// both cores busy and the collector's CPU limit let the heap overshoot.
	// A sort of all one million ids in memory takes several hundred.
	if rss > 256<<20 {
		t.Errorf("peak RSS %.1f MiB; want under 256 MiB (bounded memory)", float64(rss)/(1<<20))
	}
}

func kgoClient(t testing.TB, brokers string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
