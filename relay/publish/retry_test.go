package publish

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestPartitionErrorBackoff: a retriable error that Kafka gives for one
// partition, every time, for seconds (NOT_ENOUGH_REPLICAS_AFTER_APPEND and
// REQUEST_TIMED_OUT, which franz-go retries after its retry backoff;
// NOT_LEADER_OR_FOLLOWER, after a metadata refresh)
// is retried with a backoff that grows while the error lasts: fewer than
// maxPartitionRetryRate produce requests a second reach the partition, with
// the relay's retry settings (TxnRetryOpts) in transactional mode and
// franz-go's defaults in idempotent mode. franz-go counts failures per
// request and clears the count whenever a request is answered, as these
// are (the error is the partition's, not the request's): with a backoff
// of its first step only, the relay's 10 ms, the partition was retried
// about a hundred times a second. Once the error passes, the line ends as
// classify says a transient error does: every event published, in order
// per aggregate, nothing dead-lettered.
func TestPartitionErrorBackoff(t *testing.T) {
	const hold = 3 * time.Second
	for _, tc := range []struct {
		mode string
		err  *kerr.Error
	}{
		{"transactional", kerr.NotEnoughReplicasAfterAppend},
		{"transactional", kerr.RequestTimedOut},
		{"transactional", kerr.NotLeaderForPartition},
		{"idempotent", kerr.NotEnoughReplicasAfterAppend},
	} {
		t.Run(tc.mode+"/"+tc.err.Message, func(t *testing.T) {
			suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
			aggType, dlq := "retry"+suffix, "dlq"+suffix
			topic := "outbox.event." + aggType
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.SeedTopics(1, dlq))
			l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: tc.mode == "transactional", TopicPartitions: 2}, route.DefaultConfig())
			if tc.mode == "transactional" {
				l.opts = append(l.opts, TxnRetryOpts()...)
			}
			// Two aggregates on each partition.
			hash := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
			var keys []string
			for i, on := 0, [2]int{}; len(keys) < 4; i++ {
				k := fmt.Sprintf("agg-%d", i)
				if p := hash.Partition(&kgo.Record{Key: []byte(k)}, 2); on[p] < 2 {
					on[p]++
					keys = append(keys, k)
				}
			}
			var want []testenv.Event
			seq := map[string]int{}
			lsn := uint64(1000)
			for tx := range 10 {
				var rows []*route.Row
				for i := range 4 {
					agg := keys[(tx+i)%4]
					seq[agg]++
					ev := testenv.Event{ID: fmt.Sprintf("%s-%d-%d", aggType, tx, i), AggType: aggType, AggID: agg, Seq: seq[agg], Payload: fmt.Sprintf(`{"seq": %d}`, seq[agg])}
					want = append(want, ev)
					lsn += 10
					rows = append(rows, eventRow("id", ev.ID, aggType, agg, ev.Payload, lsn, 0))
				}
				lsn += 10
				for _, r := range rows {
					r.Source.CommitLSN = lsn
				}
				l.add(lsn, rows...)
			}
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{1}, Err: tc.err, Count: -1})
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			hits := make(chan int, 1)
			go func() {
				if err := h.Wait(ctx, 1); err != nil {
					hits <- -1
					return
				}
				time.Sleep(hold)
				n := h.Hits()
				h.Remove()
				hits <- n
			}()
			l.run(ctx, 3)
			n := <-hits
			rate := float64(n) / hold.Seconds()
			t.Logf("%d produce requests to the partition answered %s in %s (%.1f a second); %d session(s)", n, tc.err.Message, hold, rate, l.sessions)
			if n < 2 || rate >= maxPartitionRetryRate {
				t.Errorf("%d produce requests to the partition answered %s in %s (%.1f a second); want it retried, with a backoff (fewer than %d a second)", n, tc.err.Message, hold, rate, maxPartitionRetryRate)
			}
			cons := testenv.StartConsumer(t, brokers, topic)
			cons.WaitFor(t, want, 20*time.Second)
			cons.Verify(t, want)
			if d, err := testenv.CommittedRecords(ctx, brokers, dlq); err != nil || d != 0 {
				t.Errorf("%d dead letters (%v); want none for a transient error", d, err)
			}
		})
	}
}

// maxPartitionRetryRate bounds the produce requests a second that one
// partition's persistent retriable error may cause.
const maxPartitionRetryRate = 20

// TestTxnRetryBackoffCount: the transactional client's retry backoff grows
// with every retry, whatever franz-go's own count says (it says 1 for a
// partition's error in an answered request), up to about a second, and
// starts again from 10 ms once Kafka took a batch.
func TestTxnRetryBackoffCount(t *testing.T) {
	b := &retryCount{}
	// Step by step: 10 ms doubled at each retry up to 1 s, less at most a
	// fifth of jitter.
	for i := range 10 {
		step := min(10*time.Millisecond<<i, time.Second)
		if d := b.backoff(1); d > step || d < step-step/5 {
			t.Fatalf("retry %d: backoff %s; want %s less at most a fifth", i+1, d, step)
		}
	}
	b.OnProduceBatchWritten(kgo.BrokerMetadata{}, "t", 0, kgo.ProduceBatchMetrics{})
	var last time.Duration
	for i := range 100 {
		d := b.backoff(1)
		if d > time.Second || d < 8*time.Millisecond {
			t.Fatalf("retry %d: backoff %s; want between 8 ms and 1 s", i+1, d)
		}
		if i == 99 {
			last = d
		}
	}
	if last < 800*time.Millisecond {
		t.Errorf("backoff after 100 retries without a batch written: %s; want about 1 s", last)
	}
	b.OnProduceBatchWritten(kgo.BrokerMetadata{}, "t", 0, kgo.ProduceBatchMetrics{})
	if d := b.backoff(1); d > 10*time.Millisecond {
		t.Errorf("first retry after a batch was written: backoff %s; want at most 10 ms", d)
	}
	if d := b.backoff(5); d < 128*time.Millisecond {
		t.Errorf("franz-go's count of 5: backoff %s; want at least its step (160 ms less jitter)", d)
	}
}
