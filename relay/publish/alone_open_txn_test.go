package publish

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestAloneAfterRefusedOpenTxn: in transactional mode a suspect is produced
// alone after the open Kafka transaction is committed; when that commit
// fails because Kafka refused another record of it, the failure is that
// record's, not the suspect's. Found by TestPipelineModel (OUTBOX_SOAK=1):
// the open transaction's refusal was taken for the suspect's refusal alone,
// so the suspect was convicted without being produced alone (here an
// innocent one, dead-lettered), the session went on, and the next commit
// committed the failed transaction: the refused record was marked done,
// and the position confirmed past it, though it is neither in Kafka nor
// dead-lettered.
//
// Events q, r, s, x, each in a PostgreSQL transaction of its own; q, r and
// s on three partitions, x on r's. Session 1: s's batch is refused
// once (a passing fault), so s is a suspect; q and r are not. Session 2:
// r's batch is refused once, INVALID_RECORD, while q and r are in the open
// Kafka transaction and s comes next.
func TestAloneAfterRefusedOpenTxn(t *testing.T) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "open"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.SeedTopics(1, dlq))
	l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: true, TopicPartitions: 3}, route.DefaultConfig())
	// Keys on three partitions.
	part := func(key string) int32 {
		return int32(kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition(&kgo.Record{Key: []byte(key)}, 3))
	}
	kq, kr, ks := "q0", "", ""
	for i := 0; kr == "" || ks == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		switch {
		case kr == "" && part(k) != part(kq):
			kr = k
		case kr != "" && part(k) != part(kq) && part(k) != part(kr):
			ks = k
		}
	}
	markR, markS := "mark-r-"+suffix, "mark-s-"+suffix
	want := []testenv.Event{
		{ID: aggType + "-q", AggType: aggType, AggID: kq, Seq: 1, Payload: `{"m": "q"}`},
		{ID: aggType + "-r", AggType: aggType, AggID: kr, Seq: 1, Payload: `{"m": "` + markR + `"}`},
		{ID: aggType + "-s", AggType: aggType, AggID: ks, Seq: 1, Payload: `{"m": "` + markS + `"}`},
		{ID: aggType + "-x", AggType: aggType, AggID: kr, Seq: 2, Payload: `{"m": "x"}`},
	}
	for i, ev := range want {
		lsn := uint64(100 + 10*i)
		l.add(lsn+5, eventRow("id", ev.ID, aggType, ev.AggID, ev.Payload, lsn, lsn+4))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{part(ks)}, Err: kerr.PolicyViolation,
		When: batchHolds(t, brokers, topic, markS)})
	if err := l.session(ctx); err == nil {
		t.Fatal("session 1 ended without the refusal of s's batch")
	}
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{part(kr)}, Err: kerr.InvalidRecord,
		When: batchHolds(t, brokers, topic, markR)})
	l.run(ctx, 6)
	// Both refusals passed: every event is published, none dead-lettered.
	cons := testenv.StartConsumer(t, brokers, topic, dlq)
	for deadline := time.Now().Add(5 * time.Second); cons.Count() < len(want) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	where := map[string][]string{}
	for _, r := range cons.Records() {
		id := testenv.Header(r, "id")
		where[id] = append(where[id], r.Topic)
	}
	for _, ev := range want {
		switch got := where[ev.ID]; {
		case len(got) == 0:
			t.Errorf("event %s is neither in Kafka nor dead-lettered, and the confirmed position is %d, past its transaction", ev.ID, l.confirmed)
		case slices.Contains(got, dlq):
			t.Errorf("event %s, innocent, was dead-lettered (in %v)", ev.ID, got)
		}
	}
	cons.Verify(t, want)
	t.Logf("%d sessions", l.sessions)
}
