package publish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestCreateTopicRefusedForSettings: Kafka refusing to create a topic for
// the deployment's settings (configs, replication factor, partitions, a
// create policy) stops the producer with a fatal.Error naming the settings,
// at once, instead of retrying forever; nothing is dead-lettered or acked.
func TestCreateTopicRefusedForSettings(t *testing.T) {
	for _, code := range []*kerr.Error{kerr.InvalidConfig, kerr.InvalidReplicationFactor, kerr.InvalidPartitions, kerr.PolicyViolation} {
		t.Run(code.Message, func(t *testing.T) {
			suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
			aggType, dlq := "create"+suffix, "dlq"+suffix
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
			c.ControlKey(int16(kmsg.CreateTopics), func(req kmsg.Request) (kmsg.Response, error, bool) {
				r := req.(*kmsg.CreateTopicsRequest)
				resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
				for _, rt := range r.Topics {
					st := kmsg.NewCreateTopicsResponseTopic()
					st.Topic, st.ErrorCode = rt.Topic, code.Code
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
			err := runOne(t, brokers, Config{DLQTopic: dlq, MaxMessageBytes: 1 << 20, TopicCreate: true, TopicPartitions: 1, TopicReplication: 1, Poison: &Poison{}}, aggType)
			var fe *fatal.Error
			if !errors.As(err, &fe) || !errors.Is(err, code) || !strings.Contains(err.Error(), "OUTBOX_TOPIC_CONFIGS") {
				t.Fatalf("Run: %v; want a fatal.Error wrapping %v that names the settings", err, code)
			}
		})
	}
}

// runOne runs a producer with cfg on one event of aggType until it
// returns (at most 10 s); the event must not be acked.
func runOne(t *testing.T, brokers string, cfg Config, aggType string) error {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers)}, ClientOpts(100, 1<<20, "none", time.Millisecond)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := New(cfg, cl, router, nil, newLogBuffer(t).logger(), metrics.New())
	in := make(chan wal.Event, 1)
	tr := tracker.New(0)
	txn := tr.Begin(100)
	txn.Add()
	in <- wal.Event{Txn: txn, Row: eventRow("id", "ev-"+aggType, aggType, "a", `{}`, 90, 100)}
	txn.Commit(100)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = p.Run(ctx, in, func() {})
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the producer was still retrying after 10 s: %v", err)
	}
	if tr.Acked() != 0 {
		t.Errorf("acked %d", tr.Acked())
	}
	return err
}
