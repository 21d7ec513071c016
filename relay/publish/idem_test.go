package publish

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestIdempotentPlacementKept: without transactions, a record that fails
// once (its batch refused) and is then produced again still goes to the
// partition the router's partition placement chose, not to the one its key
// hashes to; it is not dead-lettered, having passed on its own.
func TestIdempotentPlacementKept(t *testing.T) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "place"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.SeedTopics(1, dlq))
	rcfg := route.DefaultConfig()
	rcfg.AdditionalFields = []route.AdditionalField{{Column: "part", Placement: route.PlacePartition, Alias: "part"}}
	l := newLine(t, brokers, Config{DLQTopic: dlq, TopicPartitions: 3}, rcfg)
	// A key that Kafka's default partitioner puts elsewhere than 2.
	key := ""
	hash := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("agg-%d", i); hash.Partition(&kgo.Record{Key: []byte(k)}, 3) != 2 {
			key = k
		}
	}
	mark := "once-" + suffix
	var want []testenv.Event
	for i := range 20 {
		ev := testenv.Event{ID: fmt.Sprintf("%s-%d", aggType, i), AggType: aggType, AggID: key, Seq: i + 1, Payload: fmt.Sprintf(`{"seq": %d}`, i+1)}
		if i == 5 {
			ev.Payload = fmt.Sprintf(`{"seq": %d, "mark": "%s"}`, i+1, mark)
		}
		want = append(want, ev)
		row := eventRow("id", ev.ID, aggType, key, ev.Payload, uint64(100+10*i), uint64(105+10*i))
		row.Columns = append(row.Columns, route.Column{Name: "part", Type: route.OIDInt4, Value: []byte("2")})
		l.add(uint64(105+10*i), row)
	}
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.InvalidRecord,
		When: batchHolds(t, brokers, topic, mark)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.run(ctx, 5)
	cons := testenv.StartConsumer(t, brokers, topic)
	cons.WaitFor(t, want, 20*time.Second)
	cons.Verify(t, want)
	for _, r := range cons.Records() {
		if r.Partition != 2 {
			t.Errorf("event %s on partition %d; the router placed it on 2", testenv.Header(r, "id"), r.Partition)
		}
	}
	if n, err := testenv.CommittedRecords(ctx, brokers, dlq); err != nil || n != 0 {
		t.Errorf("%d dead letters (%v); want none", n, err)
	}
}

// TestIdempotentOrderAcrossFailure: without transactions, records of one
// aggregate keep their order of first delivery when batches of theirs are
// refused (for a few records Kafka refuses every time) while later records
// keep coming: none produced after a failure overtakes the failed ones, the
// refused ones are dead-lettered, every other one is published.
func TestIdempotentOrderAcrossFailure(t *testing.T) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "order"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.SeedTopics(1, dlq))
	l := newLine(t, brokers, Config{DLQTopic: dlq}, route.DefaultConfig())
	var want []testenv.Event
	var marks []string
	for i := range 600 {
		ev := testenv.Event{ID: fmt.Sprintf("%s-%d", aggType, i), AggType: aggType, AggID: "a", Seq: i + 1, Payload: fmt.Sprintf(`{"seq": %d}`, i+1)}
		if i%150 == 50 {
			mark := fmt.Sprintf("bad-%s-%d", suffix, i)
			marks = append(marks, mark)
			ev.Payload = fmt.Sprintf(`{"seq": %d, "mark": "%s"}`, i+1, mark)
		} else {
			want = append(want, ev)
		}
		l.add(uint64(105+10*i), eventRow("id", ev.ID, aggType, "a", ev.Payload, uint64(100+10*i), uint64(105+10*i)))
	}
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.PolicyViolation, Count: -1,
		When: batchHolds(t, brokers, topic, marks...)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.run(ctx, 10)
	cons := testenv.StartConsumer(t, brokers, topic)
	cons.WaitFor(t, want, 20*time.Second)
	dups := cons.Verify(t, want)
	if n := metricValue(t, l.m.Registry, "outbox_connector_order_violations_total", nil); n != 0 {
		t.Errorf("outbox_connector_order_violations_total = %v", n)
	}
	n, err := testenv.CommittedRecords(ctx, brokers, dlq)
	if err != nil || n != int64(len(marks)) {
		t.Errorf("%d dead letters (%v); want %d", n, err, len(marks))
	}
	t.Logf("%d sessions, %d duplicates", l.sessions, dups)
}

// slowFailures delays franz-go's promise goroutine once, on the first
// failed record, before its promise runs: it widens the window between
// franz-go failing a partition's records and the producer learning of it.
type slowFailures struct {
	once  sync.Once
	delay time.Duration
}

func (h *slowFailures) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err != nil {
		h.once.Do(func() { time.Sleep(h.delay) })
	}
}

// TestIdempotentWindowSeen: the window in which a record produced after
// franz-go failed a partition's records could overtake them (see idem.go),
// widened on purpose: franz-go's promise goroutine is held up for 300 ms at
// the first failure while records of the same key keep coming.
//   - With WatchFailures around the client's logger, as the relay has it,
//     the producer halts at the failure itself: nothing produced after it
//     is sent, first deliveries stay in order, no violation is counted.
//   - Without it, records of that key are acked before the failed one. The
//     producer sees each (a partition's promises run in order), counts it
//     in outbox_connector_order_violations_total, logs it, and does not
//     count it done: the next session publishes it again after the failed
//     one, so the last deliveries are in order and nothing is lost.
func TestIdempotentWindowSeen(t *testing.T) {
	for _, watched := range []bool{true, false} {
		t.Run(map[bool]string{true: "watched", false: "unwatched"}[watched], func(t *testing.T) {
			idempotentWindow(t, watched)
		})
	}
}

func idempotentWindow(t *testing.T, watched bool) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "window"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.SeedTopics(1, dlq))
	l := newLine(t, brokers, Config{DLQTopic: dlq}, route.DefaultConfig())
	l.noWatch = !watched
	l.opts = append(l.opts, kgo.WithHooks(&slowFailures{delay: 300 * time.Millisecond}))
	var want []testenv.Event
	mark := "once-" + suffix
	const failed = 50
	for i := range 400 {
		ev := testenv.Event{ID: fmt.Sprintf("%s-%d", aggType, i), AggType: aggType, AggID: "a", Seq: i + 1, Payload: fmt.Sprintf(`{"seq": %d}`, i+1)}
		if i == failed {
			ev.Payload = fmt.Sprintf(`{"seq": %d, "mark": "%s"}`, i+1, mark)
		}
		want = append(want, ev)
		l.add(uint64(105+10*i), eventRow("id", ev.ID, aggType, "a", ev.Payload, uint64(100+10*i), uint64(105+10*i)))
	}
	used := false // the mark fails the first request holding it, once
	holds := batchHolds(t, brokers, topic, mark)
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.PolicyViolation, Count: -1,
		When: func(req kmsg.Request) bool {
			if !used && holds(req) {
				used = true
				return true
			}
			return false
		}})
	// Slowly enough that records come while the promise goroutine waits.
	l.pace = 2 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l.run(ctx, 10)
	cons := testenv.StartConsumer(t, brokers, topic)
	cons.WaitFor(t, want, 20*time.Second)
	violations := metricValue(t, l.m.Registry, "outbox_connector_order_violations_total", nil)
	recs := cons.Records()
	t.Logf("%v order violations seen; %d sessions; %d records consumed for %d events", violations, l.sessions, len(recs), len(want))
	if watched {
		if violations != 0 {
			t.Errorf("outbox_connector_order_violations_total = %v; want 0 (WatchFailures halts at the failure)", violations)
		}
		cons.Verify(t, want)
		return
	}
	if violations < 1 {
		t.Fatalf("outbox_connector_order_violations_total = %v; want the records acked in the widened window counted", violations)
	}
	if !strings.Contains(l.log.String(), "consumers may see it before that one") {
		t.Error("no log line names an order violation")
	}
	// From the failed record's first delivery on, every later event is
	// delivered again, in order.
	at := -1
	for i, r := range recs {
		if testenv.Header(r, "id") == want[failed].ID {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatal("the failed record was never delivered")
	}
	next := failed
	for _, r := range recs[at:] {
		if next < len(want) && testenv.Header(r, "id") == want[next].ID {
			next++
		}
	}
	if next != len(want) {
		t.Errorf("after the failed record's delivery, events are delivered again in order only up to seq %d of %d", next, len(want))
	}
}
