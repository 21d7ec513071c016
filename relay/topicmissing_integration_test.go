package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestMissingTopicStall: with OUTBOX_TOPIC_CREATE=false an event for a
// topic that does not exist waits for it, and the relay says so: after the
// stall timeout it is stalled (/healthz, /readyz), its last error names the
// topic and the setting, and outbox_connector_topic_missing{topic} is 1.
// Created, the topic gets the event and the stall ends.
func TestMissingTopicStall(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("missing")
	topic := "outbox.event." + aggType
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.TopicCreate = false
	cfg.DLQTopic = uniqueType("dlq")
	cfg.StallTimeout = 2 * time.Second
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	create := func(name string) {
		t.Helper()
		resp, err := adm.CreateTopic(ctx, 3, -1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	create(cfg.DLQTopic) // the DLQ topic must exist too
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 1, 1, 1)

	deadline := time.Now().Add(30 * time.Second)
	for {
		stalled, why := run.relay.Stalled()
		last := run.relay.LastError()
		if stalled && strings.Contains(last, topic) && strings.Contains(last, "OUTBOX_TOPIC_CREATE") {
			t.Logf("stalled: %s; last error: %s", why, last)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after an event for the missing topic: Stalled() = %v, %q, LastError() = %q; want a stall and the last error naming %s and OUTBOX_TOPIC_CREATE", stalled, why, last, topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := gaugeValue(t, run, "outbox_connector_topic_missing", topic); v != 1 {
		t.Errorf("outbox_connector_topic_missing{topic=%q} = %v; want 1", topic, v)
	}

	c := testenv.StartConsumer(t, brokers, topic)
	create(topic)
	c.WaitFor(t, w.Events, 60*time.Second)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if stalled, _ := run.relay.Stalled(); !stalled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still stalled 30s after the topic was created and the event delivered")
		}
	}
	if v := gaugeValue(t, run, "outbox_connector_topic_missing", topic); v != 0 {
		t.Errorf("outbox_connector_topic_missing{topic=%q} = %v once it exists; want 0", topic, v)
	}
}

func gaugeValue(t testing.TB, run *running, name, topic string) float64 {
	t.Helper()
	mfs, err := run.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "topic" && lp.GetValue() == topic {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
