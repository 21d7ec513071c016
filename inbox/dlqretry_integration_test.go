package inbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestDeadLetterSentAfterAFailedTry: a dead letter whose first produce
// fails (here Kafka refuses it once with POLICY_VIOLATION; in production a
// broker away past the 30 s produce timeout) is sent by the next try. The
// inbox reused the same *kgo.Record for every try, and franz-go keeps the
// first Produce's ctx in Record.Context, cancelled once that try returned:
// every later try failed at once with "context canceled", forever, and the
// partition wedged. kfake, for the one-off refusal.
func TestDeadLetterSentAfterAFailedTry(t *testing.T) {
	e := setup(t) // PostgreSQL; Kafka is kfake
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, e.topic, e.dlq))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: e.dlq, Err: kerr.PolicyViolation})
	brokers := kc.ListenAddrs()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for _, r := range []*kgo.Record{rec("ev-poison", "malformed"), rec("ev-after", "ok")} {
		r.Topic, r.Key = e.topic, []byte("one-partition")
		if err := prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := e.quiet()
	cfg.Brokers = brokers
	logs := &testenv.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	deadline := time.Now().Add(20 * time.Second)
	for c.Stats().DeadLettered == 0 || effectsOf(t, e, "ev-after") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not dead-lettered within 20s after one refused try; stats %+v; %d retries said 'context canceled'",
				c.Stats(), strings.Count(logs.String(), `err="context canceled"`))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
