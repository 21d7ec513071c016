package inbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestHandlerSpan: the handler runs in a consumer span that is the child
// of the record's traceparent (the relay's span), gets that span in its
// ctx, and the span ends with the handler's verdict, a panic's included.
func TestHandlerSpan(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		relayID = "b7ad6b7169203331"
	)
	boom := errors.New("boom")
	tests := []struct {
		name       string
		headers    []kgo.RecordHeader
		handler    func(ctx context.Context) error
		wantParent string // "" = a root span
		wantErr    bool
	}{
		{"child of the record's traceparent", []kgo.RecordHeader{{Key: "id", Value: []byte("e1")},
			{Key: "traceparent", Value: []byte("00-" + traceID + "-" + relayID + "-01")}, {Key: "tracestate", Value: []byte("congo=t61rcWkgMzE")}},
			func(context.Context) error { return nil }, relayID, false},
		{"no trace context: a root span", []kgo.RecordHeader{{Key: "id", Value: []byte("e2")}},
			func(context.Context) error { return nil }, "", false},
		{"an invalid traceparent: a root span", []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-zz-" + relayID + "-01")}},
			func(context.Context) error { return nil }, "", false},
		{"handler error", []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + traceID + "-" + relayID + "-01")}},
			func(context.Context) error { return boom }, relayID, true},
		{"handler panic", []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + traceID + "-" + relayID + "-01")}},
			func(context.Context) error { panic("no") }, relayID, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			var inHandler trace.SpanContext
			c := &Consumer{cfg: Config{Group: "g", TxTimeout: time.Second}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				tracer: tp.Tracer(instrumentation),
				h: func(ctx context.Context, _ pgx.Tx, _ *kgo.Record) error {
					inHandler = trace.SpanContextFromContext(ctx)
					return tc.handler(ctx)
				}}
			rec := &kgo.Record{Topic: "outbox.event.Order", Partition: 2, Offset: 7, Headers: tc.headers}
			err := c.call(context.Background(), nil, rec, "e1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("call: %v", err)
			}
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			s := spans[0]
			if s.SpanContext.SpanID() != inHandler.SpanID() {
				t.Errorf("handler's ctx has span %s, want the consumer span %s", inHandler.SpanID(), s.SpanContext.SpanID())
			}
			if s.Name != "process outbox.event.Order" || s.SpanKind != trace.SpanKindConsumer {
				t.Errorf("span %q kind %v", s.Name, s.SpanKind)
			}
			if tc.wantParent == "" {
				if s.Parent.IsValid() {
					t.Errorf("parent %s, want a root span", s.Parent.SpanID())
				}
			} else {
				if s.Parent.SpanID().String() != tc.wantParent || s.SpanContext.TraceID().String() != traceID || !s.Parent.IsRemote() {
					t.Errorf("span in trace %s with parent %s, want a child of %s in %s", s.SpanContext.TraceID(), s.Parent.SpanID(), tc.wantParent, traceID)
				}
				if s.SpanContext.TraceState().Get("congo") == "" && len(tc.headers) == 3 {
					t.Error("tracestate lost")
				}
			}
			if (s.Status.Code == codes.Error) != tc.wantErr {
				t.Errorf("status %v, handler error %v", s.Status, err)
			}
		})
	}
}

// TestHandlerSpanDefault: without Config.TracerProvider the global one
// (a no-op here) is used, and the handler still gets the record's trace
// context in its ctx, for its own calls to propagate.
func TestHandlerSpanDefault(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := New(pool, func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
		Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.cl.Close()
	var got trace.SpanContext
	c.h = func(ctx context.Context, _ pgx.Tx, _ *kgo.Record) error {
		got = trace.SpanContextFromContext(ctx)
		return nil
	}
	rec := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01")}}}
	if err := c.call(context.Background(), nil, rec, "e"); err != nil {
		t.Fatal(err)
	}
	if got.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("handler's ctx: %v", got)
	}
}
