// Package cdc decodes Debezium PostgreSQL change events (JSON, with or
// without schemas) into route.Rows, so that teams already running Debezium
// can route an existing change-event topic with the same router the
// connector uses.
package cdc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

// ErrTombstone is a record with a null value (Debezium's tombstone after a
// delete): nothing to route.
var ErrTombstone = errors.New("tombstone")

// envelope is a Debezium change event's value, schemas disabled.
type envelope struct {
	Before json.RawMessage            `json:"before"`
	After  map[string]json.RawMessage `json:"after"`
	Source struct {
		LSN   *uint64 `json:"lsn"`
		TsMs  int64   `json:"ts_ms"`
		Table string  `json:"table"`
		Schema string `json:"schema"`
	} `json:"source"`
	Op   string `json:"op"`
	TsMs int64  `json:"ts_ms"`
}

// withSchema is the JsonConverter's schemas.enable=true wrapping.
type withSchema struct {
	Schema  *schema         `json:"schema"`
	Payload json.RawMessage `json:"payload"`
}

type schema struct {
	Type   string   `json:"type"`
	Name   string   `json:"name"`
	Field  string   `json:"field"`
	Fields []schema `json:"fields"`
}

// Decode turns one change-event value into a row. Column types follow the
// schema when the event carries one (io.debezium.data.Json is jsonb,
// io.debezium.data.Uuid is uuid); without a schema, the payload column is
// taken as jsonb when its text is JSON, every other column as text.
func Decode(value []byte, payloadField string) (*route.Row, error) {
	if len(bytes.TrimSpace(value)) == 0 || bytes.Equal(bytes.TrimSpace(value), []byte("null")) {
		return nil, ErrTombstone
	}
	var types map[string]uint32
	var ws withSchema
	if err := json.Unmarshal(value, &ws); err == nil && ws.Schema != nil && len(ws.Payload) > 0 {
		types = columnTypes(ws.Schema)
		value = ws.Payload
	}
	var env envelope
	if err := json.Unmarshal(value, &env); err != nil {
		return nil, fmt.Errorf("not a Debezium change event: %w", err)
	}
	row := &route.Row{}
	switch env.Op {
	case "c":
		row.Op = route.OpInsert
	case "r":
		row.Op = route.OpRead
	case "u":
		row.Op = route.OpUpdate
	case "d":
		row.Op = route.OpDelete
	default:
		return nil, fmt.Errorf("change event has op %q; want c, r, u or d", env.Op)
	}
	if env.Source.LSN != nil {
		row.Source.LSN = *env.Source.LSN
	}
	if env.Source.TsMs > 0 {
		row.Source.CommitTime = time.UnixMilli(env.Source.TsMs)
	}
	if env.TsMs > 0 {
		row.Source.ProcessedTime = time.UnixMilli(env.TsMs)
	}
	if env.Source.Table != "" {
		row.Source.Table = env.Source.Schema + "." + env.Source.Table
	}
	for name, raw := range env.After {
		c := route.Column{Name: name, Type: route.OIDText}
		if t, ok := types[name]; ok {
			c.Type = t
		}
		switch {
		case bytes.Equal(raw, []byte("null")):
			c.Null = true
		case len(raw) > 0 && raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("column %q: %w", name, err)
			}
			c.Value = []byte(s)
			if types == nil && name == payloadField && json.Valid(c.Value) {
				c.Type = route.OIDJSONB
			}
		default:
			// Numbers and booleans keep their JSON text, which is also
			// PostgreSQL's text form for int and bool columns.
			c.Value = append([]byte(nil), raw...)
			if types == nil {
				if _, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
					c.Type = route.OIDInt8
				} else if string(raw) == "true" || string(raw) == "false" {
					c.Type = route.OIDBool
					c.Value = []byte(string(raw[:1]))
				}
			}
		}
		row.Columns = append(row.Columns, c)
	}
	return row, nil
}

// columnTypes maps the "after" struct's fields to PostgreSQL type OIDs.
func columnTypes(s *schema) map[string]uint32 {
	out := map[string]uint32{}
	for _, f := range s.Fields {
		if f.Field != "after" {
			continue
		}
		for _, c := range f.Fields {
			out[c.Field] = oidFor(c)
		}
	}
	return out
}

func oidFor(c schema) uint32 {
	switch c.Name {
	case "io.debezium.data.Json":
		return route.OIDJSONB
	case "io.debezium.data.Uuid":
		return route.OIDUUID
	case "io.debezium.time.ZonedTimestamp":
		return route.OIDTimestamptz
	}
	switch c.Type {
	case "int64":
		return route.OIDInt8
	case "int32":
		return route.OIDInt4
	case "int16":
		return route.OIDInt2
	case "boolean":
		return route.OIDBool
	case "bytes":
		return route.OIDBytea
	}
	return route.OIDText
}
