package publish

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// Helpers of the unit tests of producer.go and txn.go: a dead-letter table
// without PostgreSQL, one producer session driven by hand, a line of
// sessions, and a reader of what Kafka committed.

// fakeDeadLetters is outbox_dead_letter as insertDeadLetter uses it, in
// memory: rows by id, inserted unless the id is taken, and "same" when the
// row there holds the same row data. fail makes the next inserts fail.
type fakeDeadLetters struct {
	mu    sync.Mutex
	rows  map[string]deadLetterRow
	order []string // ids, in the order stored
	fail  int      // this many next inserts fail
	calls int
}

type deadLetterRow struct {
	id, topic, errText, class, lsn string
	rowData                        []byte
	aggType, aggID                 *string
}

func newFakeDeadLetters() *fakeDeadLetters {
	return &fakeDeadLetters{rows: map[string]deadLetterRow{}}
}

func (f *fakeDeadLetters) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if sql != insertDeadLetter {
		return errRow{fmt.Errorf("fake dead-letter table: unexpected query %q", sql)}
	}
	if f.fail > 0 {
		f.fail--
		return errRow{errors.New("fake dead-letter table: connection refused")}
	}
	id := args[0].(string)
	data := args[5].([]byte)
	if old, taken := f.rows[id]; taken {
		// json.Marshal of a map sorts its keys: equal JSON, equal bytes.
		return boolsRow{false, bytes.Equal(old.rowData, data)}
	}
	f.rows[id] = deadLetterRow{id: id, aggType: args[1].(*string), aggID: args[2].(*string), rowData: data,
		topic: args[7].(string), errText: args[8].(string), class: args[9].(string), lsn: args[10].(string)}
	f.order = append(f.order, id)
	return boolsRow{true, false}
}

// put stores a row under id, as another event stored earlier.
func (f *fakeDeadLetters) put(id, rowData string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows[id] = deadLetterRow{id: id, rowData: []byte(rowData)}
}

// stored returns the ids stored through the producer, in order.
func (f *fakeDeadLetters) stored() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.order...)
}

func (f *fakeDeadLetters) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeDeadLetters) row(id string) (deadLetterRow, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.rows[id]
	return r, ok
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type boolsRow struct{ inserted, same bool }

func (r boolsRow) Scan(dest ...any) error {
	*dest[0].(*bool), *dest[1].(*bool) = r.inserted, r.same
	return nil
}

// withDefaults fills what a test leaves unset as newLine does; TopicCreate
// stays as given.
func withDefaults(cfg Config) Config {
	if cfg.Poison == nil {
		cfg.Poison = &Poison{}
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 1 << 20
	}
	if cfg.TopicPartitions == 0 {
		cfg.TopicPartitions = 1
	}
	if cfg.TopicReplication == 0 {
		cfg.TopicReplication = -1
	}
	if cfg.TxnInterval == 0 {
		cfg.TxnInterval = 20 * time.Millisecond
	}
	if cfg.TxnMaxRecords == 0 {
		cfg.TxnMaxRecords = 1000
	}
	return cfg
}

// session is one producer session driven by hand: the test hands it events
// and sees what the tracker acked.
type session struct {
	t      testing.TB
	p      *Producer
	cl     *kgo.Client
	tr     *tracker.Tracker
	in     chan wal.Event
	done   chan error
	fatal  atomic.Bool // onFatal was called
	m      *metrics.Metrics
	log    *logBuffer
	cancel context.CancelFunc
}

// sessionOpts are what a test may change about a session.
type sessionOpts struct {
	router    *route.Router // default: route.DefaultConfig()
	db        *fakeDeadLetters
	m         *metrics.Metrics
	inCap     int    // the stream's channel, default 16
	confirmed uint64 // the tracker's start
	txnID     string // transactional id, default one per test
	opts      []kgo.Opt
	pipeline  bool // a second transactional client (Config.Pipeline)
}

var sessionSeq atomic.Int64

// newSession makes a producer for cfg on a new client; start runs it.
func newSession(t testing.TB, brokers string, cfg Config, o sessionOpts) *session {
	t.Helper()
	cfg = withDefaults(cfg)
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.WithLogger(WatchFailures(nil))},
		ClientOpts(1000, 1<<20, "none", time.Millisecond)...)
	if cfg.Transactional {
		if o.txnID == "" {
			o.txnID = fmt.Sprintf("outbox-connector-mut-%d-%d", time.Now().UnixNano(), sessionSeq.Add(1))
		}
		opts = append(opts, kgo.TransactionalID(o.txnID))
		opts = append(opts, TxnRetryOpts()...)
	}
	opts = append(opts, o.opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if o.pipeline && cfg.Transactional {
		second, err := kgo.NewClient(append(opts, kgo.WithLogger(WatchFailures(nil)), kgo.TransactionalID(o.txnID+"-b"))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(second.Close)
		cfg.Pipeline = second
	}
	if o.router == nil {
		r, err := route.New(route.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		o.router = r
	}
	if o.m == nil {
		o.m = metrics.New()
	}
	if o.inCap == 0 {
		o.inCap = 16
	}
	lb := newLogBuffer(t)
	p := New(cfg, cl, o.router, nil, lb.logger(), o.m)
	if o.db != nil {
		p.pool = o.db
	}
	return &session{t: t, p: p, cl: cl, tr: tracker.New(o.confirmed), in: make(chan wal.Event, o.inCap),
		done: make(chan error, 1), m: o.m, log: lb}
}

func (s *session) start() *session {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s.cancel = cancel
	s.t.Cleanup(cancel)
	go func() { s.done <- s.p.Run(ctx, s.in, func() { s.fatal.Store(true) }) }()
	return s
}

// send hands over one PostgreSQL transaction ending at end.
func (s *session) send(end uint64, rows ...*route.Row) {
	txn := s.tr.Begin(end)
	for _, r := range rows {
		txn.Add()
		s.in <- wal.Event{Txn: txn, Row: r}
	}
	txn.Commit(end)
}

// close ends the stream and returns the producer's error.
func (s *session) close() error {
	close(s.in)
	return s.wait(20 * time.Second)
}

// wait returns the producer's error once Run returned.
func (s *session) wait(timeout time.Duration) error {
	s.t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(timeout):
		s.t.Fatalf("the producer did not return within %v", timeout)
		return nil
	}
}

// raced reports whether the session ended because franz-go ended a
// commit as an abort (errCommitAborted, errCommitSkipped: see endCommit),
// which a relay answers with a new session; any other end fails the test.
func (s *session) raced() bool {
	s.t.Helper()
	select {
	case err := <-s.done:
		if errors.Is(err, errCommitAborted) || errors.Is(err, errCommitSkipped) {
			return true
		}
		s.t.Fatalf("the session ended: %v", err)
	default:
	}
	return false
}

// waitAcked waits until the tracker acked lsn.
func (s *session) waitAcked(lsn uint64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for s.tr.Acked() < lsn {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// rig is a line of sessions (see line) whose producers share a fake
// dead-letter table and metrics: each session reads from the confirmed
// position, until all is confirmed.
type rig struct {
	t         testing.TB
	brokers   string
	cfg       Config
	o         sessionOpts
	txns      []walTxn
	confirmed uint64
	sessions  int
	errs      []error
}

func newRig(t testing.TB, brokers string, cfg Config, o sessionOpts) *rig {
	cfg = withDefaults(cfg)
	if o.m == nil {
		o.m = metrics.New()
	}
	if o.db == nil {
		o.db = newFakeDeadLetters()
	}
	return &rig{t: t, brokers: brokers, cfg: cfg, o: o}
}

func (r *rig) add(end uint64, rows ...*route.Row) {
	r.txns = append(r.txns, walTxn{end: end, rows: rows})
}

// run runs sessions until everything is confirmed, at most max of them.
func (r *rig) run(max int) {
	r.t.Helper()
	last := r.txns[len(r.txns)-1].end
	for r.confirmed < last {
		if r.sessions >= max {
			r.t.Fatalf("not everything confirmed after %d sessions: %d of %d; errors: %v", r.sessions, r.confirmed, last, r.errs)
		}
		r.sessions++
		o := r.o
		o.confirmed = r.confirmed
		s := newSession(r.t, r.brokers, r.cfg, o).start()
	feed:
		for _, tx := range r.txns {
			if tx.end <= r.confirmed {
				continue
			}
			txn := s.tr.Begin(tx.end)
			for _, row := range tx.rows {
				txn.Add()
				select {
				case s.in <- wal.Event{Txn: txn, Row: row}:
				case err := <-s.done:
					s.done <- err
					break feed
				}
			}
			txn.Commit(tx.end)
		}
		err := s.close()
		r.confirmed = s.tr.Acked()
		s.cl.Close()
		if err != nil {
			if fatal.Is(err) {
				r.t.Fatalf("session %d: fatal error: %v", r.sessions, err)
			}
			r.errs = append(r.errs, err)
			r.t.Logf("session %d ended: %v (confirmed %d of %d)", r.sessions, err, r.confirmed, last)
		}
	}
}

// committed returns the records of topic that a read_committed consumer
// reads, up to now: a sentinel record is produced to every partition
// after the test's producers are done, and the records before the
// sentinels are what was committed. A transaction left open holds the
// sentinels back; that fails the test.
func committed(t testing.TB, brokers, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	details, err := kadm.NewClient(pcl).ListTopics(ctx, topic)
	if err == nil {
		err = details[topic].Err
	}
	if err != nil {
		t.Fatalf("look up topic %s: %v", topic, err)
	}
	parts := details[topic].Partitions.Numbers()
	mark := []byte(fmt.Sprint(sessionSeq.Add(1)))
	for _, p := range parts {
		if err := pcl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Headers: []kgo.RecordHeader{{Key: "sentinel", Value: mark}}}).FirstErr(); err != nil {
			t.Fatalf("produce the sentinel to %s/%d: %v", topic, p, err)
		}
	}
	ccl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer ccl.Close()
	var out []*kgo.Record
	seen := map[int32]bool{}
	for len(seen) < len(parts) {
		fs := ccl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("topic %s: sentinels of %d of %d partitions read in 10 s: a Kafka transaction left open holds them back", topic, len(seen), len(parts))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Headers) == 1 && r.Headers[0].Key == "sentinel" {
				// An earlier call's sentinel is skipped; this call's
				// ends the partition.
				if bytes.Equal(r.Headers[0].Value, mark) {
					seen[r.Partition] = true
				}
				return
			}
			if !seen[r.Partition] {
				out = append(out, r)
			}
		})
	}
	return out
}

// ids returns the id headers of records.
func ids(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, testenv.Header(r, "id"))
	}
	return out
}

// unroutableRow is an outbox row without a payload column: the router
// refuses it (missing-field), so it is a dead letter.
func unroutableRow(idCol, id, aggType string, lsn, commit uint64) *route.Row {
	r := eventRow(idCol, id, aggType, "a", `{}`, lsn, commit)
	r.Columns = r.Columns[:len(r.Columns)-1]
	return r
}

// uniq returns a suffix no other test run shares.
func uniq() string { return fmt.Sprint(time.Now().UnixNano() % 1e9) }

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
