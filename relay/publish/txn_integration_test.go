package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

func outboxRow(aggType, id string, lsn uint64) *route.Row {
	return &route.Row{
		Source: route.Source{LSN: lsn, CommitLSN: lsn, CommitTime: time.Now()},
		Columns: []route.Column{
			{Name: "id", Type: route.OIDUUID, Value: []byte(id)},
			{Name: "aggregatetype", Type: route.OIDText, Value: []byte(aggType)},
			{Name: "aggregateid", Type: route.OIDText, Value: []byte("a1")},
			{Name: "type", Type: route.OIDText, Value: []byte("T")},
			{Name: "payload", Type: route.OIDJSONB, Value: []byte(`{"n": 1}`)},
		},
	}
}

// txnProducer is a transactional producer on its own client, as one
// leader's session has.
type txnProducer struct {
	cl   *kgo.Client
	in   chan wal.Event
	done chan error
	tr   *tracker.Tracker
}

func startTxnProducer(t *testing.T, brokers, txnID, dlq string, valid func() bool) *txnProducer {
	t.Helper()
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.TransactionalID(txnID)}, ClientOpts(1000, 1<<20, "lz4", 0)...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DLQTopic: dlq, MaxMessageBytes: 1 << 20, TopicCreate: true, TopicPartitions: 1, TopicReplication: -1,
		Transactional: true, TxnInterval: 50 * time.Millisecond, TxnMaxRecords: 1000, Poison: &Poison{}, Valid: valid}
	p := New(cfg, cl, router, nil, slog.New(slog.DiscardHandler), metrics.New())
	tp := &txnProducer{cl: cl, in: make(chan wal.Event, 16), done: make(chan error, 1), tr: tracker.New(0)}
	go func() { tp.done <- p.Run(context.Background(), tp.in, func() {}) }()
	return tp
}

// send hands n events in one WAL transaction ending at end.
func (tp *txnProducer) send(aggType string, end uint64, n int) []string {
	txn := tp.tr.Begin(end)
	var ids []string
	for i := 0; i < n; i++ {
		id := uuid.NewString()
		ids = append(ids, id)
		txn.Add()
		tp.in <- wal.Event{Txn: txn, Row: outboxRow(aggType, id, end-uint64(n-i))}
	}
	txn.Commit(end)
	return ids
}

func waitAcked(t *testing.T, tr *tracker.Tracker, lsn uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for tr.Acked() < lsn {
		if time.Now().After(deadline) {
			t.Fatalf("acked %d, want %d", tr.Acked(), lsn)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTransactionalFencing: a producer whose transactional id a newer
// producer initialised (a new leader) publishes nothing more: its records
// are refused, the tracker never counts them, nothing is dead-lettered, and
// it stops with an error wrapping lease.ErrLost. A producer past its lease
// deadline stops the same way without asking Kafka.
func TestTransactionalFencing(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq, txnID := "fence"+suffix, "fencedlq"+suffix, "outbox-connector-test-"+suffix
	topic := "outbox.event." + aggType

	old := startTxnProducer(t, brokers, txnID, dlq, nil)
	first := old.send(aggType, 100, 5)
	waitAcked(t, old.tr, 100)

	// A new leader: InitProducerID bumps the epoch.
	next := startTxnProducer(t, brokers, txnID, dlq, nil)
	if _, _, err := next.cl.ProducerID(context.Background()); err != nil {
		t.Fatal(err)
	}
	late := old.send(aggType, 200, 5)
	select {
	case err := <-old.done:
		if !errors.Is(err, lease.ErrLost) || !errors.Is(err, ErrFenced) {
			t.Fatalf("fenced producer stopped with %v; want ErrFenced (lease.ErrLost)", err)
		}
		t.Logf("fenced producer stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the fenced producer kept running")
	}
	if got := old.tr.Acked(); got != 100 {
		t.Errorf("tracker acked %d after the fence; want 100 (the fenced records are not done)", got)
	}
	newer := next.send(aggType, 300, 5)
	waitAcked(t, next.tr, 300)

	c := testenv.StartConsumer(t, brokers, topic)
	c.WaitFor(t, append(events(first), events(newer)...), 30*time.Second)
	time.Sleep(time.Second)
	seen := map[string]bool{}
	for _, r := range c.Records() {
		seen[testenv.Header(r, "id")] = true
	}
	for _, id := range late {
		if seen[id] {
			t.Errorf("record %s produced after the fence was committed", id)
		}
	}
	if n, err := testenv.CommittedRecords(context.Background(), brokers, dlq); err != nil {
		t.Fatal(err)
	} else if n != 0 {
		t.Errorf("%d records dead-lettered; a fence is not poison", n)
	}

	// Past the lease deadline: nothing more is produced, Kafka is not asked.
	var valid atomic.Bool
	valid.Store(true)
	expired := startTxnProducer(t, brokers, txnID+"-b", dlq, valid.Load)
	expired.send(aggType, 400, 2)
	waitAcked(t, expired.tr, 400)
	valid.Store(false)
	expired.send(aggType, 500, 2)
	select {
	case err := <-expired.done:
		if !errors.Is(err, lease.ErrLost) {
			t.Fatalf("producer past its deadline stopped with %v; want lease.ErrLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the producer past its deadline kept running")
	}
	if got := expired.tr.Acked(); got != 400 {
		t.Errorf("tracker acked %d past the deadline; want 400", got)
	}
}

func events(ids []string) []testenv.Event {
	out := make([]testenv.Event, len(ids))
	for i, id := range ids {
		out[i] = testenv.Event{ID: id}
	}
	return out
}
