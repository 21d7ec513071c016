package offsets

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestWireGolden: the key and the value, as people and other tools read
// them from the topic, are the golden file's; Parse reads them back.
func TestWireGolden(t *testing.T) {
	k := Key{SystemID: "7400000000000000001", Database: "outbox", Slot: "outbox_slot"}
	p := Position{Epoch: 42, Timeline: 2, Commit: 0x1_6B3748, Events: 3, Token: 7}
	got := string(k.Bytes()) + "\n" + string(p.Value()) + "\n"
	path := filepath.Join("testdata", "position.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("wire form:\n%s\nwant:\n%s", got, want)
	}
	back, err := Parse(p.Value())
	if err != nil || back != p {
		t.Errorf("Parse: %+v, %v; want %+v", back, err, p)
	}
	for _, bad := range []string{`{}`, `{"version":2,"commit_lsn":"0/1"}`, `{"version":1,"commit_lsn":"x"}`, `{"version":1,"commit_lsn":"0/1","extra":1}`, `nope`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s): no error", bad)
		}
	}
}

// TestCovers: the events of earlier transactions, and the first Events of
// the position's own, are covered; nothing after.
func TestCovers(t *testing.T) {
	p := Position{Commit: 100, Events: 2}
	for _, c := range []struct {
		commit uint64
		n      uint32
		want   bool
	}{{99, 50, true}, {100, 0, true}, {100, 1, true}, {100, 2, false}, {101, 0, false}} {
		if got := p.Covers(c.commit, c.n); got != c.want {
			t.Errorf("Covers(%d, %d) = %v, want %v", c.commit, c.n, got, c.want)
		}
	}
	if (Position{}).Covers(1, 0) {
		t.Error("the zero position covers an event")
	}
}

func fake(t *testing.T) (string, *kadm.Client) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := strings.Join(c.ListenAddrs(), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return brokers, kadm.NewClient(cl)
}

func txnClient(t *testing.T, brokers, id string) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.TransactionalID(id), kgo.DefaultProduceTopic("x"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// put writes positions in one Kafka transaction and ends it.
func put(t *testing.T, cl *kgo.Client, topic string, commit bool, recs ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// TestLoad: the newest committed position of the key is read, past
// another slot's records, an aborted transaction's and the transaction
// markers that end the partition; nothing for a key never written; and a
// reader waits for a transaction left open at the call instead of stopping
// short of a position committed after it began.
func TestLoad(t *testing.T) {
	brokers, adm := fake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "offsets"
	if err := Ensure(ctx, adm, topic, true, -1); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(ctx, adm, topic, false, -1); err != nil {
		t.Fatalf("Ensure of an existing topic: %v", err)
	}
	conn := []kgo.Opt{kgo.SeedBrokers(brokers)}
	mine := Key{SystemID: "1", Database: "d", Slot: "s"}
	other := Key{SystemID: "1", Database: "d", Slot: "t"}
	if _, ok, err := Load(ctx, conn, topic, mine); ok || err != nil {
		t.Fatalf("empty topic: found %v, %v", ok, err)
	}
	cl := txnClient(t, brokers, "a")
	put(t, cl, topic, true, Record(topic, mine, Position{Epoch: 1, Commit: 10, Events: 1}))
	put(t, cl, topic, true, Record(topic, other, Position{Epoch: 1, Commit: 99}), Record(topic, mine, Position{Epoch: 1, Commit: 20}))
	put(t, cl, topic, false, Record(topic, mine, Position{Epoch: 1, Commit: 30}))
	p, ok, err := Load(ctx, conn, topic, mine)
	if err != nil || !ok || p.Commit != 20 {
		t.Fatalf("Load: %v %v %v; want the committed position at 20, not the aborted one", p, ok, err)
	}
	if _, ok, _ := Load(ctx, conn, topic, Key{Slot: "none"}); ok {
		t.Error("a key never written was found")
	}

	// Another slot's transaction is open: the reader waits for it.
	b := txnClient(t, brokers, "b")
	if err := b.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := b.ProduceSync(ctx, Record(topic, other, Position{Commit: 100})).FirstErr(); err != nil {
		t.Fatal(err)
	}
	put(t, cl, topic, true, Record(topic, mine, Position{Epoch: 1, Commit: 40}))
	got := make(chan Position, 1)
	go func() {
		p, _, err := Load(ctx, conn, topic, mine)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	select {
	case p := <-got:
		t.Fatalf("Load returned %v while a transaction open at the call still held the stable end back", p)
	case <-time.After(300 * time.Millisecond):
	}
	if err := b.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if p := <-got; p.Commit != 40 {
		t.Errorf("after the other transaction ended: %v, want the position at 40", p)
	}
}

// TestEnsureRefuses: a topic that deletes by retention is refused, and a
// missing one without OUTBOX_TOPIC_CREATE says how to create it.
func TestEnsureRefuses(t *testing.T) {
	_, adm := fake(t)
	ctx := context.Background()
	var me *MissingError
	if err := Ensure(ctx, adm, "absent", false, -1); !errors.As(err, &me) {
		t.Errorf("missing topic: %v", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "deleting"); err != nil {
		t.Fatal(err)
	}
	err := Ensure(ctx, adm, "deleting", true, -1)
	if err == nil || !strings.Contains(err.Error(), "cleanup.policy=delete") {
		t.Errorf("topic with cleanup.policy=delete: %v", err)
	}
}

// TestEnsureWaitsForCreated: a real broker may answer a describe of a topic
// created a moment ago with UNKNOWN_TOPIC_OR_PARTITION (its metadata
// follows the controller's); Ensure, having created it, waits for it
// instead of stopping the connector with "does not exist and
// OUTBOX_TOPIC_CREATE=false" (what CI saw once against Kafka 4.1).
func TestEnsureWaitsForCreated(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var unknown atomic.Int32
	c.ControlKey(kmsg.DescribeConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if unknown.Add(1) > 3 {
			return nil, nil, false
		}
		r := req.(*kmsg.DescribeConfigsRequest)
		resp := r.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range r.Resources {
			res := kmsg.NewDescribeConfigsResponseResource()
			res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
			res.ErrorCode = kerr.UnknownTopicOrPartition.Code
			resp.Resources = append(resp.Resources, res)
		}
		return resp, nil, true
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := Ensure(context.Background(), kadm.NewClient(cl), "fresh", true, -1); err != nil {
		t.Fatalf("Ensure of a topic it created: %v", err)
	}
	if n := unknown.Load(); n < 4 {
		t.Errorf("%d describes, want the 3 unknown answers and one more", n)
	}
	// Not created by us: unknown is missing at once.
	unknown.Store(0)
	var me *MissingError
	if err := Ensure(context.Background(), kadm.NewClient(cl), "fresh", false, -1); !errors.As(err, &me) {
		t.Errorf("unknown topic without OUTBOX_TOPIC_CREATE: %v, want a *MissingError", err)
	}
}

// TestLoadReadsBack: Load reads the partition back from its end by
// windows, so a start after a long run reads the last commits, not every
// commit since the active segment began; and a key whose newest position
// is far back is still found (the windows double). Found by the review of
// issue 16: Load read from the start within a fixed two minutes, which a
// busy connector's uncompacted segment could outgrow at every start.
func TestLoadReadsBack(t *testing.T) {
	brokers, adm := fake(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "offsets-back"
	if err := Ensure(ctx, adm, topic, true, -1); err != nil {
		t.Fatal(err)
	}
	conn := []kgo.Opt{kgo.SeedBrokers(brokers)}
	mine, old, other := Key{Slot: "mine"}, Key{Slot: "old"}, Key{Slot: "other"}
	cl := txnClient(t, brokers, "back")
	put(t, cl, topic, true, Record(topic, old, Position{Epoch: 1, Commit: 5}), Record(topic, mine, Position{Epoch: 1, Commit: 10}))
	var many []*kgo.Record
	for i := 0; i < 6000; i++ {
		many = append(many, Record(topic, other, Position{Epoch: 1, Commit: uint64(100 + i)}))
	}
	put(t, cl, topic, true, many...)
	put(t, cl, topic, true, Record(topic, mine, Position{Epoch: 1, Commit: 20}))
	put(t, cl, topic, true, many[:50]...)

	before := recordsRead.Load()
	p, ok, err := Load(ctx, conn, topic, mine)
	if err != nil || !ok || p.Commit != 20 {
		t.Fatalf("Load: %v %v %v; want the newest position at 20", p, ok, err)
	}
	if n := recordsRead.Load() - before; n > 2048 {
		t.Errorf("Load examined %d records to find a position 51 records from the end; want at most 2048 (read back, not from the start)", n)
	}
	p, ok, err = Load(ctx, conn, topic, old)
	if err != nil || !ok || p.Commit != 5 {
		t.Fatalf("Load of a key written only at the start: %v %v %v; want the position at 5", p, ok, err)
	}
	if _, ok, err := Load(ctx, conn, topic, Key{Slot: "none"}); ok || err != nil {
		t.Fatalf("a key never written: found %v, %v", ok, err)
	}
}
