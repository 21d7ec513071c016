package publish

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// metricValue reads a gauge or counter of the registry by name and labels
// (-1 if absent).
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestMissingTopicSaidAloud: with OUTBOX_TOPIC_CREATE=false, an event for
// a topic that does not exist waits for it, and says so: an error log line
// naming the topic and the setting, outbox_connector_topic_missing{topic}
// at 1, and the Blocked hook (which the relay shows in /readyz). Once the
// topic is created the event is published and the gauge drops to 0.
func TestMissingTopicSaidAloud(t *testing.T) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "missing"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers)}, ClientOpts(100, 1<<20, "none", time.Millisecond)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	lb := newLogBuffer(t)
	m := metrics.New()
	var blocked atomic.Pointer[string] // what the Blocked hook was told last
	cfg := Config{DLQTopic: dlq, MaxMessageBytes: 1 << 20, TopicCreate: false, Poison: &Poison{}, Blocked: func(s string) { blocked.Store(&s) }}
	p := New(cfg, cl, router, nil, lb.logger(), m)
	in := make(chan wal.Event, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, in, func() {}) }()
	tr := tracker.New(0)
	txn := tr.Begin(100)
	txn.Add()
	in <- wal.Event{Txn: txn, Row: eventRow("id", "ev-"+suffix, aggType, "a", `{}`, 90, 100)}
	txn.Commit(100)

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(lb.String(), "OUTBOX_TOPIC_CREATE") || metricValue(t, m.Registry, "outbox_connector_topic_missing", map[string]string{"topic": topic}) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s of waiting for the missing topic %s: no log line naming OUTBOX_TOPIC_CREATE, outbox_connector_topic_missing = %v; log:\n%s",
				topic, metricValue(t, m.Registry, "outbox_connector_topic_missing", map[string]string{"topic": topic}), lb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(lb.String(), "level=ERROR") || !strings.Contains(lb.String(), topic) {
		t.Errorf("the log does not name the missing topic at level ERROR:\n%s", lb.String())
	}
	if s := blocked.Load(); s == nil || !strings.Contains(*s, topic) || !strings.Contains(*s, "OUTBOX_TOPIC_CREATE") {
		t.Errorf("the Blocked hook was told %v; want a reason naming the topic and OUTBOX_TOPIC_CREATE", s)
	}
	if tr.Acked() != 0 {
		t.Fatalf("acked %d while the topic is missing", tr.Acked())
	}

	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, topic)
	c.WaitFor(t, []testenv.Event{{ID: "ev-" + suffix}}, 60*time.Second)
	for tr.Acked() != 100 && time.Now().Before(deadline.Add(60*time.Second)) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := metricValue(t, m.Registry, "outbox_connector_topic_missing", map[string]string{"topic": topic}); got != 0 {
		t.Errorf("outbox_connector_topic_missing = %v once the topic exists; want 0", got)
	}
	if s := blocked.Load(); s == nil || *s != "" {
		t.Errorf("the Blocked hook was last told %q once the topic exists; want \"\"", *s)
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
