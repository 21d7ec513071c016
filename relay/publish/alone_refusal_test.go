package publish

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestRefusedAloneNotConvictableEnds: a record Kafka refuses every time
// with an error that is not surely its own (CORRUPT_MESSAGE,
// UNKNOWN_SERVER_ERROR: convicted only at its maxAloneRefusals-th refusal
// alone) is dead-lettered within a bounded number of sessions, in both
// modes, and its neighbours are published. Found by TestPipelineModel: in
// transactional mode the transaction the suspect is produced alone in
// fails, and recordErrors made it a suspect again, which reset its count
// of refusals alone: it was refused alone, session after session, forever
// (the line wedged).
func TestRefusedAloneNotConvictableEnds(t *testing.T) {
	for _, mode := range []string{"transactional", "idempotent"} {
		for _, ferr := range []*kerr.Error{kerr.CorruptMessage, kerr.UnknownServerError} {
			t.Run(mode+"/"+ferr.Message[:min(len(ferr.Message), 20)], func(t *testing.T) {
				suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
				aggType, dlq := "alone"+suffix, "dlq"+suffix
				topic := "outbox.event." + aggType
				c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.SeedTopics(1, dlq))
				l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: mode == "transactional"}, route.DefaultConfig())
				mark := "bad-" + suffix
				var want []testenv.Event
				for i := range 4 {
					ev := testenv.Event{ID: fmt.Sprintf("%s-%d", aggType, i), AggType: aggType, AggID: "a", Seq: i + 1, Payload: fmt.Sprintf(`{"seq": %d}`, i+1)}
					if i == 1 {
						ev.Payload = fmt.Sprintf(`{"seq": %d, "mark": "%s"}`, i+1, mark)
					} else {
						want = append(want, ev)
					}
					l.add(uint64(105+10*i), eventRow("id", ev.ID, aggType, "a", ev.Payload, uint64(100+10*i), uint64(105+10*i)))
				}
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: ferr, Count: -1,
					When: batchHolds(t, brokers, topic, mark)})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				// One session makes it a suspect, maxAloneRefusals more
				// refuse it alone; one more for slack.
				l.run(ctx, 2+maxAloneRefusals)
				cons := testenv.StartConsumer(t, brokers, topic)
				cons.WaitFor(t, want, 20*time.Second)
				cons.Verify(t, want)
				if n, err := testenv.CommittedRecords(ctx, brokers, dlq); err != nil || n < 1 {
					t.Errorf("%d dead letters (%v); want the refused record's", n, err)
				}
				t.Logf("%d sessions", l.sessions)
			})
		}
	}
}
