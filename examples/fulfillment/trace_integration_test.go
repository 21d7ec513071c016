package main

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pgoutbox/pgoutbox/examples/fulfillment/fulfill"
	"github.com/pgoutbox/pgoutbox/examples/orders/order"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// otlpReceiver is an OTLP/HTTP trace receiver (protobuf, POST /v1/traces),
// the collector the connector exports its spans to.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		b, err := io.ReadAll(body)
		var ex collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &ex)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range ex.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// named returns the received spans called name.
func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// span is one span of the trace, from either side, as the test compares
// them.
type span struct {
	name, trace, id, parent string
	start, end              time.Time
}

func (s span) String() string {
	return fmt.Sprintf("%q trace %s span %s parent %s", s.name, s.trace, s.id, s.parent)
}

func fromSDK(s tracetest.SpanStub) span {
	p := ""
	if s.Parent.IsValid() {
		p = s.Parent.SpanID().String()
	}
	return span{name: s.Name, trace: s.SpanContext.TraceID().String(), id: s.SpanContext.SpanID().String(), parent: p, start: s.StartTime, end: s.EndTime}
}

func fromOTLP(s *tracepb.Span) span {
	p := hex.EncodeToString(s.ParentSpanId)
	return span{name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId), parent: p,
		start: time.Unix(0, int64(s.StartTimeUnixNano)), end: time.Unix(0, int64(s.EndTimeUnixNano))}
}

// TestOneTraceFromRequestToConsumer: one order posted to the orders
// service yields one trace, across the real broker and the real connector
// binary: the HTTP request's server span (in this process), the relay
// hop's span (exported by the connector over OTLP/HTTP to the test's
// receiver) as its child, starting at the order's commit, and the
// fulfillment handler's span (in this process) as the relay span's child.
func TestOneTraceFromRequestToConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	pool := setupDB(t, pg, "outbox")
	// A topic of its own on the shared broker: the trace must hold this
	// test's order only.
	prefix := fmt.Sprintf("trace%d.event.", time.Now().UnixNano())
	topic := prefix + order.AggregateType
	{
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
		cl.Close()
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	recv := startOTLPReceiver(t)

	port, _ := testenv.FreePort()
	rl := &relay{t: t, bin: testenv.Binary(t, "connector"), env: map[string]string{
		"OUTBOX_PG_DSN": pg.DSN("outbox"), "OUTBOX_KAFKA_BROKERS": brokers,
		"OUTBOX_HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", port), "OUTBOX_STATUS_INTERVAL": "200ms",
		"OUTBOX_ROUTE_TOPIC_REPLACEMENT": prefix + "${routedByValue}",
		// The standard settings the SDK and the exporter read; the batch
		// processor's delay (ms) shortened so the test need not wait 5 s.
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL, "OTEL_BSP_SCHEDULE_DELAY": "100",
	}}
	rl.start(true)

	c, err := inbox.New(pool, fulfill.Handle, inbox.Config{Brokers: []string{brokers}, Group: "fulfillment-trace",
		Topics: []string{topic}, TracerProvider: tp, KafkaOpts: []kgo.Opt{kgo.MetadataMinAge(250 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() { defer close(consumed); _ = c.Run(cctx) }()
	defer func() { ccancel(); <-consumed }()

	srv := httptest.NewServer(order.Handler(&order.Service{DB: pool}, otelhttp.WithTracerProvider(tp)))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"customer":"ada","amount_cents":1299}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d", resp.StatusCode)
	}

	relayName, handlerName := "outbox relay "+topic, "process "+topic
	// The handler's span first (the order went the whole way), then the
	// relay's, which the connector's batching processor exports within
	// OTEL_BSP_SCHEDULE_DELAY of Kafka's ack: ten seconds is ample.
	var local []tracetest.SpanStub
	var relayed []*tracepb.Span
	var relayDeadline time.Time
	for {
		local = exp.GetSpans()
		relayed = recv.named(relayName)
		handled := false
		for _, s := range local {
			handled = handled || s.Name == handlerName
		}
		if handled && len(relayed) > 0 {
			break
		}
		if handled && relayDeadline.IsZero() {
			relayDeadline = time.Now().Add(10 * time.Second)
		}
		if ctx.Err() != nil || !relayDeadline.IsZero() && time.Now().After(relayDeadline) {
			var names []string
			for _, s := range local {
				names = append(names, fromSDK(s).String())
			}
			t.Fatalf("handler span seen %v, relay spans %d; local spans %v; connector output:\n%s",
				handled, len(relayed), names, tailOf(rl.p.Output()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var all []span
	for _, s := range local {
		all = append(all, fromSDK(s))
	}
	for _, s := range relayed {
		all = append(all, fromOTLP(s))
	}
	one := func(name string) span {
		t.Helper()
		var found []span
		for _, s := range all {
			if s.name == name {
				found = append(found, s)
			}
		}
		if len(found) != 1 {
			t.Fatalf("%d spans %q, want one; all: %v", len(found), name, all)
		}
		return found[0]
	}
	req, hop, handler := one("POST /orders"), one(relayName), one(handlerName)
	t.Logf("request %v\nrelay   %v\nhandler %v", req, hop, handler)
	for _, s := range all {
		if s.trace != req.trace {
			t.Errorf("span %v is not in the request's trace %s: want one trace", s, req.trace)
		}
	}
	if req.parent != "" {
		t.Errorf("the request's span has a parent: %v", req)
	}
	if hop.parent != req.id {
		t.Errorf("relay span's parent %s, want the request's span %s", hop.parent, req.id)
	}
	if handler.parent != hop.id {
		t.Errorf("handler span's parent %s, want the relay span %s", handler.parent, hop.id)
	}
	// The relay hop starts at the order's commit, inside the request, and
	// ends at Kafka's ack, before the handler ran.
	if hop.start.Before(req.start) || hop.start.After(req.end) || hop.end.Before(hop.start) || hop.end.After(handler.end) {
		t.Errorf("relay span %v..%v: want it to start within the request %v..%v and end before the handler's end %v",
			hop.start, hop.end, req.start, req.end, handler.end)
	}
	if kind := relayed[0].Kind; kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Errorf("relay span kind %v", kind)
	}
	for _, s := range local {
		if s.Name == handlerName && s.SpanKind != trace.SpanKindConsumer || s.Name == "POST /orders" && s.SpanKind != trace.SpanKindServer {
			t.Errorf("span %q kind %v", s.Name, s.SpanKind)
		}
	}
}
