package cdc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/route"
)

// magicByte opens every value in the Confluent wire format.
const magicByte = 0

// Registry is the part of a schema registry client the decoder uses;
// *sr.Client is one.
type Registry interface {
	SchemaByID(ctx context.Context, id int) (sr.Schema, error)
}

// AvroDecoder decodes change events that Debezium wrote with Confluent's
// AvroConverter: magic byte 0, the writer's schema id (4 bytes, big-endian),
// the Avro binary datum of the change-event envelope. Schemas are fetched
// from the registry by id once and kept for the life of the decoder (an id
// never changes its schema); an id the registry does not know is
// remembered for a minute. It is safe for concurrent use.
type AvroDecoder struct {
	reg Registry
	now func() time.Time

	mu      sync.Mutex
	schemas map[int]*envelopeSchema
	bad     map[int]badSchema
}

// badSchema is a schema id that cannot decode anything: not in the
// registry (retried after until), or not a change-event envelope (for ever).
type badSchema struct {
	err   *route.Error
	until time.Time // zero: for ever
}

// unknownIDTTL is how long an id the registry said it does not know is
// taken as unknown, so that a run of such records costs one request.
const unknownIDTTL = time.Minute

// envelopeSchema is a writer's schema that is a Debezium change-event
// envelope.
type envelopeSchema struct {
	id  int
	typ *avroType
}

// NewAvroDecoder returns a decoder reading schemas from reg.
func NewAvroDecoder(reg Registry) *AvroDecoder {
	return &AvroDecoder{reg: reg, now: time.Now, schemas: map[int]*envelopeSchema{}, bad: map[int]badSchema{}}
}

// Decode turns one Confluent-wire-format value into a row. Errors are
// *route.Error: class route.ClassRegistry when the registry could not be
// asked (retry the record), route.ClassSchema when the schema id is unknown
// or not a change-event envelope, route.ClassInvalidPayload when the datum
// does not decode; ErrTombstone for a null value.
func (d *AvroDecoder) Decode(ctx context.Context, value []byte) (*route.Row, error) {
	if len(value) == 0 {
		return nil, ErrTombstone
	}
	if value[0] != magicByte {
		return nil, invalid(nil, "not the Confluent wire format: first byte is 0x%02x, want 0x00", value[0])
	}
	if len(value) < 5 {
		return nil, invalid(nil, "not the Confluent wire format: %d bytes, shorter than the 5-byte header", len(value))
	}
	id := int(binary.BigEndian.Uint32(value[1:5]))
	es, err := d.schema(ctx, id)
	if err != nil {
		return nil, err
	}
	r := avroReader{b: value[5:]}
	v, err := r.read(es.typ, 0)
	if err != nil {
		return nil, invalid(err, "Avro change event does not decode with its writer's schema (id %d)", id)
	}
	if len(r.b) != 0 {
		return nil, invalid(nil, "Avro change event has %d bytes after the datum of schema id %d", len(r.b), id)
	}
	env, ok := v.(*recordValue)
	if !ok {
		return nil, invalid(nil, "Avro change event (schema id %d) is not a record", id)
	}
	row, err := envelopeRow(env)
	if err != nil {
		return nil, invalid(err, "Avro change event (schema id %d)", id)
	}
	return row, nil
}

func invalid(err error, format string, args ...any) *route.Error {
	return &route.Error{Class: route.ClassInvalidPayload, Msg: fmt.Sprintf(format, args...), Err: err, Level: slog.LevelError}
}

func schemaErr(err error, format string, args ...any) *route.Error {
	return &route.Error{Class: route.ClassSchema, Msg: fmt.Sprintf(format, args...), Err: err, Level: slog.LevelError}
}

// schema returns the envelope schema of id, asking the registry the first
// time.
func (d *AvroDecoder) schema(ctx context.Context, id int) (*envelopeSchema, error) {
	d.mu.Lock()
	es, bad := d.schemas[id], d.bad[id]
	d.mu.Unlock()
	if es != nil {
		return es, nil
	}
	if bad.err != nil && (bad.until.IsZero() || d.now().Before(bad.until)) {
		return nil, bad.err
	}
	s, err := d.reg.SchemaByID(ctx, id)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound && re.ErrorCode == sr.ErrSchemaNotFound.Code {
			// The registry answered, and does not know the id: the
			// record was written against another registry, or is not
			// what it seems. A 404 without that code is a wrong URL:
			// retried like an unreachable registry, never dead-lettered.
			e := schemaErr(err, "Avro change event: schema id %d is not in the schema registry", id)
			d.remember(id, badSchema{err: e, until: d.now().Add(unknownIDTTL)})
			return nil, e
		}
		return nil, &route.Error{Class: route.ClassRegistry, Msg: fmt.Sprintf("fetch the schema of id %d from the schema registry", id), Err: err, Level: slog.LevelError}
	}
	typ, err := envelopeType(s)
	if err != nil {
		e := schemaErr(err, "Avro change event: schema id %d is not a Debezium change-event envelope", id)
		d.remember(id, badSchema{err: e})
		return nil, e
	}
	es = &envelopeSchema{id: id, typ: typ}
	d.mu.Lock()
	d.schemas[id] = es
	delete(d.bad, id)
	d.mu.Unlock()
	return es, nil
}

func (d *AvroDecoder) remember(id int, b badSchema) {
	d.mu.Lock()
	d.bad[id] = b
	d.mu.Unlock()
}

// envelopeType parses a registry schema and checks that it is Debezium's
// change-event envelope: a record with op (string), after (a record, or
// null), and source.
func envelopeType(s sr.Schema) (*avroType, error) {
	if s.Type != sr.TypeAvro {
		return nil, fmt.Errorf("it is a %s schema", s.Type)
	}
	if len(s.References) > 0 {
		return nil, errors.New("schemas with references are not supported")
	}
	t, err := parseAvroSchema(s.Schema)
	if err != nil {
		return nil, err
	}
	if t.kind != "record" {
		return nil, fmt.Errorf("top-level type is %s, want a record", t.kind)
	}
	if f := t.field("op"); f == nil || f.typ.nonNull().kind != "string" {
		return nil, fmt.Errorf("record %s has no string field op", t.fullName)
	}
	after := t.field("after")
	if after == nil || after.typ.nonNull().kind != "record" {
		return nil, fmt.Errorf("record %s has no record field after (was ExtractNewRecordState applied?)", t.fullName)
	}
	if f := t.field("source"); f == nil || f.typ.nonNull().kind != "record" {
		return nil, fmt.Errorf("record %s has no record field source", t.fullName)
	}
	return t, nil
}

// envelopeRow builds the row from a decoded envelope, as DecodeJSON does
// from a JSON one.
func envelopeRow(env *recordValue) (*route.Row, error) {
	var meta eventMeta
	if v, _ := env.get("op"); v != nil {
		meta.op, _ = v.(string)
	}
	if v, _ := env.get("ts_ms"); v != nil {
		meta.tsMs, _ = v.(int64)
	}
	if v, _ := env.get("source"); v != nil {
		src, ok := v.(*recordValue)
		if !ok {
			return nil, fmt.Errorf("source is a %T, not a record", v)
		}
		if lsn, ok := src.get("lsn"); ok && lsn != nil {
			n, _ := lsn.(int64)
			meta.lsn, meta.hasLSN = uint64(n), true
		}
		if ts, ok := src.get("ts_ms"); ok && ts != nil {
			meta.sourceTsMs, _ = ts.(int64)
		}
		if s, ok := src.get("schema"); ok && s != nil {
			meta.schema, _ = s.(string)
		}
		if s, ok := src.get("table"); ok && s != nil {
			meta.table, _ = s.(string)
		}
	}
	row, err := meta.row()
	if err != nil {
		return nil, err
	}
	after, _ := env.get("after")
	if after == nil {
		return row, nil
	}
	rec, ok := after.(*recordValue)
	if !ok {
		return nil, fmt.Errorf("after is a %T, not a record", after)
	}
	row.Columns = make([]route.Column, 0, len(rec.vals))
	for i, f := range rec.typ.fields {
		t := f.typ.connect()
		v, err := avroValue(t, rec.vals[i])
		if err != nil {
			return nil, fmt.Errorf("column %q: %w", f.name, err)
		}
		c, err := column(f.name, t, v)
		if err != nil {
			return nil, err
		}
		row.Columns = append(row.Columns, c)
	}
	return row, nil
}

// avroValue turns a decoded Avro value into what column takes: Connect
// Decimals (bytes with a scale) and VariableScaleDecimals (a struct of scale
// and bytes) become decimals; structs, arrays and maps the router has no
// type for become their JSON.
func avroValue(t connectType, v any) (any, error) {
	switch x := v.(type) {
	case []byte:
		if t.Name == nameDecimal {
			scale, err := scaleParam(t)
			if err != nil {
				return nil, err
			}
			return decimalValue{unscaled: unscaledFromBytes(x), scale: scale}, nil
		}
	case *recordValue:
		if t.Name == nameVarScaleDecimal {
			scale, _ := x.get("scale")
			b, _ := x.get("value")
			s, ok1 := scale.(int64)
			raw, ok2 := b.([]byte)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("%s is not a struct of scale and value", nameVarScaleDecimal)
			}
			if err := checkScale(int(s)); err != nil {
				return nil, err
			}
			return decimalValue{unscaled: unscaledFromBytes(raw), scale: int(s)}, nil
		}
		return marshalRaw(x)
	case []any, map[string]any:
		return marshalRaw(x)
	}
	return v, nil
}

func marshalRaw(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return rawJSON(b), nil
}
