package publish

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestRealBrokerRefusals: a real Kafka broker refuses a record for its own
// account (a timestamp older than the topic's message.timestamp.before.max.ms,
// with table.field.event.timestamp; a null key on a compacted topic), in
// both modes: the record is dead-lettered to the DLQ topic, whole, with the
// broker's error, and every other event is published, in order per
// aggregate. (Before issue 13 a transactional producer aborted on it again
// and again, and an idempotent one produced it again in a loop.)
func TestRealBrokerRefusals(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	pool := deadLetterPool(t) // nothing goes there: checked
	hour, compact := "3600000", "compact"
	for _, mode := range []string{"transactional", "idempotent"} {
		for _, tc := range []struct {
			name    string
			configs map[string]*string
			errs    []string // what the broker's error may be called
		}{
			{"old-timestamp", map[string]*string{"message.timestamp.before.max.ms": &hour}, []string{"INVALID_TIMESTAMP"}},
			{"null-key-compacted", map[string]*string{"cleanup.policy": &compact}, []string{"INVALID_RECORD", "CORRUPT_MESSAGE"}},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
				aggType, dlq := "refused"+suffix, "dlq"+suffix
				topic := "outbox.event." + aggType
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				resp, err := adm.CreateTopic(ctx, 2, -1, tc.configs, topic)
				if err == nil {
					err = resp.Err
				}
				if err != nil {
					t.Fatalf("create %s: %v", topic, err)
				}
				rcfg := route.DefaultConfig()
				rcfg.FieldEventTimestamp = "occurred_at"
				l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: mode == "transactional", TopicPartitions: 2}, rcfg)
				l.pool = pool
				var want []testenv.Event
				var bad testenv.Event
				now := time.Now().UTC().Format("2006-01-02 15:04:05.000000+00")
				for i := range 30 {
					agg := fmt.Sprintf("k%d", i%3)
					ev := testenv.Event{ID: fmt.Sprintf("%s-%d", aggType, i), AggType: aggType, AggID: agg, Seq: i/3 + 1, Payload: fmt.Sprintf(`{"i": %d}`, i)}
					row := eventRow("id", ev.ID, aggType, agg, ev.Payload, uint64(100+10*i), uint64(105+10*i))
					ts := now
					if i == 14 {
						bad = ev
						switch tc.name {
						case "old-timestamp":
							ts = "2020-01-01 00:00:00+00"
						default:
							row.Lookup("aggregateid").Null = true
							row.Lookup("aggregateid").Value = nil
						}
					} else {
						want = append(want, ev)
					}
					row.Columns = append(row.Columns, route.Column{Name: "occurred_at", Type: route.OIDTimestamptz, Value: []byte(ts)})
					l.add(uint64(105+10*i), row)
				}
				l.run(ctx, 10)

				cons := testenv.StartConsumer(t, brokers, topic)
				cons.WaitFor(t, want, 30*time.Second)
				dups := cons.Verify(t, want)
				dc := testenv.StartConsumer(t, brokers, dlq)
				dc.WaitFor(t, []testenv.Event{{ID: bad.ID}}, 30*time.Second)
				for _, r := range dc.Records() {
					msg := testenv.Header(r, "error")
					named := false
					for _, e := range tc.errs {
						named = named || strings.Contains(msg, e)
					}
					if testenv.Header(r, "id") != bad.ID || !named || !strings.Contains(string(r.Value), strings.ReplaceAll(bad.Payload, `"`, `\"`)) {
						t.Errorf("DLQ record id=%s error=%q value=%s; want %s, whole, with the broker's error (%v)", testenv.Header(r, "id"), msg, r.Value, bad.ID, tc.errs)
					}
					t.Logf("DLQ record: error.class=%s error=%q", testenv.Header(r, "error.class"), msg)
				}
				for _, r := range cons.Records() {
					if testenv.Header(r, "id") == bad.ID {
						t.Errorf("the refused record reached %s", topic)
					}
				}
				if got := deadLetters(t, pool); len(got) != 0 {
					t.Errorf("outbox_dead_letter holds %v; want nothing (the DLQ topic takes these)", got)
				}
				t.Logf("%d sessions, %d duplicates", l.sessions, dups)
			})
		}
	}
}
