package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

type env struct {
	pool    *pgxpool.Pool
	brokers string
	topic   string
	dlq     string
	prod    *kgo.Client
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	pool, err := pgxpool.New(ctx, pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := inbox.EnsureSchema(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	e := &env{pool: pool, brokers: brokers, topic: "inbox.test." + suffix, dlq: "inbox.test.dlq." + suffix}
	e.prod, err = kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.prod.Close)
	if _, err := kadm.NewClient(e.prod).CreateTopics(ctx, 3, 1, nil, e.topic); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		r.Topic = e.topic
	}
	if err := e.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func rec(id, value string) *kgo.Record {
	r := &kgo.Record{Key: []byte("k" + id), Value: []byte(value)}
	if id != "" {
		r.Headers = []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}
	}
	return r
}

func effectHandler(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	switch string(r.Value) {
	case "poison":
		return errors.New("cannot process this order: unknown currency")
	case "malformed":
		return inbox.Permanent(errors.New("malformed payload"))
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, inbox.Header(r, "id"))
	return err
}

func run(t *testing.T, c *inbox.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, q string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDedupeAndDLQ: duplicates (in one poll, across polls, and after a
// restart of the consumer) run the handler once; a record that keeps failing
// and one failing permanently go to the DLQ with their reason; one without an
// id header too; the partition moves on after them.
func TestDedupeAndDLQ(t *testing.T) {
	e := setup(t)
	cfg := inbox.Config{Brokers: []string{e.brokers}, Group: "g-" + e.topic, Topics: []string{e.topic},
		DLQTopic: e.dlq, MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var recs []*kgo.Record
	for i := 0; i < 200; i++ {
		recs = append(recs, rec(fmt.Sprintf("ev-%d", i), "ok"))
		if i%4 == 0 {
			recs = append(recs, rec(fmt.Sprintf("ev-%d", i), "ok")) // duplicate
		}
	}
	recs = append(recs, rec("ev-poison", "poison"), rec("ev-malformed", "malformed"), rec("", "no id"), rec("ev-after", "ok"))
	e.produce(t, recs...)
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all records handled", time.Minute, func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.DeadLettered >= int64(len(recs))
	})
	stop()
	s := c.Stats()
	if s.Processed != 201 || s.Duplicates != 50 || s.DeadLettered != 3 || s.Retries != 2 {
		t.Errorf("stats %+v; want 201 processed, 50 duplicates, 3 dead-lettered, 2 retries", s)
	}
	// Redeliver everything to a fresh consumer of the same group from the
	// start (a lost commit, a replaying relay): nothing runs twice.
	e.produce(t, rec("ev-7", "ok"), rec("ev-poison", "poison"), rec("ev-new", "ok"))
	c2, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, c2)
	waitFor(t, "redelivered records handled", time.Minute, func() bool {
		s := c2.Stats()
		return s.Processed+s.Duplicates >= 3
	})
	stop()
	if s := c2.Stats(); s.Processed != 1 || s.Duplicates != 2 || s.DeadLettered != 0 {
		t.Errorf("after restart: %+v; want 1 processed (ev-new), 2 duplicates (ev-7, ev-poison already dead-lettered)", s)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM effects`); n != 202 {
		t.Errorf("%d effects, want 202 (one per distinct processed id)", n)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM (SELECT event_id FROM effects GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d events had effects twice", n)
	}
	// The DLQ holds the three with their reasons.
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.ConsumeTopics(e.dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	reasons := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(reasons) < 3 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			reasons[string(r.Value)] = inbox.Header(r, "inbox.error") + " / attempts " + inbox.Header(r, "inbox.attempts") +
				" / from " + inbox.Header(r, "inbox.source.topic")
		})
	}
	for _, v := range []string{"poison", "malformed", "no id"} {
		if reasons[v] == "" {
			t.Errorf("DLQ: no record %q (have %v)", v, reasons)
		}
	}
	t.Logf("DLQ: %v", reasons)
}

// TestInboxStaysBounded: with a retention of 1 s, the processed-ids table
// holds about retention x rate rows however many records go through.
func TestInboxStaysBounded(t *testing.T) {
	e := setup(t)
	c, err := inbox.New(e.pool, effectHandler, inbox.Config{Brokers: []string{e.brokers}, Group: "g-" + e.topic,
		Topics: []string{e.topic}, DLQTopic: e.dlq, Retention: time.Second, CleanupInterval: 200 * time.Millisecond,
		CleanupBatch: 100, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	const rate, seconds = 500, 6 // records per second, for 6 s
	var mu sync.Mutex
	peak := 0
	samplerDone := make(chan struct{})
	sampling := make(chan struct{})
	go func() {
		defer close(samplerDone)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n := count(t, e.pool, `SELECT count(*) FROM inbox`)
			mu.Lock()
			peak = max(peak, n)
			mu.Unlock()
		}
	}()
	for s := 0; s < seconds*10; s++ {
		var recs []*kgo.Record
		for i := 0; i < rate/10; i++ {
			recs = append(recs, rec(fmt.Sprintf("b-%d-%d", s, i), "ok"))
		}
		e.produce(t, recs...)
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, "all processed", time.Minute, func() bool { return c.Stats().Processed >= rate*seconds })
	close(sampling)
	<-samplerDone
	waitFor(t, "the table to empty after the retention", 10*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM inbox`) == 0
	})
	// Retention 1 s + cleanup every 0.2 s at 500/s: about 600 rows; allow
	// for processing bursts on a loaded machine.
	bound := 3 * rate
	t.Logf("%d records processed; peak inbox size %d rows (bound %d); %d ids cleaned; empty after the retention",
		rate*seconds, peak, bound, c.Stats().Cleaned)
	if peak > bound || peak == 0 {
		t.Errorf("peak inbox size %d rows, want 1..%d", peak, bound)
	}
}
