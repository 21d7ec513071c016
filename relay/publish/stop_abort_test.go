package publish

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestStopAbortsUnfinishedTxn: the stream stops (its grace at a graceful
// stop ran out, or it failed) while a PostgreSQL transaction is still being
// read, and closes its channel. Nothing of that transaction can be
// confirmed (its commit was not read): the next session reads it again
// whole. The open Kafka transaction holding some of its records is then
// aborted, not committed: committed, they were published twice, once now
// and once by the next session. Nothing is acked of it; the next session
// publishes every event exactly once.
func TestStopAbortsUnfinishedTxn(t *testing.T) {
	s := uniqueSuffix()
	aggType, dlq := "stop"+s, "dlq"+s
	topic := "outbox.event." + aggType
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	txnID := fmt.Sprintf("outbox-connector-stop-%s", s)
	cfg := Config{DLQTopic: dlq, Transactional: true, MaxMessageBytes: 1 << 20, Poison: &Poison{}, TopicPartitions: 1, TopicReplication: -1,
		TxnInterval: time.Hour, TxnMaxRecords: 1000}
	m := metrics.New()
	// session hands the rows of a complete transaction (end 200) and, when
	// cut, the first two rows of the next (end 300) without its commit,
	// then closes the channel; it returns what the tracker acked.
	session := func(start uint64, cut bool) uint64 {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.TransactionalID(txnID)}, ClientOpts(100, 1<<20, "none", time.Millisecond)...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		lb := newLogBuffer(t)
		p := New(cfg, cl, router, nil, lb.logger(), m)
		// Under load: the transaction stays open until the channel closes.
		p.txn.linger = time.Hour
		tr := tracker.New(start)
		in := make(chan wal.Event, 16)
		a := tr.Begin(200)
		a.Add()
		in <- wal.Event{Txn: a, Row: eventRow("id", "a1", aggType, "k", `{}`, 150, 200)}
		a.Commit(200)
		b := tr.Begin(300)
		for i, id := range []string{"b1", "b2", "b3"} {
			if cut && i == 2 {
				break
			}
			b.Add()
			in <- wal.Event{Txn: b, Row: eventRow("id", id, aggType, "k", `{}`, uint64(250+i), 300)}
		}
		if !cut {
			b.Commit(300)
		}
		close(in)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := p.Run(ctx, in, func() {}); err != nil {
			t.Fatalf("Run: %v", err)
		}
		return tr.Acked()
	}
	confirmed := session(100, true)
	if confirmed != 100 {
		t.Fatalf("acked %d after the stream stopped inside the transaction ending at 300; want 100 (the Kafka transaction holding its records aborted)", confirmed)
	}
	if got := session(confirmed, false); got != 300 {
		t.Fatalf("the next session acked %d; want 300", got)
	}
	c := testenv.StartConsumer(t, brokers, topic)
	want := []testenv.Event{{ID: "a1"}, {ID: "b1"}, {ID: "b2"}, {ID: "b3"}}
	c.WaitFor(t, want, 20*time.Second)
	time.Sleep(500 * time.Millisecond)
	counts := map[string]int{}
	for _, r := range c.Records() {
		counts[testenv.Header(r, "id")]++
	}
	for _, e := range want {
		if counts[e.ID] != 1 {
			t.Errorf("event %s published %d times to read_committed consumers; want once (all: %v)", e.ID, counts[e.ID], counts)
		}
	}
}
