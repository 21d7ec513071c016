package publish

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	faultstep "github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// eoLine is a slot's worth of PostgreSQL transactions, replayed by
// producer sessions that fail at random steps and restart from a
// confirmed position as far behind as PostgreSQL may leave it (persisted
// at checkpoints only: any acked position, down to the slot's start), each
// with the exactly-once position read back from the offsets topic.
type eoLine struct {
	t       *testing.T
	brokers string
	topic   string
	otopic  string
	key     offsets.Key
	txns    []walTxn
	exactly bool // sessions use the position (false: at-least-once, to show the difference)
	poison  *Poison
	txnID   string // the slot's transactional id, the same for every session
	// pipelined counts the sessions with a second transactional client.
	pipelined int
	bad       map[string]bool // events Kafka refuses (their batch holds the marker)
	sessions  int
	skipped   int64
	rng       *rand.Rand
}

func newEOLine(t *testing.T, seed int64, exactly bool) *eoLine {
	s := uniq()
	l := &eoLine{t: t, topic: "outbox.event.eo" + s, otopic: "offsets" + s, key: offsets.Key{SystemID: "1", Database: "d", Slot: "s" + s},
		exactly: exactly, rng: rand.New(rand.NewSource(seed)), poison: &Poison{}, bad: map[string]bool{}, txnID: "outbox-connector-eo-" + s}
	var c *kfake.Cluster
	c, l.brokers = fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(3, l.topic), kfake.SeedTopics(1, "dlq"+s, l.otopic))
	// Some events Kafka refuses on their own account, always: each is
	// produced alone, found guilty and dead-lettered, in a transaction
	// of its own after one is aborted, with the line going on.
	mark := "refuse-" + s
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: l.topic, Err: kerr.PolicyViolation, Count: -1,
		When: batchHolds(t, l.brokers, l.topic, mark)})
	n := 0
	for k := 1; k <= 60; k++ {
		commit := uint64(10_000 * k)
		size := 1 + l.rng.Intn(25)
		var rows []*route.Row
		for i := 0; i < size; i++ {
			n++
			agg := fmt.Sprintf("a%d", l.rng.Intn(7))
			id := fmt.Sprintf("e%05d", n)
			payload := fmt.Sprintf(`{"n": %d}`, n)
			if l.rng.Intn(150) == 0 {
				payload = fmt.Sprintf(`{"n": %d, "m": "%s"}`, n, mark)
				l.bad[id] = true
			}
			rows = append(rows, eventRow("id", id, "eo"+s, agg, payload, commit-5000+uint64(i), commit))
		}
		l.txns = append(l.txns, walTxn{end: commit, rows: rows})
	}
	return l
}

// session runs one producer from start, failing at a random step; it
// returns the position the tracker acked.
func (l *eoLine) session(start uint64) uint64 {
	l.sessions++
	cfg := Config{DLQTopic: l.dlq(), TopicCreate: false, Transactional: true, TxnMaxRecords: 1 + l.rng.Intn(15), Poison: l.poison}
	if l.exactly {
		o := &Offsets{Topic: l.otopic, Key: l.key, Base: offsets.Position{Epoch: 1, Timeline: 1}}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		pos, ok, err := offsets.Load(ctx, []kgo.Opt{kgo.SeedBrokers(l.brokers)}, l.otopic, l.key)
		cancel()
		if err != nil {
			l.t.Fatal(err)
		}
		if ok {
			o.Resume = &pos
		}
		cfg.Offsets = o
	}
	// A fault at the n-th commit step: before Kafka commits (nothing of
	// the transaction is in), or after (all of it is, unacked here).
	failAt := l.rng.Intn(12)
	calls := 0
	cfg.Faults = func(s faultstep.Step) error {
		if s != faultstep.BeforeKafkaCommit && s != faultstep.AfterKafkaCommit {
			return nil
		}
		calls++
		if calls == failAt {
			return fmt.Errorf("injected at %s", s)
		}
		return nil
	}
	pipeline := l.rng.Intn(2) == 0
	m := newSession(l.t, l.brokers, cfg, sessionOpts{confirmed: start, inCap: 1 + l.rng.Intn(64), pipeline: pipeline, txnID: l.txnID})
	m.start()
	if pipeline {
		l.pipelined++
	}
	// Sometimes the stream stops in the middle of a transaction.
	cut := -1
	if l.rng.Intn(3) == 0 {
		cut = l.rng.Intn(400)
	}
	handed := 0
feed:
	for _, tx := range l.txns {
		if tx.end <= start {
			continue
		}
		txn := m.tr.Begin(tx.end)
		for _, row := range tx.rows {
			if handed == cut {
				break feed
			}
			handed++
			txn.Add()
			select {
			case m.in <- wal.Event{Txn: txn, Row: row}:
			case err := <-m.done:
				m.done <- err
				txn.Abandon()
				break feed
			}
		}
		txn.Commit(tx.end)
	}
	_ = m.close()
	l.skipped += m.p.Skipped()
	m.cl.Close()
	return m.tr.Acked()
}

func (l *eoLine) dlq() string { return "dlq" + l.topic[len("outbox.event.eo"):] }

// run restarts sessions until the last transaction is acked; every
// session starts from a random acked position at or below the last. A line
// that makes no progress in 200 sessions in a row is wedged. The control
// line (no position) replays from behind into the same faults, so it may
// need several hundred sessions to finish (seed 1796435048176325900 needed
// more than 200 in all); it is not wedged while it advances.
func (l *eoLine) run() {
	last := l.txns[len(l.txns)-1].end
	acked := uint64(0)
	since := 0 // sessions since acked last advanced
	for acked < last {
		if since >= 200 || l.sessions >= 3000 {
			l.t.Fatalf("not done after %d sessions, %d of them without progress (acked %d of %d)", l.sessions, since, acked, last)
		}
		start := uint64(0)
		if acked > 0 && l.rng.Intn(2) == 0 {
			start = uint64(l.rng.Int63n(int64(acked) + 1))
			start -= start % 10_000 // a transaction boundary
		}
		a := l.session(start)
		if a > acked {
			acked, since = a, 0
		} else {
			since++
		}
	}
}

// verify returns the duplicates a read_committed consumer sees, after
// failing the test on a loss or an aggregate out of order.
func (l *eoLine) verify() int {
	recs := committed(l.t, l.brokers, l.topic)
	want := map[string]string{}
	var order []string
	for _, tx := range l.txns {
		for _, r := range tx.rows {
			id := string(r.Lookup("id").Value)
			want[id] = string(r.Lookup("aggregateid").Value)
			order = append(order, id)
		}
	}
	seen := map[string]int{}
	lastByAgg := map[string]string{}
	dups := 0
	for _, r := range recs {
		id := testenv.Header(r, "id")
		if l.bad[id] {
			l.t.Errorf("event %s, which Kafka refuses, is in the topic", id)
		}
		if seen[id]++; seen[id] > 1 {
			dups++
			continue
		}
		agg := string(r.Key)
		if prev := lastByAgg[agg]; prev != "" && prev > id {
			l.t.Errorf("aggregate %s: %s after %s", agg, id, prev)
		}
		lastByAgg[agg] = id
	}
	dls := committed(l.t, l.brokers, l.dlq())
	for _, r := range dls {
		id := testenv.Header(r, "id")
		if !l.bad[id] {
			l.t.Errorf("event %s dead-lettered, though Kafka refuses only %v", id, l.bad)
		}
		if seen[id]++; seen[id] > 1 {
			dups++
		}
	}
	for _, id := range order {
		if seen[id] == 0 {
			l.t.Errorf("event %s lost", id)
		}
	}
	return dups
}

// TestExactlyOnceReplay: whatever step fails, and however far behind the
// confirmed position a session restarts from, a read_committed consumer
// sees every event once, each aggregate in order; the events skipped are
// the replayed ones. Without the position (the control) the same faults
// publish duplicates, which is what the position is for.
func TestExactlyOnceReplay(t *testing.T) {
	seed := time.Now().UnixNano()
	if v := os.Getenv("OUTBOX_TEST_SEED"); v != "" { // repeats a draw
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("OUTBOX_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d", seed)
	for run := 0; run < 4; run++ {
		l := newEOLine(t, seed+int64(run), true)
		l.run()
		if dups := l.verify(); dups != 0 {
			t.Errorf("run %d: %d duplicates with the exactly-once position; want 0", run, dups)
		}
		t.Logf("run %d: %d sessions (%d pipelined), %d events skipped as already in Kafka, %d refused and dead-lettered", run, l.sessions, l.pipelined, l.skipped, len(l.bad))
		if l.sessions > 1 && l.skipped == 0 {
			t.Errorf("run %d: %d sessions replayed from behind, none skipped anything", run, l.sessions)
		}
	}
	control := newEOLine(t, seed, false)
	control.run()
	dups := control.verify()
	t.Logf("control without the position: %d sessions, %d duplicates", control.sessions, dups)
	if control.sessions > 1 && dups == 0 {
		t.Error("the control run had no duplicates: the faults did not replay anything, and the test proves nothing")
	}
}

// TestExactlyOnceAfterSnapshot: the first streamed transaction may commit
// at the slot's consistent point, the snapshot rows' commit LSN: its events
// count from 0, not on from the snapshot's rows, so a position written
// inside it covers only its events in Kafka, and a replay publishes the
// rest.
func TestExactlyOnceAfterSnapshot(t *testing.T) {
	l := newEOLine(t, 1, true)
	l.txns = nil
	const at = 10_000
	agg := "eo" + l.topic[len("outbox.event.eo"):]
	var snap, txn []*route.Row
	for i := 0; i < 3; i++ {
		snap = append(snap, eventRow("id", fmt.Sprintf("s%d", i), agg, "a", `{}`, 0, at))
	}
	for i := 0; i < 4; i++ {
		txn = append(txn, eventRow("id", fmt.Sprintf("t%d", i), agg, "b", `{}`, at+10+uint64(i), at))
	}
	cfg := func(resume *offsets.Position) Config {
		return Config{DLQTopic: l.dlq(), Transactional: true, TxnMaxRecords: 5, TxnInterval: time.Minute,
			Offsets: &Offsets{Topic: l.otopic, Key: l.key, Base: offsets.Position{Epoch: 1}, Resume: resume}}
	}
	m := newSession(t, l.brokers, cfg(nil), sessionOpts{})
	m.start()
	m.send(at, snap...)
	tx := m.tr.Begin(at)
	for _, r := range txn[:2] {
		tx.Add()
		m.in <- wal.Event{Txn: tx, Row: r}
	}
	_ = m.close() // inside the transaction: the open Kafka transaction is aborted
	ctx := context.Background()
	pos, ok, err := offsets.Load(ctx, []kgo.Opt{kgo.SeedBrokers(l.brokers)}, l.otopic, l.key)
	if err != nil || !ok {
		t.Fatalf("Load: %v %v", ok, err)
	}
	if pos.Commit != at || pos.Events != 2 || pos.Snapshot != 0 {
		t.Errorf("position %+v; want 2 events of the transaction at %d", pos, at)
	}
	m = newSession(t, l.brokers, cfg(&pos), sessionOpts{})
	m.start()
	m.send(at, txn...)
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	got := ids(committed(t, l.brokers, l.topic))
	sort.Strings(got)
	if fmt.Sprint(got) != "[s0 s1 s2 t0 t1 t2 t3]" {
		t.Errorf("committed %v; want the snapshot and each event of the transaction, once", got)
	}
}
