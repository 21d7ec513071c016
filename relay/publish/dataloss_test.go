package publish

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestProducerDataLossEndsSession: Kafka answering a produce with
// OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID says it lost records
// of this producer that it had acknowledged (an unclean leader election,
// say). franz-go's idempotent producer, by default, resets its sequence
// numbers and goes on, where it can no longer guard against duplicates or
// reordering, and says so only at info level, which the connector drops:
// the records in flight were acked and confirmed after an unseen reset.
// Now the records fail (kgo.StopProducerOnDataLossDetected), the session
// ends with an error that is not fatal, nothing of it is acked (the next
// session reads the WAL again from the confirmed position, in order), and
// it is said aloud: an error log line and
// outbox_connector_kafka_data_loss_detections_total{topic}. In both modes
// (a transactional producer always failed the records; it is counted too).
func TestProducerDataLossEndsSession(t *testing.T) {
	for _, c := range []struct {
		txn bool
		err *kerr.Error
	}{{false, kerr.OutOfOrderSequenceNumber}, {false, kerr.UnknownProducerID}, {true, kerr.OutOfOrderSequenceNumber}} {
		t.Run(fmt.Sprintf("transactional=%v/%s", c.txn, c.err.Message), func(t *testing.T) {
			s := uniqueSuffix()
			aggType, dlq := "loss"+s, "dlq"+s
			topic := "outbox.event." + aggType
			cl, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
			r := startTopicRunPublished(t, brokers, Config{DLQTopic: dlq, Transactional: c.txn}, 100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
			cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: c.err, Count: 1})
			r.send(200, eventRow("id", "e2", aggType, "a", `{}`, 190, 200))
			var err error
			select {
			case err = <-r.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the session goes on 10 s after Kafka answered %s (acked %d); want it ended, nothing acked after the reset", c.err.Message, r.tr.Acked())
			}
			if err == nil || fatal.Is(err) || !strings.Contains(err.Error(), c.err.Message) {
				t.Errorf("the session ended with %v; want an error naming %s that is not fatal", err, c.err.Message)
			}
			if got := r.tr.Acked(); got != 100 {
				t.Errorf("acked %d; want 100: e2 is read again by the next session", got)
			}
			if n := metricValue(t, r.m.Registry, "outbox_connector_kafka_data_loss_detections_total", map[string]string{"topic": topic}); n != 1 {
				t.Errorf("outbox_connector_kafka_data_loss_detections_total{topic=%q} = %v; want 1", topic, n)
			}
			if log := r.lb.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, c.err.Message) || !strings.Contains(log, "outbox table") {
				t.Errorf("no error log line naming %s and the way to check for lost events; log:\n%s", c.err.Message, log)
			}
		})
	}
}
