package publish

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/route"
)

// The writer's span, as outbox.Writer stores it in tracingspancontext.
const (
	writerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	writerSpan  = "00f067aa0ba902b7"
	writerTP    = "00-" + writerTrace + "-" + writerSpan + "-01"
)

// TestRelaySpan: with a tracer, a record carrying a trace context gets the
// relay hop's span (child of the writer's span, from the commit time to
// Kafka's ack, with where Kafka put it) and its traceparent names that
// span; a record without one gets neither. Without a tracer the router's
// headers go out untouched and no span exists. In both Kafka modes.
func TestRelaySpan(t *testing.T) {
	for _, transactional := range []bool{false, true} {
		for _, tracing := range []bool{false, true} {
			name := map[bool]string{false: "idempotent", true: "transactional"}[transactional] + map[bool]string{false: "/tracing off", true: "/tracing on"}[tracing]
			t.Run(name, func(t *testing.T) { testRelaySpan(t, transactional, tracing) })
		}
	}
}

func testRelaySpan(t *testing.T, transactional, tracing bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	exp := tracetest.NewInMemoryExporter()
	cfg := Config{DLQTopic: "outbox.dlq", Transactional: transactional}
	if tracing {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		cfg.Tracer = tp.Tracer("test")
	}
	l := newLine(t, brokers, cfg, route.DefaultConfig())
	commit := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	traced := eventRow("id", "e-traced", "Order", "o-1", `{"n":1}`, 10, 20)
	traced.Source.CommitTime = commit
	traced.Columns = append(traced.Columns, route.Column{Name: "tracingspancontext", Type: route.OIDText,
		Value: []byte("#Tue Dec 01 10:00:00 UTC 2026\ntraceparent=" + writerTP + "\ntracestate=congo\\=t61rcWkgMzE\n")})
	untraced := eventRow("id", "e-plain", "Order", "o-2", `{"n":2}`, 30, 40)
	l.add(20, traced)
	l.add(40, untraced)
	l.run(ctx, 3)

	recs := consumeAll(t, ctx, brokers, "outbox.event.Order", 2)
	header := func(r *kgo.Record, k string) (string, bool) {
		for _, h := range r.Headers {
			if h.Key == k {
				return string(h.Value), true
			}
		}
		return "", false
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, "id")
		byID[id] = r
	}
	if _, ok := header(byID["e-plain"], "traceparent"); ok {
		t.Errorf("untraced record got a traceparent: %v", byID["e-plain"].Headers)
	}
	tp, _ := header(byID["e-traced"], "traceparent")
	ts, _ := header(byID["e-traced"], "tracestate")
	if ts != "congo=t61rcWkgMzE" {
		t.Errorf("tracestate %q", ts)
	}
	spans := exp.GetSpans()
	if !tracing {
		if tp != writerTP || len(spans) != 0 {
			t.Fatalf("tracing off: traceparent %q (want the writer's %q), %d spans", tp, writerTP, len(spans))
		}
		return
	}
	if len(spans) != 1 {
		t.Fatalf("%d spans, want the traced record's one: %+v", len(spans), spans)
	}
	s := spans[0]
	if got := s.Parent.SpanID().String(); got != writerSpan || s.SpanContext.TraceID().String() != writerTrace {
		t.Errorf("span %s in trace %s has parent %s; want a child of %s in %s", s.SpanContext.SpanID(), s.SpanContext.TraceID(), got, writerSpan, writerTrace)
	}
	if want := "00-" + writerTrace + "-" + s.SpanContext.SpanID().String() + "-01"; tp != want {
		t.Errorf("record traceparent %q, want the relay span's %q", tp, want)
	}
	if s.Name != "outbox relay outbox.event.Order" || s.SpanKind != trace.SpanKindProducer {
		t.Errorf("span %q kind %v", s.Name, s.SpanKind)
	}
	if !s.StartTime.Equal(commit) || !s.EndTime.After(commit) {
		t.Errorf("span from %v to %v; want from the commit time %v", s.StartTime, s.EndTime, commit)
	}
	attrs := map[attribute.Key]string{}
	for _, a := range s.Attributes {
		attrs[a.Key] = a.Value.Emit()
	}
	r := byID["e-traced"]
	for k, want := range map[attribute.Key]string{"messaging.message.id": "e-traced", "messaging.destination.name": "outbox.event.Order",
		"outbox.aggregate_type": "Order", "messaging.destination.partition.id": "0", "messaging.kafka.offset": strconv.FormatInt(r.Offset, 10)} {
		if attrs[k] != want {
			t.Errorf("attribute %s = %q, want %q (all: %v)", k, attrs[k], want, attrs)
		}
	}
}

// consumeAll reads n records of topic (read_committed).
func consumeAll(t *testing.T, ctx context.Context, brokers, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}
