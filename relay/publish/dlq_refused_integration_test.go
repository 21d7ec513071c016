package publish

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestDeadLetterRefusedKeepsCause: an event that cannot be routed (here, a
// row without the payload column) whose DLQ record Kafka refuses too (every
// produce to the DLQ topic answered POLICY_VIOLATION) ends in
// outbox_dead_letter with both reasons: why it is a dead letter at all (its
// class, missing-field, and the router's message) and why the DLQ topic
// did not take it (the broker's error). In both producer modes; the events
// around it are published, in order, and everything is confirmed, the dead
// letter only once its row is stored.
func TestDeadLetterRefusedKeepsCause(t *testing.T) {
	pool := deadLetterPool(t)
	for _, mode := range []string{"transactional", "idempotent"} {
		t.Run(mode, func(t *testing.T) {
			if _, err := pool.Exec(context.Background(), `DELETE FROM public.outbox_dead_letter`); err != nil {
				t.Fatal(err)
			}
			suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
			aggType, dlq := "dlqref"+suffix, "dlq"+suffix
			topic := "outbox.event." + aggType
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.SeedTopics(1, dlq))
			l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: mode == "transactional"}, route.DefaultConfig())
			l.pool = pool
			var good []testenv.Event
			badID := "bad-" + suffix
			lsn := uint64(1000)
			for tx := range 3 {
				var rows []*route.Row
				for i := range 3 {
					lsn += 10
					id := fmt.Sprintf("%s-%d-%d", aggType, tx, i)
					if tx == 1 && i == 1 {
						row := eventRow("id", badID, aggType, "a", `{"bad": true}`, lsn, 0)
						row.Columns = slices.DeleteFunc(row.Columns, func(c route.Column) bool { return c.Name == "payload" })
						rows = append(rows, row)
						continue
					}
					ev := testenv.Event{ID: id, AggType: aggType, AggID: "a", Seq: len(good) + 1, Payload: fmt.Sprintf(`{"seq": %d}`, len(good)+1)}
					good = append(good, ev)
					rows = append(rows, eventRow("id", id, aggType, "a", ev.Payload, lsn, 0))
				}
				lsn += 10
				for _, r := range rows {
					r.Source.CommitLSN = lsn
				}
				l.add(lsn, rows...)
			}
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlq, Err: kerr.PolicyViolation, Count: -1})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			l.run(ctx, 10)

			var id, msg, class string
			if err := pool.QueryRow(ctx, `SELECT id, error, error_class FROM public.outbox_dead_letter`).Scan(&id, &msg, &class); err != nil {
				t.Fatalf("read the dead letter: %v; table: %v", err, deadLetters(t, pool))
			}
			if id != badID {
				t.Errorf("dead letter %s; want %s", id, badID)
			}
			for _, want := range []string{"Unable to find payload field", kerr.PolicyViolation.Message, dlq} {
				if !strings.Contains(msg, want) {
					t.Errorf("dead letter's error %q does not name %q: the original cause and the DLQ topic's refusal must both be kept", msg, want)
				}
			}
			if class != string(route.ClassMissingField) {
				t.Errorf("dead letter's class %q; want %q, why the event is a dead letter", class, route.ClassMissingField)
			}
			cons := testenv.StartConsumer(t, brokers, topic)
			cons.WaitFor(t, good, 20*time.Second)
			cons.Verify(t, good)
		})
	}
}
