package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/route/avro"
	"github.com/pgoutbox/pgoutbox/route/connect"
	"github.com/pgoutbox/pgoutbox/route/expand"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Router routes rows; it is safe for concurrent use.
type Router struct {
	cfg      Config
	rule     *topicRule
	topics   topicCache
	envelope bool // some field is placed in the envelope
	required map[string]bool
	x        expand.Expander
	avro     *avro.Encoder
	now      func() time.Time
	// context is the values of Debezium's context headers
	// (ExtendedHeaders): logical name, task, connector, run id.
	context [4]connect.Value
}

// contextHeaders are the keys of Debezium's context headers, in its order
// (DebeziumHeaderProducer).
var contextHeaders = [4]string{"__debezium.context.connectorLogicalName", "__debezium.context.taskId", "__debezium.context.connectorName", "__debezium.context.runId"}

// New validates cfg and returns a router. With ValueFormat avro it registers
// the configured schemas, without a deadline; use NewContext to bound that.
func New(cfg Config) (*Router, error) {
	return NewContext(context.Background(), cfg)
}

// NewContext is New with a context for the schema registry requests made
// while starting (Avro only).
func NewContext(ctx context.Context, cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("route config: %w", err)
	}
	rule, err := compileTopicRule(cfg.TopicRegex, cfg.TopicReplacement)
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:      cfg,
		rule:     rule,
		required: make(map[string]bool, len(cfg.RequiredColumns)),
		x: expand.Expander{
			NullAsBytes:       cfg.JSONNullBehavior == NullOptionalBytes,
			EmptyArrayAsArray: cfg.JSONEmptyArrayBehavior == EmptyArrayOptionalString,
		},
		now: time.Now,
	}
	for _, c := range cfg.RequiredColumns {
		r.required[c] = true
	}
	for i, v := range []string{cfg.TopicPrefix, "0", "postgresql", uuid.NewString()} {
		r.context[i] = connect.Value{Kind: connect.KindStr, Bytes: []byte(v)}
	}
	for _, f := range cfg.AdditionalFields {
		if f.Placement == PlaceEnvelope {
			r.envelope = true
		}
	}
	if cfg.ValueFormat == FormatAvro {
		r.avro, err = r.newAvro(ctx)
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

// span is a part of the record's byte buffer; null is a Kafka null.
type span struct {
	off, end int
	null     bool
}

type hdrSpan struct {
	key string
	v   span
}

// record1 puts a record and its first header in one allocation, with room
// for one header more: the connector adds its lease token to every record,
// which would otherwise copy the headers.
type record1 struct {
	rec kgo.Record
	h   [2]kgo.RecordHeader
}

// Route turns one row into a record exactly as Debezium's EventRouter (and
// the configured converters) would, or returns an *Error saying why not
// (see ErrorClass for what the caller does with each class). It never
// returns (nil, nil).
//
// The record owns its bytes: nothing in it aliases the row, which may be
// reused as soon as Route returns. Partition is -1 unless a partition
// placement chose one (see Partitioner). Timestamp is the row's event
// timestamp, or when it was processed (Source.ProcessedTime, else now).
func (r *Router) Route(ctx context.Context, row *Row) (*kgo.Record, error) {
	rec, topic, err := r.route(ctx, row)
	if err != nil && topic != "" {
		var re *Error
		if errors.As(err, &re) && re.Intended == "" {
			re.Intended = topic
		}
	}
	return rec, err
}

// route is Route; it also returns the topic once it is known, so that
// errors after routing can name it.
func (r *Router) route(ctx context.Context, row *Row) (rec *kgo.Record, topic string, err error) {
	if row == nil {
		return nil, topic, errorf(ClassInvalidPayload, nil, "nil row")
	}
	row = withDefaults(row)
	cfg := &r.cfg
	switch row.Op {
	case OpInsert, OpRead:
	case OpDelete:
		return nil, topic, &Error{Class: ClassSkipped, Msg: "delete ignored (outbox cleanup)", Err: ErrSkip, Level: slog.LevelDebug}
	case OpUpdate:
		switch cfg.InvalidOpBehavior {
		case InvalidOpFatal:
			return nil, topic, errorf(ClassInvalidOp, nil, "unexpected update of an outbox row, and table.op.invalid.behavior is fatal")
		case InvalidOpError:
			return nil, topic, &Error{Class: ClassSkipped, Msg: "unexpected update of an outbox row ignored", Err: ErrSkip, Level: slog.LevelError}
		default:
			return nil, topic, &Error{Class: ClassSkipped, Msg: "unexpected update of an outbox row ignored", Err: ErrSkip, Level: slog.LevelWarn}
		}
	default:
		return nil, topic, errorf(ClassInvalidPayload, nil, "unknown operation %d", row.Op)
	}

	size := 64
	for i := range row.Columns {
		size += len(row.Columns[i].Value)
	}
	if r.envelope || cfg.ValueFormat != FormatString || cfg.HeaderFormat != FormatString {
		size += size/4 + 128
	}
	buf := make([]byte, 0, size)
	var hdrStore [4]hdrSpan
	hdrs := hdrStore[:0]

	// Debezium's context headers are on the change event before any
	// transformation: first.
	if cfg.ExtendedHeaders {
		for i, key := range contextHeaders {
			var err error
			if hdrs, buf, err = r.addHeader(hdrs, buf, key, nil, stringSchemaRequired, &r.context[i]); err != nil {
				return nil, topic, err
			}
		}
	}
	// Tracing next: Debezium's ActivateTracingSpan runs before the router
	// adds "id", so its headers come before it.
	if cfg.Tracing {
		if c := row.Lookup(cfg.TracingSpanContextField); c != nil && !c.Null && isStringKind(kindOf(c.Type)) {
			if tp, ts, ok := traceContext(c.Value); ok {
				var err error
				hdrs, buf, err = r.addHeader(hdrs, buf, "traceparent", nil, stringSchemaRequired, &connect.Value{Kind: connect.KindStr, Bytes: tp})
				if err != nil {
					return nil, topic, err
				}
				if len(ts) > 0 {
					hdrs, buf, _ = r.addHeader(hdrs, buf, "tracestate", nil, stringSchemaRequired, &connect.Value{Kind: connect.KindStr, Bytes: ts})
				}
			}
		}
	}

	payloadCol := row.Lookup(cfg.FieldPayload)
	if payloadCol == nil {
		return nil, topic, errorf(ClassMissingField, nil, "Unable to find payload field %s in event (table.field.event.payload)", cfg.FieldPayload)
	}
	ts, err := r.timestamp(row)
	if err != nil {
		return nil, topic, err
	}
	idCol := row.Lookup(cfg.FieldEventID)
	if idCol == nil {
		return nil, topic, errorf(ClassMissingField, nil, "Unable to find event-id field %s in event (table.field.event.id)", cfg.FieldEventID)
	}
	idVal, err := colValue(idCol)
	if err != nil {
		return nil, topic, errorf(ClassInvalidPayload, err, "event id")
	}
	if hdrs, buf, err = r.addHeader(hdrs, buf, "id", idCol, nil, &idVal); err != nil {
		return nil, topic, err
	}

	pv, err := colValue(payloadCol)
	if err != nil {
		return nil, topic, errorf(ClassInvalidPayload, err, "payload")
	}
	// The payload's schema matters only to the JSON formats, envelopes and
	// expansion; the default path does without.
	var ps *connect.Schema
	if cfg.ValueFormat != FormatString || r.envelope || cfg.ExpandJSONPayload {
		ps = r.schemaOf(payloadCol, &pv)
	}
	exp := expand.Kept
	if cfg.ExpandJSONPayload && pv.Kind == connect.KindStr {
		var es *connect.Schema
		var ev connect.Value
		exp, es, ev = r.x.Expand(pv.Bytes, cfg.FieldPayload)
		switch exp {
		case expand.Done:
			ps, pv = es, ev
		case expand.Broken:
			ps = es // the payload stays the string: Debezium's state after a failed toConnectData
		}
	}

	routeCol := row.Lookup(cfg.RouteByField)

	// The envelope: payload, then the envelope fields in configured order.
	var envSchema *connect.Schema
	var envVal connect.Value
	if r.envelope {
		if err := checkRouteBy(routeCol, cfg.RouteByField); err != nil {
			return nil, topic, err
		}
		if ps == nil {
			return nil, topic, errorf(ClassInvalidPayload, nil, "fieldSchema for field payload cannot be null (an empty JSON array payload expanded)")
		}
		envSchema = &connect.Schema{Type: connect.TypeStruct, HasName: true, Name: r.envelopeName(row, routeCol.Value)}
		if cfg.FieldSchemaVersion != "" {
			vc := row.Lookup(cfg.FieldSchemaVersion)
			if vc == nil {
				return nil, topic, errorf(ClassMissingField, nil, "%s is not a valid field name (table.field.event.schema.version)", cfg.FieldSchemaVersion)
			}
			if kindOf(vc.Type) != kInt32 {
				return nil, topic, errorf(ClassInvalidPayload, nil, "field %s is not INT32 (table.field.event.schema.version needs an int4 column)", vc.Name)
			}
			if !vc.Null {
				v, err := colValue(vc)
				if err != nil {
					return nil, topic, errorf(ClassInvalidPayload, err, "schema version")
				}
				envSchema.HasVersion, envSchema.Version = true, int32(v.Int)
			}
		}
		envSchema.Fields = append(envSchema.Fields, connect.Field{Name: "payload", Schema: ps})
		envVal = connect.Value{Kind: connect.KindStruct, List: []connect.Value{pv}}
		if exp == expand.Broken {
			return nil, topic, errorf(ClassInvalidPayload, nil, "the expanded JSON payload does not fit the schema inferred from it")
		}
		for _, f := range cfg.AdditionalFields {
			if f.Placement != PlaceEnvelope {
				continue
			}
			c := row.Lookup(f.Column)
			if c == nil {
				if cfg.AdditionalMissing == MissingIgnore {
					continue
				}
				return nil, topic, errorf(ClassMissingField, nil, "Unable to find field %s in event (table.fields.additional.placement)", f.Column)
			}
			v, err := colValue(c)
			if err != nil {
				return nil, topic, errorf(ClassInvalidPayload, err, "envelope field %s", f.Alias)
			}
			if i := envSchema.FieldIndex(f.Alias); i >= 0 {
				// SchemaBuilder refuses a duplicate field name.
				return nil, topic, errorf(ClassInvalidPayload, nil, "Cannot create field because of field name duplication %s", f.Alias)
			}
			envSchema.Fields = append(envSchema.Fields, connect.Field{Name: f.Alias, Schema: r.schemaOf(c, &v)})
			envVal.List = append(envVal.List, v)
		}
	}

	partition := int32(-1)
	for _, f := range cfg.AdditionalFields {
		if f.Placement == PlaceEnvelope {
			continue
		}
		c := row.Lookup(f.Column)
		if c == nil {
			if cfg.AdditionalMissing == MissingIgnore {
				continue
			}
			return nil, topic, errorf(ClassMissingField, nil, "Unable to find field %s in event (table.fields.additional.placement)", f.Column)
		}
		switch f.Placement {
		case PlaceHeader:
			v, err := colValue(c)
			if err != nil {
				return nil, topic, errorf(ClassInvalidPayload, err, "header %s", f.Alias)
			}
			if hdrs, buf, err = r.addHeader(hdrs, buf, f.Alias, c, nil, &v); err != nil {
				return nil, topic, err
			}
		case PlacePartition:
			if kindOf(c.Type) != kInt32 {
				return nil, topic, errorf(ClassInvalidPayload, nil, "field %s is not INT32 (a partition placement needs an int4 column)", c.Name)
			}
			if !c.Null {
				v, err := colValue(c)
				if err != nil {
					return nil, topic, errorf(ClassInvalidPayload, err, "partition")
				}
				if v.Int < 0 {
					return nil, topic, errorf(ClassInvalidPayload, nil, "partition %d is negative", v.Int)
				}
				partition = int32(v.Int)
			}
		}
	}

	// The topic: RegexRouter over the route.by.field value.
	if err := checkRouteBy(routeCol, cfg.RouteByField); err != nil {
		return nil, topic, err
	}
	topic, err = r.topic(routeCol.Value)
	if err != nil {
		return nil, topic, err
	}

	// The value.
	tombstone := cfg.TombstoneOnEmptyPayload && (pv.Kind == connect.KindNull || pv.Kind == connect.KindStr && javaTrimEmpty(pv.Bytes))
	var val span
	switch {
	case tombstone:
		val.null = true
	case cfg.ValueFormat == FormatAvro:
		if exp == expand.Broken {
			// The payload kept as text with the schema inferred from it:
			// AvroData fails on it, as JsonConverter does.
			return nil, topic, errorf(ClassInvalidPayload, nil, "the expanded JSON payload does not fit the schema inferred from it; AvroConverter fails on it")
		}
		val.off = len(buf)
		var null bool
		jsonText := payloadCol != nil && kindOf(payloadCol.Type) == kJSON
		buf, null, err = r.avro.Encode(ctx, buf, topic, jsonText, ps, &pv, envSchema, &envVal)
		if err != nil {
			return nil, topic, avroError(err)
		}
		val.end, val.null = len(buf), null
	default:
		val.off = len(buf)
		buf, val.null, err = r.appendValue(buf, exp, ps, &pv, envSchema, &envVal)
		if err != nil {
			return nil, topic, err
		}
		val.end = len(buf)
	}

	// The key.
	key := span{null: true}
	if cfg.FieldEventKey != "" {
		kc := row.Lookup(cfg.FieldEventKey)
		if kc == nil {
			return nil, topic, errorf(ClassMissingField, nil, "%s is not a valid field name (table.field.event.key)", cfg.FieldEventKey)
		}
		kv, err := colValue(kc)
		if err != nil {
			return nil, topic, errorf(ClassInvalidPayload, err, "key")
		}
		key.off = len(buf)
		switch cfg.KeyFormat {
		case FormatJSON:
			buf = connect.AppendValueJSON(buf, r.schemaOf(kc, &kv), &kv)
			key.null = false
		case FormatJSONSchema:
			buf = connect.AppendEnvelopeJSON(buf, r.schemaOf(kc, &kv), &kv)
			key.null = false
		default:
			if kv.Kind != connect.KindNull {
				buf = connect.AppendValueString(buf, &kv, true)
				key.null = false
			}
		}
		key.end = len(buf)
	}

	// Assemble: every slice points into buf, which no longer moves.
	// rec is the named result.
	if len(hdrs) == 1 {
		r1 := &record1{}
		rec = &r1.rec
		rec.Headers = r1.h[:0:2]
	} else {
		rec = &kgo.Record{Headers: make([]kgo.RecordHeader, 0, len(hdrs)+1)}
	}
	rec.Topic = topic
	rec.Key = key.slice(buf)
	rec.Value = val.slice(buf)
	for _, h := range hdrs {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.key, Value: h.v.slice(buf)})
	}
	rec.Partition = -1
	if cfg.Runtime == RuntimeConnect {
		rec.Partition = partition
		if ts != noTimestamp {
			rec.Timestamp = time.UnixMilli(ts)
		}
	}
	return rec, topic, nil
}

func (s span) slice(buf []byte) []byte {
	if s.null {
		return nil
	}
	return buf[s.off:s.end:s.end]
}

func checkRouteBy(c *Column, name string) error {
	switch {
	case c == nil:
		return errorf(ClassMissingField, nil, "%s is not a valid field name (route.by.field)", name)
	case c.Null:
		return errorf(ClassMissingField, nil, "column %s (route.by.field) is null: no topic to route to", name)
	case !isStringKind(kindOf(c.Type)):
		return errorf(ClassInvalidPayload, nil, "column %s (route.by.field) is not a string column (type %d)", name, c.Type)
	}
	return nil
}

// topic maps a route.by.field value to its topic, from the cache when it
// can.
func (r *Router) topic(v []byte) (string, error) {
	if e, ok := r.topics.get(v); ok {
		return e.topic, e.err
	}
	s := string(v)
	t := r.rule.apply(s)
	var err error
	if verr := ValidTopic(t); verr != nil {
		err = verr
	}
	r.topics.put(s, topicEntry{topic: t, err: err})
	return t, err
}

// envelopeName is EventRouterDelegate.getSchemaName over the name Debezium
// gives the outbox table's row schema, "<topic.prefix>.<schema>.<table>.Value".
func (r *Router) envelopeName(row *Row, routedBy []byte) string {
	table := row.Source.Table
	if table == "" {
		table = "public.outbox"
	}
	return r.cfg.TopicPrefix + "." + table + "." + string(routedBy) + ".Value"
}

var stringSchemaRequired = &connect.Schema{Type: connect.TypeString}

// addHeader encodes one header with the header converter; the schema is
// s, or column c's.
func (r *Router) addHeader(hdrs []hdrSpan, buf []byte, key string, c *Column, s *connect.Schema, v *connect.Value) ([]hdrSpan, []byte, error) {
	sp := span{off: len(buf)}
	if s == nil && r.cfg.HeaderFormat != FormatString {
		s = r.schemaOf(c, v)
	}
	switch r.cfg.HeaderFormat {
	case FormatJSON:
		buf = connect.AppendValueJSON(buf, s, v)
	case FormatJSONSchema:
		buf = connect.AppendEnvelopeJSON(buf, s, v)
	default:
		// SimpleHeaderConverter: null stays null. Kafka Connect keeps such a
		// header; Debezium Server's engine drops it.
		if v.Kind == connect.KindNull {
			if r.cfg.Runtime == RuntimeServer {
				return hdrs, buf, nil
			}
			sp.null = true
		} else {
			buf = connect.AppendValueString(buf, v, false)
		}
	}
	sp.end = len(buf)
	return append(hdrs, hdrSpan{key: key, v: sp}), buf, nil
}

// appendValue encodes the value with a JSON or string converter; null
// reports a Kafka null.
func (r *Router) appendValue(buf []byte, exp expand.Result, ps *connect.Schema, pv *connect.Value, envSchema *connect.Schema, envVal *connect.Value) ([]byte, bool, error) {
	f := r.cfg.ValueFormat
	structured := envSchema != nil || exp == expand.Done
	if envSchema == nil {
		envSchema, envVal = ps, pv
	}
	switch {
	case exp == expand.Broken && envSchema == ps && ps != nil && f != FormatString:
		return buf, false, errorf(ClassInvalidPayload, nil, "the expanded JSON payload does not fit the schema inferred from it; JsonConverter fails on it")
	case f == FormatJSONSchema:
		if exp == expand.Broken && ps == nil {
			buf = append(buf, `{"schema":null,"payload":`...)
			buf = connect.AppendJSONString(buf, pv.Bytes)
			return append(buf, '}'), false, nil
		}
		return connect.AppendEnvelopeJSON(buf, envSchema, envVal), false, nil
	case f == FormatJSON || structured:
		// StringConverter would print Struct.toString() here; we write what
		// JsonConverter (schemas.enable=false) writes instead.
		if exp == expand.Broken && ps == nil {
			return connect.AppendJSONString(buf, pv.Bytes), false, nil
		}
		return connect.AppendValueJSON(buf, envSchema, envVal), false, nil
	}
	// StringConverter for text, BinaryDataConverter for bytes.
	if pv.Kind == connect.KindNull {
		return buf, true, nil
	}
	return connect.AppendValueString(buf, pv, true), false, nil
}

// javaTrimEmpty reports whether String.trim() of s is empty: every char is
// at most U+0020.
func javaTrimEmpty(s []byte) bool {
	for _, c := range s {
		if c > ' ' {
			return false
		}
	}
	return true
}

// noTimestamp asks the producer to stamp the record (Kafka's NO_TIMESTAMP).
const noTimestamp = -1

// timestamp is EventRouterDelegate.getEventTimestampMs followed by Kafka
// Connect's checkAndConvertTimestamp. Debezium Server computes it too (so its
// errors are the same) and then sends no timestamp; Route drops it there.
func (r *Router) timestamp(row *Row) (int64, error) {
	processed := func() int64 {
		if !row.Source.ProcessedTime.IsZero() {
			return row.Source.ProcessedTime.UnixMilli()
		}
		return r.now().UnixMilli()
	}
	ms := int64(0)
	if name := r.cfg.FieldEventTimestamp; name == "" {
		ms = processed()
	} else {
		c := row.Lookup(name)
		if c == nil {
			return 0, errorf(ClassMissingField, nil, "Unable to find timestamp field %s in event (table.field.event.timestamp)", name)
		}
		switch k := kindOf(c.Type); {
		case c.Null:
			ms = processed()
		case k == kTimestamp:
			t, ok := parsePGTime(c.Value, false)
			if !ok {
				return 0, errorf(ClassInvalidPayload, nil, "timestamp field %s: %q is not a timestamp", name, truncate(c.Value, 64))
			}
			ms = t.UnixMicro() / 1000 // MicroTimestamp: Java's long division
		case k == kTimestamptz:
			t, ok := parsePGTime(c.Value, true)
			if !ok {
				return 0, errorf(ClassInvalidPayload, nil, "timestamp field %s: %q is not a timestamptz", name, truncate(c.Value, 64))
			}
			ms = t.UnixMicro() / 1000
		default:
			return 0, errorf(ClassInvalidPayload, nil, "Unsupported field type of %s (PostgreSQL type %d) for event timestamp: use a timestamp column", name, c.Type)
		}
	}
	if ms < 0 {
		if ms == noTimestamp {
			return noTimestamp, nil
		}
		return 0, errorf(ClassInvalidPayload, nil, "Invalid record timestamp %d (before 1970): Kafka Connect rejects it", ms)
	}
	return ms, nil
}

// newAvro starts the Avro encoder: the registry's client, and the schemas
// of AvroSchemas and AvroSchemaDir registered.
func (r *Router) newAvro(ctx context.Context) (*avro.Encoder, error) {
	files, err := r.cfg.avroSchemaFiles()
	if err != nil {
		return nil, err
	}
	return avro.New(ctx, avro.Options{
		URLs: r.cfg.RegistryURLs, User: r.cfg.RegistryUser, Password: r.cfg.RegistryPassword,
		Subject: r.cfg.AvroSubject, Schemas: files,
		AutoRegister: r.cfg.AvroAutoRegister, UseLatest: r.cfg.AvroUseLatestVersion, LatestStrict: r.cfg.AvroLatestCompatibilityStrict,
		MaxSchemasPerSubject: r.cfg.AvroMaxSchemasPerSubject,
	})
}

// schemaOf is the schema Debezium gives column c holding v: required as the
// catalog says (Column.Info), else as RequiredColumns says; with the
// column's default, as Debezium reads it from the default expression.
func (r *Router) schemaOf(c *Column, v *connect.Value) *connect.Schema {
	optional := !r.required[c.Name]
	if c.Info != nil {
		optional = !c.Info.NotNull
	}
	s := colSchema(c, optional, v)
	if c.Info != nil && c.Info.HasDefault {
		s = c.Info.withDefault(c, s)
	}
	return s
}

// avroError is the Avro encoder's error as a routing error: the registry's
// fault is retried (ClassRegistry), as is its refusal of the schema
// (ClassSchemaRejected); the value's or its given schema's is the row's
// (ClassSchema).
func avroError(err error) error {
	var ae *avro.Error
	if !errors.As(err, &ae) {
		return err
	}
	class := ClassSchema
	switch {
	case ae.Rejected:
		class = ClassSchemaRejected
	case ae.Registry:
		class = ClassRegistry
	}
	return errorf(class, ae.Err, "%s", ae.Msg)
}
