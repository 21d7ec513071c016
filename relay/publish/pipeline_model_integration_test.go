package publish

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"pgregory.net/rapid"

	faultstep "github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// A model-based test of the tracker and the producer together, against
// kfake and a real PostgreSQL (for outbox_dead_letter). rapid plays the WAL
// and the world around the pipeline: PostgreSQL transactions of zero to
// four outbox events over two aggregate types and four aggregate ids, some
// of them poison (Kafka refuses them for their own account, every time:
// INVALID_RECORD, POLICY_VIOLATION, INVALID_TIMESTAMP, CORRUPT_MESSAGE,
// MESSAGE_TOO_LARGE), unroutable or too large for
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES; the stream reading them as wal.Stream
// does (Begin, Add and hand over, Commit, keepalives in stream order,
// Abandon when the producer stopped it); broker faults per request
// (retriable ones franz-go retries, a one-off UNKNOWN_SERVER_ERROR that
// makes innocents suspects, INVALID_PRODUCER_EPOCH and PRODUCER_FENCED, a
// retried EndTxn that may already have committed); the steps before and
// after a Kafka commit failing; the lease lost; slow brokers, so acks come
// back in any order; state writes (what PostgreSQL is told); and restarts:
// a graceful stop, the end of a session the producer stopped, and a crash
// (the client closed under the producer, the process's poison memory lost),
// after which a new tracker and producer start from the last confirmed
// position and the stream hands over again every transaction whose commit is
// not below it, as PostgreSQL does.
//
// After every step it reads Kafka (read_committed, up to each partition's
// last stable offset, after sampling the tracker) and the dead-letter table,
// and checks the model of what may be confirmed:
//   - neither the tracker's acked position nor the confirmed one passes the
//     commit of a transaction with an event that is neither in Kafka nor
//     durably dead-lettered (rule 1); neither moves backwards;
//   - nothing is published that the stream did not hand over, and each
//     record is exactly its event, in its place: a good event in its topic
//     (key, value, id header), never a dead letter (rule 9: no innocent is
//     dead-lettered); a refused or unroutable one in the DLQ topic, a too
//     large one in outbox_dead_letter, never in the event's topic;
//   - an event is delivered at most as many times as sessions handed it over
//     (duplicates only after a restart, of what was above the confirmed
//     position);
//   - per aggregate, the first deliveries in its topic partition follow the
//     WAL's order (rule 3), and all of them are on one partition.
//
// At the end the transient faults are cleared (the poison stays poison),
// and sessions run until everything is confirmed, within a bound of
// sessions (rule 9: nothing wedges); then every event must be in its place.
//
// The sampled positions are checked against Kafka as read after the sample,
// so a check can miss an ack the producer reported a little early and that
// Kafka took just after; it cannot report a loss that is not one. The end of
// every session (nothing in flight any more) and the final drain are exact,
// and a crash after an early ack would make it a real loss the later checks
// see.
//
//	go test -run TestPipelineModel ./relay/publish -rapid.checks=200 -rapid.steps=60
//
// make test runs pipelineChecks checks per producer mode; OUTBOX_SOAK=1
// (make soak) runs pipelineSoakChecks.
func TestPipelineModel(t *testing.T) {
	pool := deadLetterPool(t)
	checks := pipelineChecks
	if os.Getenv("OUTBOX_SOAK") == "1" {
		checks = pipelineSoakChecks
	}
	defer rapidFlag(t, "rapid.checks", "RAPID_CHECKS", checks)()
	defer rapidFlag(t, "rapid.steps", "RAPID_STEPS", pipelineSteps)()
	for _, mode := range []string{"transactional", "idempotent"} {
		t.Run(mode, func(t *testing.T) {
			var n atomic.Int64
			st := &pipeStats{counts: map[string]int{}}
			rapid.Check(t, func(rt *rapid.T) {
				h := newPipeline(t, rt, pool, mode == "transactional", n.Add(1))
				h.stats = st
				defer h.close()
				rt.Repeat(h.actions())
				h.drain()
			})
			t.Logf("over %d checks: %s", n.Load(), st)
		})
	}
}

// pipeStats counts what the checks of one mode did, for the log: a model
// test that never restarts, or never refuses a record, proves little.
type pipeStats struct {
	mu     sync.Mutex
	counts map[string]int
}

func (st *pipeStats) add(what string, n int) {
	if st == nil {
		return
	}
	st.mu.Lock()
	st.counts[what] += n
	st.mu.Unlock()
}

func (st *pipeStats) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	keys := slices.Sorted(maps.Keys(st.counts))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, st.counts[k]))
	}
	return strings.Join(parts, ", ")
}

const (
	pipelineChecks     = 6
	pipelineSoakChecks = 60
	pipelineSteps      = 60 // actions per check, on average
)

// rapidFlag sets one of rapid's flags unless the command line or its
// environment variable chose a value, and returns what restores it: each
// check here takes up to a second or two, where rapid's defaults (100
// checks of 30 steps) are meant for checks of microseconds.
func rapidFlag(t *testing.T, name, env string, n int) func() {
	t.Helper()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if _, ok := os.LookupEnv(env); set || ok {
		return func() {}
	}
	f := flag.Lookup(name)
	if f == nil {
		return func() {}
	}
	old := f.Value.String()
	if err := flag.Set(name, strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
	return func() { _ = flag.Set(name, old) }
}

// pipeFate is where an event must end.
type pipeFate uint8

const (
	fateTopic pipeFate = iota // its topic
	fateDLQ                   // the DLQ topic
	fateTable                 // outbox_dead_letter
)

func (f pipeFate) String() string { return [...]string{"topic", "dlq", "table"}[f] }

// pipeEvent is one outbox row of the WAL.
type pipeEvent struct {
	id, topic, key, payload string
	row                     *route.Row
	txn, ord                int // its transaction's index in the WAL; its place in the WAL's order
	fate                    pipeFate
	refused                 *kerr.Error // the error Kafka refuses it with, every time (nil: none)
	mark                    string
}

// pipeTxn is one committed PostgreSQL transaction: final is its commit
// record's LSN (Begin's final LSN), end the end of that record (Commit's).
type pipeTxn struct {
	final, end uint64
	events     []*pipeEvent
}

// pipeSession is one session: a Kafka client, a tracker and a producer,
// and the stream's place in the WAL.
type pipeSession struct {
	n       int
	cl      *kgo.Client
	cl2     *kgo.Client // the pipeline's second transactional client (nil: none)
	tr      *tracker.Tracker
	in      chan wal.Event
	stopped chan struct{} // closed by the producer's onFatal
	exited  chan struct{} // closed once Run returned
	err     error         // Run's result, once exited
	cancel  context.CancelFunc
	valid   atomic.Bool                    // the lease: the producer's Config.Valid
	armed   atomic.Pointer[faultstep.Step] // a step that fails once
	start   uint64

	next   int          // index in the WAL of the next transaction to read
	open   *tracker.Txn // begun and not committed
	row    int          // next row of the open transaction
	pos    uint64       // the stream's last position: its start, a commit end or a keepalive
	prev   uint64       // the acked position last sampled
	halted bool         // the producer stopped the stream
	closed bool         // in is closed
}

// pipeline is the harness of one check.
type pipeline struct {
	t     *testing.T
	rt    *rapid.T
	pool  *pgxpool.Pool
	txnl  bool
	c     *kfake.Cluster
	read  *kgo.Client // reads Kafka for the checks
	parts []pipePart
	m     *metrics.Metrics
	log   *ringLog

	prefix      string // of the event ids, the topics and the transactional id
	types       []string
	dlq         string
	maxMsg      int
	maxInFlight int
	txnInterval time.Duration
	poison      *Poison

	wal       []*pipeTxn
	events    map[string]*pipeEvent
	tip       uint64 // the highest position the WAL has shown
	confirmed uint64 // the last position written as confirmed (the state write)
	offered   map[string]int
	sessions  int
	s         *pipeSession

	transient []*kfake.FaultHandle
	delay     [3]atomic.Int64 // per broker: the next produce requests to delay, and by how much
	delayN    [3]atomic.Int64
	trace     []string
	stats     *pipeStats

	unknownErrs int // one-off UNKNOWN_SERVER_ERRORs injected
	fenced      int // fencing errors injected
}

type pipePart struct {
	topic     string
	id        [16]byte
	partition int32
	leader    int32
}

func newPipeline(t *testing.T, rt *rapid.T, pool *pgxpool.Pool, txnl bool, n int64) *pipeline {
	prefix := fmt.Sprintf("pm%d%s%d", time.Now().UnixNano()%1e8, map[bool]string{true: "t", false: "i"}[txnl], n)
	h := &pipeline{
		t: t, rt: rt, pool: pool, txnl: txnl, prefix: prefix, m: metrics.New(), log: &ringLog{},
		types:       []string{prefix + "a", prefix + "b"},
		dlq:         prefix + ".dlq",
		maxMsg:      16 << 10,
		maxInFlight: rapid.IntRange(2, 64).Draw(rt, "max in flight"),
		txnInterval: time.Duration(rapid.IntRange(2, 40).Draw(rt, "txn interval ms")) * time.Millisecond,
		poison:      &Poison{},
		events:      map[string]*pipeEvent{},
		offered:     map[string]int{},
	}
	h.tip = uint64(rapid.IntRange(100, 1000).Draw(rt, "start"))
	h.confirmed = h.tip
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, "outbox.event."+h.types[0], "outbox.event."+h.types[1]), kfake.SeedTopics(1, h.dlq))
	if err != nil {
		rt.Fatalf("start kfake: %v", err)
	}
	h.c = c
	// Slow brokers: the produce requests a broker is told to delay wait
	// there, so partitions led by other brokers are acked first.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		node := c.CurrentNode()
		if node < 0 || int(node) >= len(h.delay) {
			return nil, nil, false
		}
		if h.delayN[node].Add(-1) >= 0 {
			d := time.Duration(h.delay[node].Load())
			c.SleepControl(func() { time.Sleep(d) })
		} else {
			h.delayN[node].Store(0)
		}
		return nil, nil, false
	})
	h.read, err = kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		rt.Fatalf("reader client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	details, err := kadm.NewClient(h.read).ListTopics(ctx, "outbox.event."+h.types[0], "outbox.event."+h.types[1], h.dlq)
	if err != nil {
		rt.Fatalf("list topics: %v", err)
	}
	for _, td := range details.Sorted() {
		if td.Err != nil {
			rt.Fatalf("topic %s: %v", td.Topic, td.Err)
		}
		for _, pd := range td.Partitions.Sorted() {
			h.parts = append(h.parts, pipePart{topic: td.Topic, id: td.ID, partition: pd.Partition, leader: pd.Leader})
		}
	}
	h.tracef("check %s: %s mode, max in flight %d, txn interval %s, start %d", prefix, map[bool]string{true: "transactional", false: "idempotent"}[txnl], h.maxInFlight, h.txnInterval, h.tip)
	return h
}

func (h *pipeline) close() {
	if h.s != nil {
		h.s.cancel()
		h.s.close()
		select {
		case <-h.s.exited:
		case <-time.After(10 * time.Second):
		}
	}
	h.read.Close()
	h.c.Close()
}

func (h *pipeline) tracef(format string, args ...any) {
	h.trace = append(h.trace, fmt.Sprintf(format, args...))
}

// fail reports a broken invariant with the trace of the check and the
// producer's last log lines, also written to a file named in the message:
// a failure rapid cannot reproduce (Kafka's timing differs on each run)
// keeps its trace there.
func (h *pipeline) fail(format string, args ...any) {
	h.rt.Helper()
	msg := fmt.Sprintf(format, args...)
	start := max(0, len(h.trace)-150)
	out := fmt.Sprintf("%s\n\ntrace (last %d of %d steps):\n  %s\n\nproducer log (last lines):\n%s\n",
		msg, len(h.trace)-start, len(h.trace), strings.Join(h.trace[start:], "\n  "), h.log.String())
	path := filepath.Join(os.TempDir(), "pipeline-model-"+h.prefix+".trace")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		path = "(not written: " + err.Error() + ")"
	}
	h.rt.Log(out)
	h.rt.Fatalf("%s (trace in %s)", msg, path)
}

// write appends a committed PostgreSQL transaction to the WAL.
func (h *pipeline) write(rt *rapid.T) {
	n := rapid.IntRange(0, 4).Draw(rt, "events")
	base := h.tip + uint64(rapid.IntRange(1, 30).Draw(rt, "gap"))
	tx := &pipeTxn{final: base + uint64(n) + 1}
	tx.end = tx.final + uint64(rapid.IntRange(1, 3).Draw(rt, "commit size"))
	ti := len(h.wal)
	var desc []string
	for i := range n {
		ord := len(h.events)
		ev := &pipeEvent{
			id:  fmt.Sprintf("%s-%d", h.prefix, ord),
			key: fmt.Sprintf("k%d", rapid.IntRange(0, 3).Draw(rt, "aggregate id")),
			txn: ti, ord: ord,
		}
		aggType := h.types[rapid.IntRange(0, 1).Draw(rt, "aggregate type")]
		ev.topic = "outbox.event." + aggType
		ev.payload = fmt.Sprintf(`{"ord": %d}`, ord)
		kind := rapid.IntRange(0, 39).Draw(rt, "kind")
		unroutable := false
		switch {
		case kind < 30: // a good event
		case kind < 32:
			unroutable = true
			ev.fate = fateDLQ
		case kind < 33:
			ev.payload = fmt.Sprintf(`{"ord": %d, "pad": "%s"}`, ord, strings.Repeat("p", h.maxMsg))
			ev.fate = fateTable
		default:
			ev.refused = []*kerr.Error{kerr.InvalidRecord, kerr.PolicyViolation, kerr.InvalidTimestamp, kerr.CorruptMessage, kerr.MessageTooLarge}[kind%5]
			ev.mark = poisonMark + ev.id + ">" // no mark holds another
			ev.payload = fmt.Sprintf(`{"ord": %d, "mark": "%s"}`, ord, ev.mark)
			ev.fate = fateDLQ
			if ev.refused == kerr.MessageTooLarge {
				ev.fate = fateTable
			}
		}
		ev.row = eventRow("id", ev.id, aggType, ev.key, ev.payload, base+uint64(i)+1, tx.final)
		if unroutable {
			ev.row.Columns = slices.DeleteFunc(ev.row.Columns, func(c route.Column) bool { return c.Name == "payload" })
		}
		if ev.refused != nil {
			h.refuse(ev)
		}
		tx.events = append(tx.events, ev)
		h.events[ev.id] = ev
		d := ev.id + " " + strings.TrimPrefix(ev.topic, "outbox.event."+h.prefix) + "/" + ev.key
		switch {
		case ev.refused != nil:
			d += " refused " + ev.refused.Message
		case unroutable:
			d += " unroutable"
		case ev.fate == fateTable:
			d += " too large"
		}
		desc = append(desc, d)
	}
	h.wal = append(h.wal, tx)
	h.tip = tx.end
	h.tracef("write txn #%d final %d end %d: [%s]", ti, tx.final, tx.end, strings.Join(desc, ", "))
}

// refuse makes Kafka refuse, every time, a batch of the event's topic
// partition that holds it.
func (h *pipeline) refuse(ev *pipeEvent) {
	part := kgo.StickyKeyPartitioner(nil).ForTopic(ev.topic).Partition(&kgo.Record{Key: []byte(ev.key)}, 3)
	var id [16]byte
	for _, p := range h.parts {
		if p.topic == ev.topic {
			id = p.id
		}
	}
	mark := []byte(ev.mark)
	h.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: ev.topic, Partitions: []int32{int32(part)}, Err: ev.refused, Count: -1,
		When: func(req kmsg.Request) bool {
			pr, ok := req.(*kmsg.ProduceRequest)
			if !ok {
				return false
			}
			for _, pt := range pr.Topics {
				if pt.Topic != ev.topic && pt.TopicID != id {
					continue
				}
				for _, p := range pt.Partitions {
					if p.Partition == int32(part) && strings.Contains(string(p.Records), string(mark)) {
						return true
					}
				}
			}
			return false
		}})
}

// poisonMark begins every poison event's mark.
const poisonMark = "<poison "

// fault installs a fault that passes: removed at the drain. A produce
// fault spares the requests that carry a poison event: kfake answers a
// partition with the first fault that matches, and one that appends before
// it answers (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND) would
// write a record no broker takes, every broker checking a record before it
// appends it.
func (h *pipeline) fault(f kfake.Fault) {
	if slices.Contains(f.Keys, kmsg.Produce) {
		f.When = func(req kmsg.Request) bool {
			pr, ok := req.(*kmsg.ProduceRequest)
			if !ok {
				return true
			}
			for _, pt := range pr.Topics {
				for _, p := range pt.Partitions {
					if strings.Contains(string(p.Records), poisonMark) {
						return false
					}
				}
			}
			return true
		}
	}
	h.transient = append(h.transient, h.c.Fault(f))
}

// startSession starts a session from the confirmed position, as the relay
// does: a new Kafka client (transactional: fencing the previous epoch
// first), a new tracker and producer, and the stream from the first
// transaction whose commit is not below the position.
func (h *pipeline) startSession() {
	h.sessions++
	s := &pipeSession{n: h.sessions, start: h.confirmed, pos: h.confirmed, prev: h.confirmed,
		in: make(chan wal.Event, 8), stopped: make(chan struct{}), exited: make(chan struct{})}
	s.valid.Store(true)
	opts := []kgo.Opt{kgo.SeedBrokers(h.c.ListenAddrs()...)}
	opts = append(opts, ClientOpts(h.maxInFlight, h.maxMsg, "none", time.Millisecond)...)
	// The relay's retry settings for transactional clients, here for both
	// modes: franz-go's default backoff (250 ms and up), which the relay's
	// idempotent clients keep, would make every retriable fault cost a
	// quarter of a second of the test's time.
	opts = append(opts, TxnRetryOpts()...)
	// franz-go's own lines go to the trace's log too, at info: a failure
	// of a Kafka transaction is told there.
	opts = append(opts, kgo.WithLogger(WatchFailures(kgo.BasicLogger(h.log, kgo.LogLevelInfo, func() string { return "kgo session " + strconv.Itoa(s.n) + " " }))))
	if h.txnl {
		opts = append(opts, kgo.TransactionalID("outbox-connector-"+h.prefix))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		h.fail("new Kafka client: %v", err)
	}
	s.cl = cl
	// Every other transactional session commits pipelined, as the relay
	// does by default (Config.Pipeline); every one fences the pipeline's
	// transactional id, as the relay does, or a transaction an earlier
	// pipelined session left open there would hold read_committed readers
	// back until its timeout.
	if h.txnl {
		cl2, err := kgo.NewClient(append(opts, kgo.TransactionalID("outbox-connector-"+h.prefix+"-b"))...)
		if err != nil {
			h.fail("new Kafka client: %v", err)
		}
		s.cl2 = cl2
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.tr = tracker.New(s.start)
	s.next = len(h.wal)
	for i, tx := range h.wal {
		if tx.final >= s.start {
			s.next = i
			break
		}
	}
	h.s = s
	if h.txnl {
		for _, c := range []*kgo.Client{cl, s.cl2} {
			if c == nil {
				continue
			}
			ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
			_, _, err := c.ProducerID(ictx)
			icancel()
			if err != nil {
				h.fail("session %d: initialise the transactional producer: %v", s.n, err)
			}
		}
		if s.n%2 != 0 {
			s.cl2.Close()
			s.cl2 = nil
		}
	}
	token := strconv.Itoa(s.n)
	cfg := Config{
		DLQTopic: h.dlq, MaxMessageBytes: h.maxMsg, TopicCreate: true, TopicPartitions: 3, TopicReplication: -1,
		Headers: func() []kgo.RecordHeader {
			return []kgo.RecordHeader{{Key: "outbox.lease.token", Value: []byte(token)}}
		},
		Transactional: h.txnl, TxnInterval: h.txnInterval, TxnMaxRecords: h.maxInFlight,
		Poison: h.poison, Valid: s.valid.Load, Pipeline: s.cl2,
		Faults: func(step faultstep.Step) error {
			if a := s.armed.Load(); a != nil && *a == step && s.armed.CompareAndSwap(a, nil) {
				return fmt.Errorf("injected by the model at %s", step)
			}
			return nil
		},
	}
	p := New(cfg, cl, h.router(), h.pool, slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelInfo})).With("session", s.n), h.m)
	var once sync.Once
	go func() {
		defer close(s.exited)
		s.err = p.Run(ctx, s.in, func() { once.Do(func() { close(s.stopped) }) })
	}()
	h.tracef("session %d starts at %d (WAL txn #%d on)", s.n, s.start, s.next)
}

// close closes the session's clients.
func (s *pipeSession) close() {
	s.cl.Close()
	if s.cl2 != nil {
		s.cl2.Close()
	}
}

var pipelineRouter = sync.OnceValues(func() (*route.Router, error) { return route.New(route.DefaultConfig()) })

func (h *pipeline) router() *route.Router {
	r, err := pipelineRouter()
	if err != nil {
		h.fail("router: %v", err)
	}
	return r
}

// live returns the running session, starting one (after ending one the
// producer stopped) when there is none.
func (h *pipeline) live() *pipeSession {
	if h.s != nil && h.s.halted {
		h.endSession("the producer stopped it", false)
	}
	if h.s == nil {
		h.startSession()
	}
	return h.s
}

const wedgeTimeout = 30 * time.Second

// hand gives one event to the producer, as Stream.emit does: counted with
// Add, withdrawn with Abandon when the producer stopped the stream.
func (h *pipeline) hand(s *pipeSession, ev *pipeEvent) bool {
	s.open.Add()
	select {
	case s.in <- wal.Event{Txn: s.open, Row: ev.row}:
		h.offered[ev.id]++
		return true
	case <-s.stopped:
	case <-s.exited:
	case <-time.After(wedgeTimeout):
		h.fail("session %d: the producer took no event for %s (wedged); event %s waits", s.n, wedgeTimeout, ev.id)
	}
	s.open.Abandon()
	s.halted = true
	h.tracef("session %d: the producer stopped the stream at %s", s.n, ev.id)
	return false
}

// readSteps reads up to k messages of the stream: a Begin, a row, a Commit.
func (h *pipeline) readSteps(k int) {
	s := h.live()
	var read []string
	defer func() {
		if len(read) > 0 {
			h.tracef("session %d reads: %s", s.n, strings.Join(read, " "))
		}
	}()
	for range k {
		if s.halted {
			return
		}
		if s.open == nil {
			if s.next == len(h.wal) {
				return
			}
			s.open = s.tr.Begin(h.wal[s.next].final)
			s.row = 0
			read = append(read, fmt.Sprintf("begin#%d", s.next))
			continue
		}
		tx := h.wal[s.next]
		if s.row < len(tx.events) {
			if h.hand(s, tx.events[s.row]) {
				read = append(read, strings.TrimPrefix(tx.events[s.row].id, h.prefix))
				s.row++
			}
			continue
		}
		read = append(read, fmt.Sprintf("commit#%d", s.next))
		s.open.Commit(tx.end)
		s.open = nil
		s.pos = tx.end
		s.next++
	}
}

// keepalive reports a WAL end the walsender may send here: never past a
// transaction it has not sent (the next one's commit).
func (h *pipeline) keepalive(rt *rapid.T) {
	s := h.live()
	if s.halted || s.open != nil {
		rt.Skip("inside a transaction, or stopped")
	}
	hi := h.tip + 30
	if s.next < len(h.wal) {
		hi = h.wal[s.next].final
	}
	w := rapid.Uint64Range(s.pos, hi).Draw(rt, "wal end")
	s.tr.ServerWALEnd(w)
	s.pos = w
	h.tip = max(h.tip, w)
	h.tracef("session %d: keepalive %d", s.n, w)
}

// endSession ends the session: a crash closes the client under the
// producer and keeps the last state write; otherwise the stream stops, the
// producer flushes, and (unless it stopped with an error, when the last
// state write stands unless confirmAcked) the acked position is written.
func (h *pipeline) endSession(why string, crash bool) {
	s := h.s
	if s == nil {
		return
	}
	if crash {
		s.cancel()
		go s.close()
	}
	if !s.closed {
		close(s.in)
		s.closed = true
	}
	select {
	case <-s.exited:
	case <-time.After(wedgeTimeout):
		h.fail("session %d: the producer did not return within %s of the stream's end", s.n, wedgeTimeout)
	}
	s.cancel()
	s.close()
	acked := s.tr.Acked()
	s.tr.Reset()
	h.checkAt(acked, "session end")
	switch {
	case crash:
		// A process that died: its memory of poison is gone too.
		h.poison = &Poison{}
	case s.err == nil || why == "confirm acked":
		h.setConfirmed(acked)
	}
	h.tracef("session %d ends (%s): acked %d, confirmed %d, producer: %v", s.n, why, acked, h.confirmed, s.err)
	h.stats.add("sessions", 1)
	if s.err != nil && !errors.Is(s.err, context.Canceled) {
		h.stats.add("sessions the producer ended", 1)
	}
	h.s = nil
}

func (h *pipeline) setConfirmed(v uint64) {
	if v < h.confirmed {
		h.fail("the confirmed position moves backwards: %d after %d", v, h.confirmed)
	}
	h.confirmed = v
}

// kafkaView is what Kafka and outbox_dead_letter hold.
type kafkaView struct {
	parts map[partKey][]*kgo.Record // by offset
	table map[string]bool
}

// readKafka reads every partition up to its last stable offset,
// read_committed (records of aborted transactions are not returned), and
// the dead-letter table's rows of this check.
func (h *pipeline) readKafka() *kafkaView {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v := &kafkaView{parts: map[partKey][]*kgo.Record{}, table: map[string]bool{}}
	for _, pt := range h.parts {
		var off int64
		for {
			req := kmsg.NewPtrFetchRequest()
			req.ReplicaID = -1
			req.MaxWaitMillis = 0
			req.MaxBytes = 32 << 20
			req.IsolationLevel = 1
			rtp := kmsg.NewFetchRequestTopic()
			rtp.Topic, rtp.TopicID = pt.topic, pt.id
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = pt.partition, off, 16<<20
			rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
			rtp.Partitions = append(rtp.Partitions, rp)
			req.Topics = append(req.Topics, rtp)
			resp, err := req.RequestWith(ctx, h.read.Broker(int(pt.leader)))
			if err != nil {
				h.fail("fetch %s/%d at %d: %v", pt.topic, pt.partition, off, err)
			}
			if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
				h.fail("fetch %s/%d at %d: unexpected response shape", pt.topic, pt.partition, off)
			}
			p := &resp.Topics[0].Partitions[0]
			if p.ErrorCode != 0 {
				h.fail("fetch %s/%d at %d: %v", pt.topic, pt.partition, off, kerr.ErrorForCode(p.ErrorCode))
			}
			if off >= p.LastStableOffset {
				break
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, IsolationLevel: kgo.ReadCommitted(), Topic: pt.topic, Partition: pt.partition},
				p, kgo.DefaultDecompressor(), nil)
			if fp.Err != nil {
				h.fail("decode %s/%d at %d: %v", pt.topic, pt.partition, off, fp.Err)
			}
			if next <= off {
				h.fail("fetch %s/%d at %d: no progress below the last stable offset %d", pt.topic, pt.partition, off, p.LastStableOffset)
			}
			k := partKey{pt.topic, pt.partition}
			v.parts[k] = append(v.parts[k], fp.Records...)
			off = next
		}
	}
	rows, err := h.pool.Query(ctx, `SELECT id FROM public.outbox_dead_letter WHERE starts_with(id, $1)`, h.prefix+"-")
	if err != nil {
		h.fail("read outbox_dead_letter: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			h.fail("read outbox_dead_letter: %v", err)
		}
		if v.table[id] {
			h.fail("outbox_dead_letter holds %s twice", id)
		}
		v.table[id] = true
	}
	if err := rows.Err(); err != nil {
		h.fail("read outbox_dead_letter: %v", err)
	}
	return v
}

// copies describes the records of event id: where, and under which
// producer id and epoch.
func (v *kafkaView) copies(id string) string {
	var out []string
	for k, recs := range v.parts {
		for _, r := range recs {
			if rid, _ := header(r, "id"); rid == id {
				token, _ := header(r, "outbox.lease.token")
				out = append(out, fmt.Sprintf("%s/%d@%d (producer %d epoch %d, session %s)", k.topic, k.partition, r.Offset, r.ProducerID, r.ProducerEpoch, token))
			}
		}
	}
	if v.table[id] {
		out = append(out, "outbox_dead_letter")
	}
	return strings.Join(out, ", ")
}

// uncommitted describes, for a failure's message, the partition an event
// belongs to as read_uncommitted: every batch, data or control, with its
// producer, and where the event is; and the aborted transactions a
// read_committed fetch names.
func (h *pipeline) uncommitted(ev *pipeEvent) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	part := kgo.StickyKeyPartitioner(nil).ForTopic(ev.topic).Partition(&kgo.Record{Key: []byte(ev.key)}, 3)
	var out []string
	for _, pt := range h.parts {
		if pt.topic != ev.topic || pt.partition != int32(part) {
			continue
		}
		for _, level := range []int8{0, 1} {
			req := kmsg.NewPtrFetchRequest()
			req.ReplicaID, req.MaxBytes, req.IsolationLevel = -1, 32<<20, level
			rtp := kmsg.NewFetchRequestTopic()
			rtp.Topic, rtp.TopicID = pt.topic, pt.id
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch, rp.LogStartOffset = pt.partition, 16<<20, -1, -1
			rtp.Partitions = append(rtp.Partitions, rp)
			req.Topics = append(req.Topics, rtp)
			resp, err := req.RequestWith(ctx, h.read.Broker(int(pt.leader)))
			if err != nil || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
				return fmt.Sprintf("fetch failed: %v", err)
			}
			p := resp.Topics[0].Partitions[0]
			if level == 1 {
				for _, at := range p.AbortedTransactions {
					out = append(out, fmt.Sprintf("aborted: producer %d from %d", at.ProducerID, at.FirstOffset))
				}
				out = append(out, fmt.Sprintf("last stable offset %d, high watermark %d", p.LastStableOffset, p.HighWatermark))
				continue
			}
			raw := p.RecordBatches
			for len(raw) >= 12 {
				n := 12 + int(binary.BigEndian.Uint32(raw[8:12]))
				if n > len(raw) {
					break
				}
				var b kmsg.RecordBatch
				if err := b.ReadFrom(raw[:n]); err != nil {
					break
				}
				raw = raw[n:]
				kind := "data"
				if b.Attributes&0x20 != 0 {
					kind = "control"
				}
				holds := ""
				if bytes.Contains(b.Records, []byte(ev.payload)) {
					holds = " <- holds " + ev.id
				}
				out = append(out, fmt.Sprintf("%s batch @%d+%d producer %d epoch %d txn %v%s", kind, b.FirstOffset, b.NumRecords, b.ProducerID, b.ProducerEpoch, b.Attributes&0x10 != 0, holds))
			}
		}
	}
	return strings.Join(out, "; ")
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, hd := range r.Headers {
		if hd.Key == key {
			return string(hd.Value), true
		}
	}
	return "", false
}

// check samples the session's acked position, then reads Kafka, and checks
// the model against both.
func (h *pipeline) check() {
	acked, ok := uint64(0), false
	if s := h.s; s != nil {
		acked, ok = s.tr.Acked(), true
		if acked < s.prev {
			h.fail("session %d: acked moves backwards: %d after %d", s.n, acked, s.prev)
		}
		if acked < s.start {
			h.fail("session %d: acked %d is behind the position it started at, %d", s.n, acked, s.start)
		}
		s.prev = acked
	}
	if !ok {
		acked = h.confirmed
	}
	h.checkAt(acked, "step")
}

// checkAt checks that acked (sampled before this call) and the confirmed
// position are allowed by what Kafka and the table hold now, and that what
// they hold is right.
func (h *pipeline) checkAt(acked uint64, when string) *kafkaView {
	if acked < h.confirmed {
		h.fail("%s: acked %d is behind the confirmed position %d", when, acked, h.confirmed)
	}
	v := h.readKafka()
	got := map[string]int{}
	for k, recs := range v.parts {
		isDLQ := k.topic == h.dlq
		for _, r := range recs {
			id, _ := header(r, "id")
			ev := h.events[id]
			switch {
			case ev == nil:
				h.fail("%s: %s/%d offset %d holds a record that is no event of the WAL (id %q): a phantom", when, k.topic, k.partition, r.Offset, id)
			case h.offered[id] == 0:
				h.fail("%s: event %s is in %s, but no session handed it over", when, id, k.topic)
			case isDLQ && ev.fate != fateDLQ:
				h.fail("%s: event %s (for %s) is in the DLQ topic; it belongs in %s", when, id, ev.fate, ev.fate)
			case !isDLQ && ev.fate != fateTopic:
				h.fail("%s: event %s is in its topic %s/%d; it belongs in %s (Kafka refuses it: %v)", when, id, k.topic, k.partition, ev.fate, ev.refused)
			case !isDLQ && (k.topic != ev.topic || string(r.Key) != ev.key || string(r.Value) != ev.payload):
				h.fail("%s: event %s is %s/%d key %q value %s; want %s key %q value %s", when, id, k.topic, k.partition, r.Key, r.Value, ev.topic, ev.key, ev.payload)
			case isDLQ && !strings.Contains(string(r.Value), `"aggregateid":"`+ev.key+`"`):
				h.fail("%s: the dead letter of %s does not hold its row: %s", when, id, r.Value)
			}
			got[id]++
		}
	}
	for id := range v.table {
		ev := h.events[id]
		switch {
		case ev == nil:
			h.fail("%s: outbox_dead_letter holds %s, no event of the WAL", when, id)
		case ev.fate != fateTable:
			h.fail("%s: event %s is in outbox_dead_letter; it belongs in %s", when, id, ev.fate)
		case h.offered[id] == 0:
			h.fail("%s: event %s is in outbox_dead_letter, but no session handed it over", when, id)
		}
		got[id]++
	}
	// Duplicates only from sessions that handed the event over again (a
	// restart reads again what is above the confirmed position): at most
	// one copy per session (the lease token header names the session), and
	// no more sessions than handed it over.
	type sessionCopy struct{ id, session string }
	seen := map[sessionCopy]bool{}
	sessionsOf := map[string]int{}
	for _, recs := range v.parts {
		for _, r := range recs {
			id, _ := header(r, "id")
			token, _ := header(r, "outbox.lease.token")
			sc := sessionCopy{id, token}
			if seen[sc] {
				h.fail("%s: event %s delivered more than once by session %s; its copies: %s", when, id, token, v.copies(id))
			}
			seen[sc] = true
			sessionsOf[id]++
		}
	}
	for id, n := range got {
		if sessionsOf[id] > h.offered[id] || n > h.offered[id] {
			h.fail("%s: event %s delivered %d times by %d sessions, handed over by %d; its copies: %s", when, id, n, sessionsOf[id], h.offered[id], v.copies(id))
		}
	}
	// Rule 1: nothing confirmed past a transaction with an event that is
	// neither in Kafka nor dead-lettered. PostgreSQL sends, at the next
	// start, only the transactions whose commit is not below the position.
undelivered:
	for i, tx := range h.wal {
		for _, ev := range tx.events {
			if got[ev.id] > 0 {
				continue
			}
			if acked > tx.final || h.confirmed > tx.final {
				h.fail("%s: acked %d (confirmed %d) passes WAL txn #%d (commit at %d), whose event %s (%s) is neither in Kafka nor dead-lettered; the partition as read_uncommitted: %s",
					when, acked, h.confirmed, i, tx.final, ev.id, ev.fate, h.uncommitted(ev))
			}
			break undelivered // the first undelivered transaction decides
		}
	}
	// Rule 3: per aggregate, first deliveries in WAL order, on one
	// partition.
	place := map[string]partKey{}
	for k, recs := range v.parts {
		if k.topic == h.dlq {
			continue
		}
		last := map[string]int{}
		seen := map[string]bool{}
		for _, r := range recs {
			id, _ := header(r, "id")
			ev := h.events[id]
			agg := k.topic + "/" + ev.key
			if p, ok := place[agg]; ok && p != k {
				h.fail("%s: aggregate %s is on partitions %d and %d", when, agg, p.partition, k.partition)
			}
			place[agg] = k
			if seen[id] {
				continue
			}
			seen[id] = true
			if l, ok := last[agg]; ok && ev.ord < l {
				h.fail("%s: aggregate %s: the first delivery of %s (WAL #%d) comes after that of WAL #%d at %s/%d offset %d", when, agg, id, ev.ord, l, k.topic, k.partition, r.Offset)
			}
			last[agg] = ev.ord
		}
	}
	return v
}

// drain clears the faults that pass (poison stays poison) and runs
// sessions until everything is confirmed; then every event must be in its
// place.
func (h *pipeline) drain() {
	for _, f := range h.transient {
		f.Remove()
	}
	for i := range h.delayN {
		h.delayN[i].Store(0)
	}
	h.tracef("drain: faults cleared")
	bound := 3
	for _, ev := range h.events {
		switch {
		case ev.refused == kerr.CorruptMessage:
			bound += 4 // convicted at its third refusal alone
		case ev.refused != nil:
			bound += 2
		}
	}
	target := h.tip
	quirks := 0
	for n := 0; h.confirmed < target; n++ {
		if n == bound {
			h.fail("not everything confirmed after %d sessions without faults: confirmed %d of %d", n, h.confirmed, target)
		}
		s := h.live()
		h.readSteps(1 << 30)
		if !s.halted && s.open == nil && s.pos < h.tip {
			s.tr.ServerWALEnd(h.tip)
			s.pos = h.tip
		}
		// Stopped by the producer (a refused record) or not, the state
		// writer wrote what the tracker acked.
		h.endSession("confirm acked", false)
		if (errors.Is(s.err, errCommitAborted) || errors.Is(s.err, errCommitSkipped)) && quirks < 10 {
			// franz-go aborted a transaction whose records were produced
			// (with kfake, now and then, when a new client first produces
			// to a topic inside a transaction): the producer ends the
			// session, losing nothing, and the next reads again. Not a
			// fault the drain cleared: it does not count.
			quirks++
			bound++
			h.stats.add("drain sessions franz-go's abort ended", 1)
		}
	}
	v := h.checkAt(h.confirmed, "drained")
	for _, ev := range h.events {
		var n int
		switch ev.fate {
		case fateTable:
			if v.table[ev.id] {
				n = 1
			}
		default:
			for k, recs := range v.parts {
				if (ev.fate == fateDLQ) != (k.topic == h.dlq) {
					continue
				}
				for _, r := range recs {
					if id, _ := header(r, "id"); id == ev.id {
						n++
					}
				}
			}
		}
		if n == 0 {
			h.fail("drained: event %s (WAL txn #%d) is not in %s: lost", ev.id, ev.txn, ev.fate)
		}
	}
	if n := metricValue(h.t, h.m.Registry, "outbox_connector_order_violations_total", nil); n > 0 {
		h.fail("outbox_connector_order_violations_total = %v", n)
	}
	delivered := len(v.table)
	for _, recs := range v.parts {
		delivered += len(recs)
	}
	h.stats.add("duplicates", delivered-len(h.events))
	h.stats.add("transactions", len(h.wal))
	h.stats.add("events", len(h.events))
	for _, ev := range h.events {
		h.stats.add("events to "+ev.fate.String(), 1)
	}
}

func (h *pipeline) actions() map[string]func(*rapid.T) {
	acts := map[string]func(*rapid.T){}
	for name, f := range h.rawActions() {
		if name == "" {
			acts[name] = f
			continue
		}
		// rapid picks among the actions' names, sorted, and leans towards
		// the first ones: the WAL and the stream moving come first, and
		// under several names, so that they come more often than any one
		// fault.
		n, ok := map[string]int{"write": 4, "read": 6, "settle": 3, "tick": 2, "keepalive": 1}[name]
		group := "1 "
		if ok {
			group = "0 "
		}
		for i := range max(n, 1) {
			acts[fmt.Sprintf("%s%s#%d", group, name, i)] = func(rt *rapid.T) {
				f(rt)
				h.stats.add("action "+name, 1)
			}
		}
	}
	return acts
}

func (h *pipeline) rawActions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"write": func(rt *rapid.T) { h.write(rt) },
		"read": func(rt *rapid.T) {
			k := rapid.IntRange(1, 12).Draw(rt, "messages")
			h.readSteps(k)
		},
		"keepalive": func(rt *rapid.T) { h.keepalive(rt) },
		// settle lets Kafka answer: it waits until nothing is in flight,
		// or the producer stopped.
		"settle": func(rt *rapid.T) {
			s := h.live()
			deadline := time.Now().Add(5 * time.Second)
			for s.tr.Positions().InFlight > 0 && !s.halted && time.Now().Before(deadline) {
				select {
				case <-s.tr.Changed():
				case <-s.stopped:
					s.halted = true
				case <-time.After(10 * time.Millisecond):
				}
			}
		},
		// tick is the state writer: the acked position is written as
		// confirmed.
		"tick": func(rt *rapid.T) {
			if h.s == nil {
				rt.Skip("no session")
			}
			h.setConfirmed(h.s.tr.Acked())
			h.tracef("session %d: confirmed %d", h.s.n, h.confirmed)
		},
		"retriable fault": func(rt *rapid.T) {
			f := kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Count: rapid.IntRange(1, 3).Draw(rt, "count"),
				Err: rapid.SampledFrom([]*kerr.Error{kerr.NotLeaderForPartition, kerr.RequestTimedOut, kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend}).Draw(rt, "error")}
			if i := rapid.IntRange(0, 2).Draw(rt, "topic"); i < 2 {
				f.Topic = "outbox.event." + h.types[i]
			}
			h.fault(f)
			h.tracef("fault: produce %q answered %s, %d times", f.Topic, f.Err.Message, f.Count)
		},
		// A one-off error that is no record's: its batch's records become
		// suspects, are produced alone, and pass. Fewer than
		// maxAloneRefusals of them in a check: a record refused alone that
		// often with an error that may not be its own is convicted all the
		// same (poison.go), as the line must not wedge; the model could not
		// tell that innocent from a guilty one.
		"unknown server error": func(rt *rapid.T) {
			if h.unknownErrs == maxAloneRefusals-1 {
				rt.Skip("as many passing UNKNOWN_SERVER_ERRORs as may hit one record")
			}
			h.unknownErrs++
			f := kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.event." + h.types[rapid.IntRange(0, 1).Draw(rt, "topic")], Err: kerr.UnknownServerError}
			h.fault(f)
			h.tracef("fault: produce %q answered %s once", f.Topic, f.Err.Message)
		},
		// Kafka fences the producer, once; twice in a check at most: each
		// costs an idempotent client a reload of its producer id (half a
		// second).
		"fenced": func(rt *rapid.T) {
			if h.fenced == 2 {
				rt.Skip("fenced twice already")
			}
			h.fenced++
			f := kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.InvalidProducerEpoch}
			if h.txnl && rapid.Bool().Draw(rt, "at commit") {
				f = kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.ProducerFenced}
			}
			h.fault(f)
			h.tracef("fault: %v answered %s once", f.Keys, f.Err.Message)
		},
		// EndTxn answered with an error franz-go retries; REQUEST_TIMED_OUT
		// after the commit happened.
		"end txn fault": func(rt *rapid.T) {
			if !h.txnl {
				rt.Skip("no Kafka transactions")
			}
			f := kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: rapid.SampledFrom([]*kerr.Error{kerr.CoordinatorNotAvailable, kerr.NotCoordinator, kerr.ConcurrentTransactions, kerr.RequestTimedOut}).Draw(rt, "error")}
			h.fault(f)
			h.tracef("fault: EndTxn answered %s once", f.Err.Message)
		},
		"commit step fault": func(rt *rapid.T) {
			if !h.txnl {
				rt.Skip("no Kafka transactions")
			}
			s := h.live()
			step := rapid.SampledFrom([]faultstep.Step{faultstep.BeforeKafkaCommit, faultstep.AfterKafkaCommit}).Draw(rt, "step")
			s.armed.Store(&step)
			h.tracef("session %d: the next %s fails", s.n, step)
		},
		"lose lease": func(rt *rapid.T) {
			s := h.live()
			s.valid.Store(false)
			h.tracef("session %d: the lease is lost", s.n)
		},
		"slow broker": func(rt *rapid.T) {
			node := rapid.IntRange(0, 2).Draw(rt, "node")
			d := time.Duration(rapid.IntRange(1, 30).Draw(rt, "delay ms")) * time.Millisecond
			n := rapid.IntRange(1, 5).Draw(rt, "requests")
			h.delay[node].Store(int64(d))
			h.delayN[node].Store(int64(n))
			h.tracef("broker %d delays its next %d produce requests by %s", node, n, d)
		},
		"restart": func(rt *rapid.T) {
			if h.s == nil {
				rt.Skip("no session")
			}
			switch rapid.IntRange(0, 2).Draw(rt, "how") {
			case 0:
				h.endSession("crash", true)
			case 1:
				h.endSession("graceful stop", false)
			default:
				h.endSession("confirm acked", false)
			}
		},
		"": func(*rapid.T) { h.check() },
	}
}

// ringLog keeps the producer's last log lines.
type ringLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *ringLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	if len(l.lines) > 4000 {
		l.lines = slices.Delete(l.lines, 0, len(l.lines)-2000)
	}
	return len(p), nil
}

func (l *ringLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := max(0, len(l.lines)-400)
	return strings.Join(l.lines[start:], "\n")
}
