package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
)

// TestTopicLimitBelowOurs: a topic that accepts smaller batches than
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES is refused when first seen, with a message
// that names the topic, both limits and the fix; a topic at or above it,
// and a topic the producer creates, are accepted.
func TestTopicLimitBelowOurs(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	small, large, fresh := "limit-small-"+suffix, "limit-large-"+suffix, "limit-fresh-"+suffix
	for topic, limit := range map[string]string{small: "100000", large: "2097152"} {
		resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"max.message.bytes": &limit}, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
	}
	for _, create := range []bool{true, false} {
		p := New(Config{MaxMessageBytes: 1 << 20, TopicCreate: create, TopicPartitions: 1, TopicReplication: -1},
			cl, nil, nil, slog.New(slog.DiscardHandler), metrics.New())
		err := p.ensureTopic(ctx, small)
		var fatal *fatal.Error
		if !errors.As(err, &fatal) {
			t.Fatalf("create=%v: ensureTopic(%s) = %v; want a fatal error", create, small, err)
		}
		for _, want := range []string{small, "100000", "OUTBOX_KAFKA_MAX_MESSAGE_BYTES=1048576", "max.message.bytes=1048576"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("create=%v: error %q does not say %q", create, err, want)
			}
		}
		if err := p.ensureTopic(ctx, large); err != nil {
			t.Errorf("create=%v: ensureTopic(%s) = %v; want nil", create, large, err)
		}
	}
	p := New(Config{MaxMessageBytes: 1 << 20, TopicCreate: true, TopicPartitions: 1, TopicReplication: -1},
		cl, nil, nil, slog.New(slog.DiscardHandler), metrics.New())
	if err := p.ensureTopic(ctx, fresh); err != nil {
		t.Errorf("ensureTopic(%s), created with the broker's default limit: %v; want nil", fresh, err)
	}
}
