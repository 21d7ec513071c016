// Package cdc decodes Debezium PostgreSQL change events into route.Rows, so
// that teams already running Debezium can route an existing change-event
// topic with the same router the connector uses. It reads what Kafka
// Connect's JsonConverter writes (with or without schemas) and what
// Confluent's AvroConverter writes (Confluent wire format against a schema
// registry; Apicurio's converter in its Confluent-compatible mode writes the
// same). Either way a column ends up with the PostgreSQL type and text the
// router would have seen from pgoutput, so routing does not depend on the
// converter Debezium used.
package cdc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgoutbox/pgoutbox/route"
)

// ErrTombstone is a record with a null value (Debezium's tombstone after a
// delete): nothing to route.
var ErrTombstone = errors.New("tombstone")

// ErrNoRegistry is an Avro change event met with no schema registry
// configured. It is a setting to fix, not a poison record: the caller stops.
var ErrNoRegistry = errors.New("the change event is Avro in the Confluent wire format (first byte 0), and no schema registry is configured")

// Format is the encoding of the change events.
type Format string

// The formats.
const (
	// FormatAuto tells the two apart by the first byte: 0 is the
	// Confluent wire format's magic byte, which no JSON text starts with.
	FormatAuto Format = "auto"
	// FormatJSON is Kafka Connect's JsonConverter, with or without schemas.
	FormatJSON Format = "json"
	// FormatAvro is Confluent's AvroConverter (magic byte 0, 4-byte
	// big-endian schema id, Avro binary), or Apicurio's converter with
	// apicurio.registry.as-confluent=true and headers disabled.
	FormatAvro Format = "avro"
)

// ParseFormat reads auto, json or avro.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatAuto, FormatJSON, FormatAvro:
		return f, nil
	}
	return "", fmt.Errorf("%q is not auto, json or avro", s)
}

// Decoder decodes change events of the configured format.
type Decoder struct {
	// Format is the events' encoding (default FormatAuto).
	Format Format
	// PayloadField is the payload column (table.field.event.payload); in
	// JSON without schemas it is taken as jsonb when its text is JSON.
	PayloadField string
	// Avro decodes the Confluent wire format; nil when no registry is
	// configured.
	Avro *AvroDecoder
}

// Decode turns one record value into a row. A null or empty value is
// ErrTombstone. Errors from a registry that could not answer are
// *route.Error of class route.ClassRegistry (retry the record later); an
// Avro event with no registry configured is ErrNoRegistry; every other error
// means the record itself cannot be decoded (dead-letter it).
func (d *Decoder) Decode(ctx context.Context, value []byte) (*route.Row, error) {
	if len(value) == 0 {
		return nil, ErrTombstone
	}
	avro := d.Format == FormatAvro || (d.Format != FormatJSON && value[0] == magicByte)
	if !avro {
		return DecodeJSON(value, d.PayloadField)
	}
	if d.Avro == nil {
		return nil, ErrNoRegistry
	}
	return d.Avro.Decode(ctx, value)
}

// envelope is a Debezium change event's value, schemas disabled.
type envelope struct {
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
	Source struct {
		LSN    *uint64 `json:"lsn"`
		TsMs   int64   `json:"ts_ms"`
		Table  string  `json:"table"`
		Schema string  `json:"schema"`
	} `json:"source"`
	Op   string `json:"op"`
	TsMs int64  `json:"ts_ms"`
}

// withSchema is the JsonConverter's schemas.enable=true wrapping.
type withSchema struct {
	Schema  *schema         `json:"schema"`
	Payload json.RawMessage `json:"payload"`
}

// schema is a Kafka Connect schema as the JsonConverter writes it.
type schema struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	Field      string            `json:"field"`
	Parameters map[string]string `json:"parameters"`
	Fields     []schema          `json:"fields"`
}

// DecodeJSON turns one JsonConverter change-event value into a row. With a
// schema, column types follow it (io.debezium.data.Json is jsonb, bytes are
// bytea, io.debezium.time.MicroTimestamp is timestamp, ...); without one, the
// payload column is taken as jsonb when its text is JSON, integers as int8,
// booleans as bool and every other column as text.
func DecodeJSON(value []byte, payloadField string) (*route.Row, error) {
	if len(bytes.TrimSpace(value)) == 0 || bytes.Equal(bytes.TrimSpace(value), []byte("null")) {
		return nil, ErrTombstone
	}
	var types map[string]connectType
	var ws withSchema
	if err := json.Unmarshal(value, &ws); err == nil && ws.Schema != nil && len(ws.Payload) > 0 {
		types = columnTypes(ws.Schema)
		value = ws.Payload
	}
	var env envelope
	if err := json.Unmarshal(value, &env); err != nil {
		return nil, fmt.Errorf("not a Debezium change event: %w", err)
	}
	meta := eventMeta{op: env.Op, sourceTsMs: env.Source.TsMs, tsMs: env.TsMs, schema: env.Source.Schema, table: env.Source.Table}
	if env.Source.LSN != nil {
		meta.lsn, meta.hasLSN = *env.Source.LSN, true
	}
	row, err := meta.row()
	if err != nil {
		return nil, err
	}
	err = eachField(env.After, func(name string, raw json.RawMessage) error {
		var c route.Column
		var err error
		if t, ok := types[name]; ok {
			c, err = jsonColumn(name, t, raw)
		} else {
			c, err = untypedColumn(name, raw, payloadField)
		}
		if err != nil {
			return err
		}
		row.Columns = append(row.Columns, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return row, nil
}

// eachField calls fn for each member of a JSON object, in order; null or
// absent is no members.
func eachField(obj json.RawMessage, fn func(string, json.RawMessage) error) error {
	if len(obj) == 0 || string(obj) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("\"after\" is not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("\"after\": %w", err)
		}
		name, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("\"after\".%s: %w", name, err)
		}
		if err := fn(name, raw); err != nil {
			return err
		}
	}
	return nil
}

// untypedColumn is a column of an event without schema: strings are text
// (the payload jsonb when it is JSON), integers int8, booleans bool.
func untypedColumn(name string, raw json.RawMessage, payloadField string) (route.Column, error) {
	c := route.Column{Name: name, Type: route.OIDText}
	switch {
	case bytes.Equal(raw, []byte("null")):
		c.Null = true
	case len(raw) > 0 && raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return c, fmt.Errorf("column %q: %w", name, err)
		}
		c.Value = []byte(s)
		if name == payloadField && json.Valid(c.Value) {
			c.Type = route.OIDJSONB
		}
	default:
		// Numbers keep their JSON text, which is also PostgreSQL's text
		// form for int columns.
		c.Value = append([]byte(nil), raw...)
		if _, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			c.Type = route.OIDInt8
		} else if string(raw) == "true" || string(raw) == "false" {
			c.Type = route.OIDBool
			c.Value = []byte(string(raw[:1]))
		}
	}
	return c, nil
}

// columnTypes maps the "after" struct's fields to their Connect schemas.
func columnTypes(s *schema) map[string]connectType {
	out := map[string]connectType{}
	for _, f := range s.Fields {
		if f.Field != "after" {
			continue
		}
		for _, c := range f.Fields {
			out[c.Field] = connectType{Type: c.Type, Name: c.Name, Params: c.Parameters}
		}
	}
	return out
}

// eventMeta is what a row takes from the envelope, whatever its encoding.
type eventMeta struct {
	op               string
	lsn              uint64
	hasLSN           bool
	sourceTsMs, tsMs int64
	schema, table    string
}

func (m *eventMeta) row() (*route.Row, error) {
	row := &route.Row{}
	switch m.op {
	case "c":
		row.Op = route.OpInsert
	case "r":
		row.Op = route.OpRead
	case "u":
		row.Op = route.OpUpdate
	case "d":
		row.Op = route.OpDelete
	default:
		return nil, fmt.Errorf("change event has op %q; want c, r, u or d", m.op)
	}
	if m.hasLSN {
		row.Source.LSN = m.lsn
	}
	if m.sourceTsMs > 0 {
		row.Source.CommitTime = time.UnixMilli(m.sourceTsMs)
	}
	if m.tsMs > 0 {
		row.Source.ProcessedTime = time.UnixMilli(m.tsMs)
	}
	if m.table != "" {
		row.Source.Table = m.schema + "." + m.table
	}
	return row, nil
}
