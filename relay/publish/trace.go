package publish

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// The relay hop's span. With Config.Tracer set (an OTLP endpoint is
// configured), a record whose router gave it a traceparent header (the
// outbox row's tracingspancontext) gets a span of its own: its parent is
// the writer's span named by that header, it starts at the transaction's
// commit time from the WAL (the Begin message's timestamp, the same clock
// as the commit-to-ack metric; the time the relay read the row where the
// source has none) and ends at Kafka's ack (in transactional mode, when
// its Kafka transaction committed, the moment read_committed consumers can
// see it). The record's traceparent is rewritten to name this span, so a
// consumer's span is the relay hop's child. Without Config.Tracer, or for
// a record without a valid traceparent, nothing is added: the untraced
// path costs one nil check. A span never holds a record back: it is
// started before the record is produced and ended from the promise or the
// commit, where the record's fate is already decided; the SDK's batching
// processor exports it on a goroutine of its own.

// traceContext is W3C's propagator, not the global one: the header's
// format is W3C's whatever else the process propagates.
var traceContext propagation.TraceContext

// headerCarrier is a record's headers as a propagation.TextMapCarrier.
type headerCarrier struct{ rec *kgo.Record }

func (c headerCarrier) Get(key string) string {
	for _, h := range c.rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) {
	for i := range c.rec.Headers {
		if c.rec.Headers[i].Key == key {
			c.rec.Headers[i].Value = []byte(value)
			return
		}
	}
	c.rec.Headers = append(c.rec.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.rec.Headers))
	for i, h := range c.rec.Headers {
		keys[i] = h.Key
	}
	return keys
}

// relaySpan starts the relay hop's span of rec, the record of ev, and
// points rec's traceparent at it; nil when rec carries no valid trace
// context. Called only with Config.Tracer set.
func (p *Producer) relaySpan(ev wal.Event, rec *kgo.Record) trace.Span {
	hc := headerCarrier{rec}
	if hc.Get("traceparent") == "" {
		return nil
	}
	parent := traceContext.Extract(context.Background(), hc)
	if !trace.SpanContextFromContext(parent).IsValid() {
		return nil
	}
	start := ev.Row.Source.CommitTime
	if start.IsZero() {
		start = time.Now()
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", rec.Topic),
		attribute.String("messaging.message.id", hc.Get("id")),
		attribute.String("messaging.kafka.message.key", string(rec.Key)),
	}
	if ev.Row != nil {
		if c := ev.Row.Lookup(p.aggField); c != nil && !c.Null {
			attrs = append(attrs, attribute.String("outbox.aggregate_type", string(c.Value)))
		}
		if ev.Row.Source.CommitLSN != 0 {
			attrs = append(attrs, attribute.String("db.postgresql.commit_lsn", wal.FormatLSN(ev.Row.Source.CommitLSN)))
		}
	}
	ctx, span := p.cfg.Tracer.Start(parent, "outbox relay "+rec.Topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	traceContext.Inject(ctx, hc)
	return span
}

// ackSpan records where Kafka put the record.
func ackSpan(span trace.Span, r *kgo.Record) {
	span.SetAttributes(attribute.String("messaging.destination.partition.id", strconv.Itoa(int(r.Partition))),
		attribute.Int64("messaging.kafka.offset", r.Offset))
}

// endSpan ends a span whose record was acked (err nil) or not: a record
// that failed is read again from the WAL and gets a span of its own then.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "not published in this session; read again from the confirmed position")
	}
	span.End()
}

// endTxnSpans ends the spans of a Kafka transaction's records.
func endTxnSpans(recs []txnRec, err error) {
	for i := range recs {
		if s := recs[i].span; s != nil {
			endSpan(s, err)
			recs[i].span = nil
		}
	}
}
