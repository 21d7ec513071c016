package relay

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// Tests of poll mode (OUTBOX_SOURCE=poll, relay/poll): the table reader
// with no slot.

// pollConfig is testConfig in poll mode.
func pollConfig(t testing.TB, dsn, brokers string) config.Config {
	t.Helper()
	cfg := testConfig(t, dsn, brokers)
	cfg.Source = "poll"
	cfg.PollInterval = 50 * time.Millisecond
	cfg.PollBatch = 200
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// preparePoll applies sql/variants/outbox_poll.sql.
func preparePoll(t testing.TB, pg *testenv.Postgres) {
	t.Helper()
	if err := pg.Psql("outbox", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll.sql"); err != nil {
		t.Fatal(err)
	}
}

// waitPolling waits until the relay's poll session owns buckets.
func (r *running) waitPolling(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !r.relay.Leading() {
		select {
		case err := <-r.done:
			t.Fatalf("relay stopped before polling: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("relay never owned a bucket")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPollDelivers: poll mode delivers what writers commit (with the NOTIFY
// hint and without it), every row marked afterwards, nothing of a
// rolled-back transaction, without a slot or a publication being made.
func TestPollDelivers(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, channel := range []string{"outbox_poll", "off"} {
		t.Run("notify="+channel, func(t *testing.T) {
			aggType := uniqueType("poll")
			w := testenv.NewWriter()
			w.Write(t, ctx, conn, aggType, 200, 10, 20) // before the start
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			cfg := pollConfig(t, pg.DSN("outbox"), brokers)
			cfg.PollChannel = channel
			run := startRelay(t, cfg)
			run.waitPolling(t)
			w.Write(t, ctx, conn, aggType, 300, 10, 20)
			// A rolled-back transaction: never published.
			ghost := uuid.NewString()
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'agg-0', 'Ghost', '{}')`, ghost, aggType); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			w.Write(t, ctx, conn, aggType, 100, 10, 20)
			c.WaitFor(t, w.Events, 60*time.Second)
			// The load it puts on the table is visible.
			deadline := time.Now().Add(15 * time.Second)
			for run.relay.pollScanned.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if run.relay.pollScanned.Load() == 0 {
				t.Error("outbox_connector_poll_table_rows_scanned stayed 0")
			}
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			if dups := c.Verify(t, w.Events); dups != 0 {
				t.Errorf("%d duplicates without any fault", dups)
			}
			for _, r := range c.Records() {
				if testenv.Header(r, "id") == ghost {
					t.Errorf("the rolled-back event %s was published", ghost)
				}
			}
			var unmarked int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE aggregatetype = $1 AND published_at IS NULL", aggType).Scan(&unmarked); err != nil {
				t.Fatal(err)
			}
			if unmarked != 0 {
				t.Errorf("%d delivered rows not marked published", unmarked)
			}
		})
	}
	var slots, pubs int
	if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_publication WHERE pubname <> 'outbox_pub')").Scan(&slots, &pubs); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Errorf("poll mode made %d replication slots", slots)
	}
}

// TestPollNotPrepared: a table without the variant's columns stops the
// connector at once with what to apply.
func TestPollNotPrepared(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	run := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	select {
	case err := <-run.done:
		if !fatal.Is(err) || !strings.Contains(err.Error(), "sql/variants/outbox_poll.sql") {
			t.Fatalf("Run returned %v; want a fatal error naming sql/variants/outbox_poll.sql", err)
		}
		run.done <- err
	case <-time.After(60 * time.Second):
		t.Fatal("poll mode ran on an unprepared table")
	}
}

// TestPollLateCommit trips the commit-order gap that loses events in a
// cursor-based poller: a transaction takes its sequence value first and
// commits last, while later ones commit and are polled and published. Its
// event still arrives, and its aggregate's order holds.
func TestPollLateCommit(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("late")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	run.waitPolling(t)

	for round := range 5 {
		late := pg.Conn(t, "outbox")
		tx, err := late.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lateID := uuid.NewString()
		var lateSeq int64
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'late', 'Late', '{}') RETURNING seq`, lateID, aggType).Scan(&lateSeq); err != nil {
			t.Fatal(err)
		}
		// Later writes commit, are read, published and marked.
		var ids []string
		for i := range 20 {
			id := uuid.NewString()
			ids = append(ids, id)
			if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Early', '{}')`, id, aggType, "agg-"+string(rune('a'+i%5))); err != nil {
				t.Fatal(err)
			}
		}
		waitMarked(t, conn, ids)
		var maxSeq int64
		if err := conn.QueryRow(ctx, "SELECT max(seq) FROM outbox WHERE published_at IS NOT NULL").Scan(&maxSeq); err != nil {
			t.Fatal(err)
		}
		if maxSeq <= lateSeq {
			t.Fatalf("round %d: the later rows (up to seq %d) do not follow the late one (%d)", round, maxSeq, lateSeq)
		}
		// Now the late transaction commits, below everything published.
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		waitMarked(t, conn, []string{lateID})
		deadline := time.Now().Add(30 * time.Second)
		for !hasID(c.Records(), lateID) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the late commit (seq %d, below %d already published) never arrived", round, lateSeq, maxSeq)
			}
			time.Sleep(20 * time.Millisecond)
		}
		late.Close(ctx)
	}
}

func hasID(recs []*kgo.Record, id string) bool {
	for _, r := range recs {
		if testenv.Header(r, "id") == id {
			return true
		}
	}
	return false
}

// waitMarked waits until every row of ids is marked published.
func waitMarked(t testing.TB, conn *pgx.Conn, ids []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[]) AND published_at IS NOT NULL", ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == len(ids) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows marked published after 30s", n, len(ids))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPollSameRecordsAsWAL: the records poll mode makes of rows are those
// the WAL mode makes of the same rows, byte for byte: topic, partition key,
// value and headers (the lease token aside, which is each term's own).
func TestPollSameRecordsAsWAL(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("same")
	topic := "outbox.event." + aggType

	// The WAL mode streams the rows (the slot made before they are written).
	walRun := startRelay(t, testConfig(t, pg.DSN("outbox"), brokers))
	walRun.waitStreaming(t)
	payloads := []string{
		`{"a": 1, "nested": {"x": [1, 2.5, "three", null, true]}}`, `{}`, `"a string"`, `12345678901234567890`,
		`{"unicode": "żółw 🐢 \u0001"}`, `null`, `[1, {"b": "c"}]`,
	}
	var ids []string
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		id := uuid.NewString()
		ids = append(ids, id)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Same', $4)`, id, aggType, "agg-"+string(rune('a'+i%3)), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'agg-null', 'Same', NULL)`, uuid.NewString(), aggType); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, topic)
	want := len(payloads) + 1
	waitCount(t, c, want)
	if err := walRun.stop(t); err != nil {
		t.Fatal(err)
	}
	// The WAL mode does not mark rows: poll mode publishes them all.
	pollRun := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	waitCount(t, c, 2*want)
	if err := pollRun.stop(t); err != nil {
		t.Fatal(err)
	}
	recs := c.Records()
	first := map[string]*kgo.Record{}
	compared := 0
	for _, r := range recs {
		id := testenv.Header(r, "id")
		w, ok := first[id]
		if !ok {
			first[id] = r
			continue
		}
		compared++
		if w.Topic != r.Topic || w.Partition != r.Partition || string(w.Key) != string(r.Key) || string(w.Value) != string(r.Value) {
			t.Errorf("event %s: WAL mode %s[%d]/%q/%q, poll mode %s[%d]/%q/%q", id, w.Topic, w.Partition, w.Key, w.Value, r.Topic, r.Partition, r.Key, r.Value)
		}
		if a, b := headersBut(w, TokenHeader), headersBut(r, TokenHeader); a != b {
			t.Errorf("event %s: headers differ: WAL mode %s, poll mode %s", id, a, b)
		}
	}
	if compared != want {
		t.Errorf("compared %d events, want %d", compared, want)
	}
}

func headersBut(r *kgo.Record, skip string) string {
	var b strings.Builder
	for _, h := range r.Headers {
		if h.Key != skip {
			b.WriteString(h.Key + "=" + string(h.Value) + ";")
		}
	}
	return b.String()
}

func waitCount(t testing.TB, c *testenv.Consumer, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for c.Count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d records after 60s, want %d", c.Count(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPollTableBounded: under a sustained load, with published rows
// deleted after a short retention (the outbox package's Cleaner, as
// maintain runs it) and autovacuum as configured, the table and its indexes
// stay bounded: they grow while the load warms up and then level off,
// however long it runs. 40 s in make test; OUTBOX_SOAK=1 (make soak) runs
// it for 10 minutes.
func TestPollTableBounded(t *testing.T) {
	run := 40 * time.Second
	if os.Getenv("OUTBOX_SOAK") == "1" {
		run = 10 * time.Minute
	}
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"autovacuum_naptime": "1s"}})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("bounded")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	relay := startRelay(t, pollConfig(t, pg.DSN("outbox"), brokers))
	relay.waitPolling(t)

	load := testenv.StartLoad(t, pg.DSN("outbox"), aggType, 50, 2*time.Millisecond)
	cleaner := outbox.Cleaner{Retention: 5 * time.Second, BatchSize: 500, Pause: time.Millisecond}
	type sample struct {
		at                      time.Duration
		table, indexes, pending int64
	}
	var samples []sample
	start := time.Now()
	for time.Since(start) < run {
		time.Sleep(2 * time.Second)
		if _, err := cleaner.DeleteExpired(ctx, conn); err != nil {
			t.Fatal(err)
		}
		var s sample
		if err := conn.QueryRow(ctx, `SELECT pg_relation_size('outbox'), pg_indexes_size('outbox'), (SELECT count(*) FROM outbox WHERE published_at IS NULL)`).Scan(&s.table, &s.indexes, &s.pending); err != nil {
			t.Fatal(err)
		}
		s.at = time.Since(start).Round(time.Second)
		samples = append(samples, s)
	}
	events := load.Halt()
	c.WaitFor(t, events, 60*time.Second)
	if dups := c.Verify(t, events); dups != 0 {
		t.Errorf("%d duplicates without any fault", dups)
	}
	// The middle third against the last third: a table that grows with
	// the load's length has a last third well above its middle one.
	third := len(samples) / 3
	peak := func(ss []sample) (tbl, idx int64) {
		for _, s := range ss {
			tbl, idx = max(tbl, s.table), max(idx, s.indexes)
		}
		return tbl, idx
	}
	midT, midI := peak(samples[third : 2*third])
	lastT, lastI := peak(samples[2*third:])
	for _, s := range samples {
		t.Logf("%6s table %7.2f MiB, indexes %7.2f MiB, unpublished rows %d", s.at, float64(s.table)/(1<<20), float64(s.indexes)/(1<<20), s.pending)
	}
	t.Logf("%d events over %s (%.0f/s); peak table %.2f MiB (middle third) vs %.2f MiB (last third), indexes %.2f vs %.2f MiB",
		len(events), run, float64(len(events))/run.Seconds(), float64(midT)/(1<<20), float64(lastT)/(1<<20), float64(midI)/(1<<20), float64(lastI)/(1<<20))
	if float64(lastT) > 1.5*float64(midT)+(1<<20) || float64(lastI) > 1.5*float64(midI)+(1<<20) {
		t.Errorf("the table or its indexes kept growing: table %d -> %d bytes, indexes %d -> %d bytes", midT, lastT, midI, lastI)
	}
}

// TestPollLeastPrivilege: poll mode runs as the variant's role
// outbox_poller, which has no REPLICATION, owns nothing and may only read
// the outbox, set published_at and write dead letters: events are
// delivered and marked, one too large for Kafka is stored whole in
// outbox_dead_letter, and the role cannot do more than that.
func TestPollLeastPrivilege(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	var repl, super bool
	if err := conn.QueryRow(ctx, "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = 'outbox_poller'").Scan(&repl, &super); err != nil {
		t.Fatal(err)
	}
	if repl || super {
		t.Fatalf("outbox_poller: REPLICATION %v, superuser %v", repl, super)
	}
	aggType := uniqueType("poller")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := pollConfig(t, pg.DSNUser("outbox", "outbox_poller"), brokers)
	cfg.MaxMessageBytes = 4096
	run := startRelay(t, cfg)
	run.waitPolling(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 100, 5, 10)
	big := uuid.NewString()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'agg-big', 'Big', jsonb_build_object('blob', repeat('x', 8000)))`, big, aggType); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 100, 5, 10)
	c.WaitFor(t, w.Events, 60*time.Second)
	waitMarked(t, conn, []string{big})
	var stored int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox_dead_letter WHERE id = $1", big).Scan(&stored); err != nil || stored != 1 {
		t.Fatalf("the oversized event: %d rows in outbox_dead_letter (%v), want 1", stored, err)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	// And no more than that.
	pc, err := pgx.Connect(ctx, pg.DSNUser("outbox", "outbox_poller"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close(ctx)
	for _, q := range []string{
		"UPDATE outbox SET payload = '{}' WHERE false",
		"DELETE FROM outbox WHERE false",
		"INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'x', 'x', 'x')",
		"CREATE TABLE poller_may_not (x int)",
	} {
		if _, err := pc.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("outbox_poller ran %q: %v; want permission denied", q, err)
		}
	}
}

// TestPollStall: an idle poll-mode instance is never stalled, however long
// it waits; one whose sessions keep failing (the database is down) is, after
// OUTBOX_STALL_TIMEOUT, and no longer once it delivers again.
func TestPollStall(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	preparePoll(t, pg)
	cfg := pollConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelay(t, cfg)
	run.waitPolling(t)
	time.Sleep(2 * cfg.StallTimeout)
	if stalled, why := run.relay.Stalled(); stalled {
		t.Fatalf("an idle poll-mode instance is stalled: %s", why)
	}
	if err := pg.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if stalled, why := run.relay.Stalled(); stalled {
			t.Logf("stalled with the database down: %s", why)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("poll mode with its database down for 30s is not stalled")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("unstall")
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 20, 5, 5)
	c.WaitFor(t, w.Events, 90*time.Second)
	deadline = time.Now().Add(30 * time.Second)
	for {
		stalled, why := run.relay.Stalled()
		if !stalled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still stalled after delivering again: %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
