package relay

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/connector/config"
	"github.com/pgoutbox/pgoutbox/connector/metrics"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

// testConfig is the connector's configuration for a test: defaults, a
// unique slot and topic prefix, and fast status updates.
func testConfig(t testing.TB, dsn, brokers string) config.Config {
	t.Helper()
	var cfg config.Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg.Bind(fs, func(string) string { return "" })
	cfg.PGDSN = dsn
	cfg.Kafka.Brokers = brokers
	cfg.HTTPAddr = ""
	cfg.StatusInterval = 200 * time.Millisecond
	cfg.ShutdownTimeout = 20 * time.Second
	cfg.TopicPartitions = 3
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

type running struct {
	cancel context.CancelFunc
	done   chan error
	relay  *Relay
	m      *metrics.Metrics
}

func startRelay(t testing.TB, cfg config.Config) *running {
	t.Helper()
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelInfo
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	m := metrics.New()
	r := New(cfg, router, log, m)
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan error, 1), relay: r, m: m}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() { run.stop(t) })
	return run
}

// waitStreaming waits until the relay streams the slot.
func (r *running) waitStreaming(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !r.relay.Streaming() {
		if time.Now().After(deadline) {
			t.Fatal("relay did not start streaming within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *running) stop(t testing.TB) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not stop within 60s")
		return nil
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// event is what a test wrote and expects in Kafka.
type event struct {
	ID, AggType, AggID, Type, Payload string
	Seq                               int // per aggregate, in commit order
}

// writeEvents inserts n events over aggs aggregates of aggregate type
// aggType, in transactions of 1..maxTx events, and returns them in commit
// order.
func writeEvents(t testing.TB, ctx context.Context, conn *pgx.Conn, aggType string, n, aggs, maxTx int, seqs map[string]int) []event {
	t.Helper()
	var out []event
	for written := 0; written < n; {
		size := 1 + (written*7)%maxTx
		if written+size > n {
			size = n - written
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b := &pgx.Batch{}
		for i := 0; i < size; i++ {
			agg := fmt.Sprintf("agg-%d", (written+i)%aggs)
			key := aggType + "/" + agg
			seqs[key]++
			ev := event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Tested", Seq: seqs[key]}
			ev.Payload = fmt.Sprintf(`{"agg": "%s", "seq": %d}`, agg, ev.Seq)
			b.Queue(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`,
				ev.ID, ev.AggType, ev.AggID, ev.Type, ev.Payload)
			out = append(out, ev)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		written += size
	}
	return out
}

// consumer reads every record of the given topics from the start.
type consumer struct {
	cl   *kgo.Client
	mu   sync.Mutex
	recs []*kgo.Record
	ids  map[string]int
	stop context.CancelFunc
	done chan struct{}
}

func startConsumer(t testing.TB, brokers string, topics ...string) *consumer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cl: cl, ids: map[string]int{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fs.EachRecord(func(r *kgo.Record) {
				c.mu.Lock()
				c.recs = append(c.recs, r)
				c.ids[header(r, "id")]++
				c.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done; cl.Close() })
	return c
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// waitFor waits until every id in want has been consumed.
func (c *consumer) waitFor(t testing.TB, want []event, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		missing := 0
		var example string
		for _, e := range want {
			if c.ids[e.ID] == 0 {
				missing++
				example = e.ID
			}
		}
		total := len(c.recs)
		c.mu.Unlock()
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never reached Kafka within %s (consumed %d records; e.g. %s)", missing, len(want), timeout, total, example)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verify checks topic, key, value and id header of every event, and that
// per aggregate the first deliveries are in commit order. It returns the
// number of duplicate deliveries.
func (c *consumer) verify(t testing.TB, want []event) int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	byID := make(map[string]event, len(want))
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := map[string]bool{}
	lastSeq := map[string]int{}
	dups := 0
	for _, r := range c.recs {
		id := header(r, "id")
		e, ok := byID[id]
		if !ok {
			continue
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		if r.Topic != "outbox.event."+e.AggType {
			t.Errorf("event %s: topic %q, want %q", id, r.Topic, "outbox.event."+e.AggType)
		}
		if string(r.Key) != e.AggID {
			t.Errorf("event %s: key %q, want %q", id, r.Key, e.AggID)
		}
		if got := string(r.Value); got != jsonbText(e.Payload) {
			t.Errorf("event %s: value %s, want %s", id, got, jsonbText(e.Payload))
		}
		k := e.AggType + "/" + e.AggID
		if e.Seq <= lastSeq[k] {
			t.Errorf("aggregate %s: first delivery of seq %d after seq %d (out of commit order)", k, e.Seq, lastSeq[k])
		}
		lastSeq[k] = e.Seq
	}
	if len(seen) != len(want) {
		t.Errorf("delivered %d distinct events, want %d", len(seen), len(want))
	}
	return dups
}

// jsonbText is how PostgreSQL prints the jsonb our writer stores: the
// payloads used here are already in jsonb's canonical form.
func jsonbText(s string) string { return s }

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var _ = sortedKeys
var _ = testenv.SharedKafka
