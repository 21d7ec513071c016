package inbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// quiet is the Config the defect tests start from: short backoff, few
// attempts, no logs.
func (e *env) quiet() inbox.Config {
	return inbox.Config{Brokers: []string{e.brokers}, Group: "g-" + e.topic, Topics: []string{e.topic},
		DLQTopic: e.dlq, MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// dlqReader reads the DLQ topic from its start; each call to read returns
// every record seen so far after polling once more.
type dlqReader struct {
	cl   *kgo.Client
	mu   sync.Mutex
	recs []*kgo.Record
}

func (e *env) dlqReader(t *testing.T) *dlqReader {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(e.dlq),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &dlqReader{cl: cl}
}

func (d *dlqReader) read() []*kgo.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	fs := d.cl.PollFetches(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	fs.EachRecord(func(r *kgo.Record) { d.recs = append(d.recs, r) })
	return append([]*kgo.Record(nil), d.recs...)
}

// byID indexes dead letters by their id header.
func byID(recs []*kgo.Record) map[string]*kgo.Record {
	m := map[string]*kgo.Record{}
	for _, r := range recs {
		m[inbox.Header(r, "id")] = r
	}
	return m
}

func effectsOf(t *testing.T, e *env, id string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE event_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func randomText(t *testing.T, n int) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// attemptCounter counts handler runs per id.
type attemptCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *attemptCounter) next(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[id]++
	return a.n[id]
}

func (a *attemptCounter) get(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[id]
}

// TestRecordFaultsAreDeadLettered (issue 14 defect 1): errors that belong to
// the record and will not pass on retry, raised by the inbox's own statements
// rather than returned by the handler, dead-letter the record with the reason
// instead of looping: a handler that swallows a statement error (COMMIT
// answers ROLLBACK), a deferrable constraint failing at COMMIT (23505), an id
// header with a NUL byte, with invalid UTF-8, or longer than a btree entry
// allows. The records after each are processed; those whose handler ran
// count MaxAttempts attempts.
func TestRecordFaultsAreDeadLettered(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE deferred (k text UNIQUE DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO deferred VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		switch string(r.Value) {
		case "swallow":
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // the handler's bug: the error is dropped
			return nil
		case "deferred":
			_, err := tx.Exec(ctx, `INSERT INTO deferred VALUES ('taken')`) // fails at COMMIT
			return err
		}
		return effectHandler(ctx, tx, r)
	}
	long := "ev-long-" + randomText(t, 10000)
	cases := []struct {
		name, id, value, reason string
		attempts                string
	}{
		{"swallowed statement error", "ev-swallow", "swallow", "commit unexpectedly resulted in rollback", "3"},
		{"deferred constraint at commit", "ev-deferred", "deferred", "23505", "3"},
		{"NUL byte in id", "ev-nul\x00x", "ok", "NUL", "0"},
		{"invalid UTF-8 in id", "ev-\xff\xfe", "ok", "UTF-8", "0"},
		{"id longer than a btree entry", long, "ok", "bytes", "0"},
	}
	var recs []*kgo.Record
	for i, c := range cases {
		// Each case has its own key, followed by an innocent record of the
		// same key (same partition): it must be processed.
		key := fmt.Sprintf("agg-%d", i)
		bad := rec(c.id, c.value)
		bad.Key = []byte(key)
		after := rec(fmt.Sprintf("ev-after-%d", i), "ok")
		after.Key = []byte(key)
		recs = append(recs, bad, after)
	}
	e.produce(t, recs...)
	c, err := inbox.New(e.pool, h, e.quiet())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	dlq := e.dlqReader(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := byID(dlq.read())
		var missing []string
		for _, c := range cases {
			if got[c.id] == nil {
				missing = append(missing, c.name)
			}
		}
		after := count(t, e.pool, `SELECT count(*) FROM effects WHERE event_id LIKE 'ev-after-%'`)
		if len(missing) == 0 && after == len(cases) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("after 30s: not dead-lettered: %q; %d of %d records after them processed; stats %+v",
				missing, after, len(cases), c.Stats())
		}
	}
	stop()
	got := byID(dlq.read())
	for _, c := range cases {
		dl := got[c.id]
		if reason := inbox.Header(dl, "inbox.error"); !strings.Contains(reason, c.reason) {
			t.Errorf("%s: reason %q, want it to contain %q", c.name, reason, c.reason)
		}
		if a := inbox.Header(dl, "inbox.attempts"); a != c.attempts {
			t.Errorf("%s: %s attempts, want %s", c.name, a, c.attempts)
		}
		if string(dl.Value) != c.value || string(dl.Key) == "" {
			t.Errorf("%s: the dead letter is not the record whole: key %q value %q", c.name, dl.Key, dl.Value)
		}
	}
	if n := count(t, e.pool, `SELECT count(*) FROM effects`); n != len(cases) {
		t.Errorf("%d effects, want %d (only the records after the faulty ones)", n, len(cases))
	}
}

// TestMissingTableIsNotTheRecordsFault (issue 14 defect 1, the other
// side): a class-42 error of the inbox's own statement (its table missing)
// is the deployment's, not the record's: the record is retried, never
// dead-lettered, and applied once the table exists.
func TestMissingTableIsNotTheRecordsFault(t *testing.T) {
	e := setup(t)
	cfg := e.quiet()
	cfg.Table = "public.inbox_not_yet"
	e.produce(t, rec("ev-1", "ok"))
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	waitFor(t, "retries on the missing table", 20*time.Second, func() bool {
		s := c.Stats()
		return s.TransientRetries >= 5 || s.DeadLettered > 0
	})
	if s := c.Stats(); s.DeadLettered != 0 {
		t.Fatalf("stats %+v: a record was dead-lettered because the inbox table is missing", s)
	}
	if err := inbox.EnsureSchema(context.Background(), e.pool, cfg.Table); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ev-1 applied once the table exists", 20*time.Second, func() bool { return effectsOf(t, e, "ev-1") == 1 })
}
