package testenv

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Event is what a test wrote to the outbox and expects in Kafka.
type Event struct {
	ID, AggType, AggID, Type, Payload string
	Seq                               int // per aggregate, in commit order
}

// Writer writes outbox events and remembers them in commit order.
type Writer struct {
	mu     sync.Mutex
	seqs   map[string]int
	Events []Event
}

// NewWriter returns an empty writer.
func NewWriter() *Writer { return &Writer{seqs: map[string]int{}} }

// Snapshot returns a copy of the events written so far.
func (w *Writer) Snapshot() []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Event(nil), w.Events...)
}

// Tx writes one transaction of size events over aggs aggregates, starting at
// aggregate index first. It returns an error rather than failing, so that
// fault tests can retry a transaction that hit a server restart.
func (w *Writer) Tx(ctx context.Context, conn *pgx.Conn, aggType string, size, aggs, first int) error {
	w.mu.Lock()
	evs := make([]Event, 0, size)
	seqs := map[string]int{}
	for i := 0; i < size; i++ {
		agg := fmt.Sprintf("agg-%d", (first+i)%aggs)
		key := aggType + "/" + agg
		if _, ok := seqs[key]; !ok {
			seqs[key] = w.seqs[key]
		}
		seqs[key]++
		ev := Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Tested", Seq: seqs[key]}
		ev.Payload = fmt.Sprintf(`{"agg": "%s", "seq": %d}`, agg, ev.Seq)
		evs = append(evs, ev)
	}
	w.mu.Unlock()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	b := &pgx.Batch{}
	for _, ev := range evs {
		b.Queue(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`,
			ev.ID, ev.AggType, ev.AggID, ev.Type, ev.Payload)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		// An error from COMMIT leaves the outcome unknown only if the
		// connection broke; the fault tests treat such events as optional.
		return err
	}
	w.mu.Lock()
	for k, v := range seqs {
		w.seqs[k] = v
	}
	w.Events = append(w.Events, evs...)
	w.mu.Unlock()
	return nil
}

// Write inserts n events over aggs aggregates in transactions of 1..maxTx
// events, failing the test on error.
func (w *Writer) Write(t testing.TB, ctx context.Context, conn *pgx.Conn, aggType string, n, aggs, maxTx int) {
	t.Helper()
	for written := 0; written < n; {
		size := 1 + (written*7)%maxTx
		if written+size > n {
			size = n - written
		}
		if err := w.Tx(ctx, conn, aggType, size, aggs, written); err != nil {
			t.Fatalf("write outbox events: %v", err)
		}
		written += size
	}
}

// Consumer reads every record of some topics from the start.
type Consumer struct {
	cl   *kgo.Client
	mu   sync.Mutex
	recs []*kgo.Record
	ids  map[string]int
	done chan struct{}
	// Decode, when set, turns a record's value into the payload text
	// Verify compares (an Avro value, say); nil compares the bytes.
	Decode func([]byte) (string, error)
}

// StartConsumer consumes topics (read_committed) until the test ends.
func StartConsumer(t testing.TB, brokers string, topics ...string) *Consumer {
	t.Helper()
	return StartConsumerWith(t, []kgo.Opt{kgo.SeedBrokers(brokers)}, topics...)
}

// StartConsumerWith is StartConsumer with the client's connection options
// (seed brokers, TLS, SASL).
func StartConsumerWith(t testing.TB, conn []kgo.Opt, topics ...string) *Consumer {
	t.Helper()
	cl, err := kgo.NewClient(append(conn, kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(250*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{cl: cl, ids: map[string]int{}, done: make(chan struct{})}
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
				c.ids[Header(r, "id")]++
				c.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done; cl.Close() })
	return c
}

// Header returns a record header's value.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Records returns a copy of what was consumed.
func (c *Consumer) Records() []*kgo.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*kgo.Record(nil), c.recs...)
}

// Count is how many records were consumed.
func (c *Consumer) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// WaitFor waits until every event in want has been consumed.
func (c *Consumer) WaitFor(t testing.TB, want []Event, timeout time.Duration) {
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

// Verify checks topic, key, value and id header of every event in want, and
// that per aggregate the first deliveries are in commit order. It returns
// the number of duplicate deliveries: an event in the topic twice (at
// another offset); the consumer reading one record again is said, not
// counted.
func (c *Consumer) Verify(t testing.TB, want []Event) int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	byID := make(map[string]Event, len(want))
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := map[string]bool{}
	// where each event was first read: a second read of the same offset
	// is this consumer reading a partition again (a reset after an
	// out-of-range fetch, say), not a duplicate in the topic.
	at := map[string][2]int64{}
	reread := 0
	lastSeq := map[string]int{}
	dups, errs := 0, 0
	fail := func(format string, args ...any) {
		errs++
		if errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range c.recs {
		id := Header(r, "id")
		e, ok := byID[id]
		if !ok {
			continue
		}
		if seen[id] {
			if at[id] == [2]int64{int64(r.Partition), r.Offset} {
				reread++
				continue
			}
			dups++
			continue
		}
		seen[id] = true
		at[id] = [2]int64{int64(r.Partition), r.Offset}
		if r.Topic != "outbox.event."+e.AggType {
			fail("event %s: topic %q, want %q", id, r.Topic, "outbox.event."+e.AggType)
		}
		if string(r.Key) != e.AggID {
			fail("event %s: key %q, want %q", id, r.Key, e.AggID)
		}
		got := string(r.Value)
		if c.Decode != nil {
			var err error
			if got, err = c.Decode(r.Value); err != nil {
				fail("event %s: value %x: %v", id, r.Value, err)
			}
		}
		if got != e.Payload {
			fail("event %s: value %s, want %s", id, got, e.Payload)
		}
		k := e.AggType + "/" + e.AggID
		if e.Seq <= lastSeq[k] {
			fail("aggregate %s: first delivery of seq %d after seq %d (out of commit order)", k, e.Seq, lastSeq[k])
		}
		lastSeq[k] = e.Seq
	}
	if len(seen) != len(want) {
		fail("delivered %d distinct events, want %d", len(seen), len(want))
	}
	if reread > 0 {
		t.Logf("the consumer read %d records again at the same partition and offset (not duplicates in the topic)", reread)
	}
	return dups
}

// Load writes transactions of 1..20 events in the background until halted,
// reconnecting through faults (a server restart, a killed backend); only
// transactions whose COMMIT succeeded are expected in Kafka.
type Load struct {
	w      *Writer
	stop   chan struct{}
	done   chan struct{}
	errors atomic.Int64
}

// StartLoad starts a Load on dsn over aggs aggregates of aggType, pausing
// between transactions.
func StartLoad(t testing.TB, dsn, aggType string, aggs int, pause time.Duration) *Load {
	t.Helper()
	l := &Load{w: NewWriter(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		ctx := context.Background()
		rng := rand.New(rand.NewSource(time.Now().UnixNano()))
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(ctx)
			}
		}()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			if conn == nil {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				c, err := pgx.Connect(cctx, dsn)
				cancel()
				if err != nil {
					l.errors.Add(1)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				conn = c
			}
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := l.w.Tx(tctx, conn, aggType, 1+rng.Intn(20), aggs, rng.Intn(aggs))
			cancel()
			if err != nil {
				l.errors.Add(1)
				conn.Close(ctx)
				conn = nil
				time.Sleep(50 * time.Millisecond)
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	}()
	t.Cleanup(func() { l.Halt() })
	return l
}

// Halt stops the load and returns every committed event, in commit order.
func (l *Load) Halt() []Event {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return l.w.Snapshot()
}

// Errors is how many transactions or connections failed (and were retried).
func (l *Load) Errors() int64 { return l.errors.Load() }
