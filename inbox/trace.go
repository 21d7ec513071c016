package inbox

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The handler's span continues the trace the record carries: its
// traceparent and tracestate headers (the connector's relay span when the
// connector traces, the writer's span otherwise) are the parent of a
// consumer span around each handler attempt, and the handler's ctx carries
// that span, so what the handler does is part of the trace. The tracer comes
// from Config.TracerProvider, by default OpenTelemetry's global one, which
// is a no-op until the program installs an SDK.

// instrumentation names the tracer.
const instrumentation = "github.com/pgoutbox/pgoutbox/inbox"

// traceContext is W3C's propagator: the connector writes W3C headers
// whatever else the program propagates.
var traceContext propagation.TraceContext

// recordCarrier reads a record's headers as a propagation.TextMapCarrier.
type recordCarrier struct{ rec *kgo.Record }

func (c recordCarrier) Get(key string) string { return Header(c.rec, key) }

// Set does nothing: the record is the broker's, not ours to change.
func (recordCarrier) Set(string, string) {}

func (c recordCarrier) Keys() []string {
	keys := make([]string, len(c.rec.Headers))
	for i, h := range c.rec.Headers {
		keys[i] = h.Key
	}
	return keys
}

// startSpan starts the span of one handler attempt on rec, a child of the
// trace context its headers carry (a root span without one).
func (c *Consumer) startSpan(ctx context.Context, rec *kgo.Record, id string) (context.Context, trace.Span) {
	ctx = traceContext.Extract(ctx, recordCarrier{rec})
	return c.tracer.Start(ctx, "process "+rec.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", rec.Topic),
		attribute.String("messaging.destination.partition.id", strconv.Itoa(int(rec.Partition))),
		attribute.Int64("messaging.kafka.offset", rec.Offset),
		attribute.String("messaging.message.id", id),
		attribute.String("messaging.consumer.group.name", c.cfg.Group),
	))
}

// endSpan ends an attempt's span with the handler's verdict.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "handler failed")
	}
	span.End()
}
