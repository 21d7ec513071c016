package cdc

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"testing"

	"github.com/linkedin/goavro/v2"
)

// This file writes change events for tests the way Debezium 3.x's PostgreSQL
// connector and Kafka Connect's converters write them, from one description
// of a table in Kafka Connect terms:
//
//   - The envelope (before, after, source, transaction, op, ts_ms, ts_us,
//     ts_ns; schema "<prefix>.<schema>.<table>.Envelope", version 2) and the
//     source block (io.debezium.connector.postgresql.Source) follow
//     debezium-core io/debezium/data/Envelope.java,
//     io/debezium/connector/AbstractSourceInfoStructMaker.java and
//     debezium-connector-postgres PostgresSourceInfoStructMaker.java, and a
//     Debezium 3.0.1 event printed by the JsonConverter (schemas enabled).
//   - Column types follow Debezium's PostgreSQL data type mappings
//     (uuid -> string io.debezium.data.Uuid, jsonb -> string
//     io.debezium.data.Json, timestamptz -> string
//     io.debezium.time.ZonedTimestamp, timestamp -> int64
//     io.debezium.time.MicroTimestamp, date -> int32 io.debezium.time.Date,
//     numeric(p,s) -> bytes org.apache.kafka.connect.data.Decimal with
//     scale and connect.decimal.precision, bytea -> bytes, int2 -> int16).
//   - The JSON is Kafka Connect's JsonConverter (schemas.enable=true):
//     {"schema":..., "payload":...}, bytes and Decimal as base64.
//   - The Avro schema is what Confluent's AvroConverter registers, by the
//     rules of io/confluent/connect/avro/AvroData.java fromConnectSchema
//     (confluentinc/schema-registry, avro-converter): a struct is a record
//     named by the Connect name (namespace = the part before the last dot)
//     with "connect.name"; an optional schema is the union ["null", T] with
//     "default": null (or [T, "null"] when it has a default); a second use of
//     a non-optional schema (the Value record in "after") is a reference by
//     name; INT16 is an int with "connect.type": "int16"; a Connect
//     version, parameters and name become "connect.version",
//     "connect.parameters" and "connect.name"; Decimal is bytes with
//     "logicalType": "decimal", "scale" and "precision" (38 unless
//     connect.decimal.precision says). testdata/outbox.avsc is the same
//     schema for the project's outbox table written out by hand from those
//     rules; TestAvroSchemaLikeAvroConverter checks the two agree.
//   - The value is in the Confluent wire format: byte 0, the schema id as 4
//     bytes big-endian, the Avro binary datum (written here by goavro, an
//     encoder independent of the decoder under test).

// cfield is one column as Debezium's PostgreSQL connector describes it.
type cfield struct {
	name     string
	typ      string // Connect type
	logical  string // Connect schema name
	params   map[string]string
	optional bool
}

// ctable is a captured table.
type ctable struct {
	prefix, schema, table string
	fields                []cfield
}

func (t ctable) ns() string { return t.prefix + "." + t.schema + "." + t.table }

// The outbox table of sql/001_outbox.sql.
var outboxTable = ctable{prefix: "dbserver1", schema: "public", table: "outbox", fields: []cfield{
	{name: "id", typ: "string", logical: nameUUID},
	{name: "aggregatetype", typ: "string"},
	{name: "aggregateid", typ: "string"},
	{name: "type", typ: "string"},
	{name: "payload", typ: "string", logical: nameJSON, optional: true},
	{name: "created_at", typ: "string", logical: nameZonedTimestamp},
}}

// An outbox with a bytea payload and columns of many types, to place in
// headers and the envelope.
var typedTable = ctable{prefix: "dbserver1", schema: "app", table: "outbox_typed", fields: []cfield{
	{name: "id", typ: "string", logical: nameUUID},
	{name: "aggregatetype", typ: "string"},
	{name: "aggregateid", typ: "string"},
	{name: "type", typ: "string"},
	{name: "payload", typ: "bytes", optional: true},
	{name: "note", typ: "string", optional: true},
	{name: "occurred_at", typ: "int64", logical: nameMicroTimestamp},
	{name: "version", typ: "int32"},
	{name: "seq", typ: "int64", optional: true},
	{name: "priority", typ: "int16", optional: true},
	{name: "urgent", typ: "boolean", optional: true},
	{name: "amount", typ: "bytes", logical: nameDecimal, params: map[string]string{"scale": "2", "connect.decimal.precision": "10"}, optional: true},
	{name: "due", typ: "int32", logical: nameDate, optional: true},
	{name: "ratio", typ: "float64", optional: true},
	{name: "meta", typ: "string", logical: nameJSON, optional: true},
	{name: "created_at", typ: "string", logical: nameZonedTimestamp},
}}

// An outbox whose payload is text.
var textTable = ctable{prefix: "dbserver1", schema: "public", table: "outbox_text", fields: []cfield{
	{name: "id", typ: "string", logical: nameUUID},
	{name: "aggregatetype", typ: "string"},
	{name: "aggregateid", typ: "string"},
	{name: "type", typ: "string"},
	{name: "payload", typ: "string", optional: true},
}}

// cevent is one change event. Column values are nil, string, int64, bool,
// float64, []byte, or for a Decimal its text ("12.50").
type cevent struct {
	op            string
	after, before map[string]any
	lsn           int64
	sourceTsMs    int64
	tsMs          int64
	snapshot      string
}

func (e cevent) rowOf(after bool) map[string]any {
	if after {
		return e.after
	}
	return e.before
}

// --- JsonConverter, schemas enabled ---

func (f cfield) jsonSchema() map[string]any {
	s := map[string]any{"type": f.typ, "optional": f.optional, "field": f.name}
	if f.logical != "" {
		s["name"] = f.logical
		s["version"] = 1
	}
	if f.params != nil {
		s["parameters"] = f.params
	}
	return s
}

func (t ctable) jsonValueSchema(field string) map[string]any {
	var fs []any
	for _, f := range t.fields {
		fs = append(fs, f.jsonSchema())
	}
	return map[string]any{"type": "struct", "fields": fs, "optional": true, "name": t.ns() + ".Value", "field": field}
}

func sourceJSONSchema() map[string]any {
	f := func(name, typ string, optional bool) map[string]any {
		return map[string]any{"type": typ, "optional": optional, "field": name}
	}
	snapshot := map[string]any{"type": "string", "optional": true, "name": "io.debezium.data.Enum", "version": 1,
		"parameters": map[string]string{"allowed": snapshotAllowed}, "default": "false", "field": "snapshot"}
	return map[string]any{"type": "struct", "fields": []any{
		f("version", "string", false), f("connector", "string", false), f("name", "string", false),
		f("ts_ms", "int64", false), snapshot, f("db", "string", false), f("sequence", "string", true),
		f("ts_us", "int64", true), f("ts_ns", "int64", true), f("schema", "string", false), f("table", "string", false),
		f("txId", "int64", true), f("lsn", "int64", true), f("xmin", "int64", true),
	}, "optional": false, "name": "io.debezium.connector.postgresql.Source", "field": "source"}
}

const snapshotAllowed = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"

func (t ctable) jsonEvent(tb testing.TB, e cevent) []byte {
	tb.Helper()
	opt := func(name, typ string) map[string]any {
		return map[string]any{"type": typ, "optional": true, "field": name}
	}
	block := map[string]any{"type": "struct", "fields": []any{
		map[string]any{"type": "string", "optional": false, "field": "id"},
		map[string]any{"type": "int64", "optional": false, "field": "total_order"},
		map[string]any{"type": "int64", "optional": false, "field": "data_collection_order"},
	}, "optional": true, "name": "event.block", "version": 1, "field": "transaction"}
	schema := map[string]any{"type": "struct", "fields": []any{
		t.jsonValueSchema("before"), t.jsonValueSchema("after"), sourceJSONSchema(), block,
		map[string]any{"type": "string", "optional": false, "field": "op"},
		opt("ts_ms", "int64"), opt("ts_us", "int64"), opt("ts_ns", "int64"),
	}, "optional": false, "name": t.ns() + ".Envelope", "version": 2}
	row := func(after bool) any {
		vals := e.rowOf(after)
		if vals == nil {
			return nil
		}
		out := map[string]any{}
		for _, f := range t.fields {
			out[f.name] = jsonValue(tb, f, vals[f.name])
		}
		return out
	}
	payload := map[string]any{
		"before": row(false), "after": row(true),
		"source":      e.source(t),
		"transaction": nil, "op": e.op, "ts_ms": e.tsMs, "ts_us": e.tsMs * 1000, "ts_ns": e.tsMs * 1000000,
	}
	b, err := json.Marshal(map[string]any{"schema": schema, "payload": payload})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func (e cevent) source(t ctable) map[string]any {
	snap := e.snapshot
	if snap == "" {
		snap = "false"
	}
	return map[string]any{
		"version": "3.6.1.Final", "connector": "postgresql", "name": t.prefix, "ts_ms": e.sourceTsMs,
		"snapshot": snap, "db": "app", "sequence": fmt.Sprintf(`[null,"%d"]`, e.lsn),
		"ts_us": e.sourceTsMs * 1000, "ts_ns": e.sourceTsMs * 1000000, "schema": t.schema, "table": t.table,
		"txId": int64(771), "lsn": e.lsn, "xmin": nil,
	}
}

func jsonValue(tb testing.TB, f cfield, v any) any {
	tb.Helper()
	if v == nil {
		return nil
	}
	switch {
	case f.logical == nameDecimal:
		return base64.StdEncoding.EncodeToString(decimalBytes(tb, f, v.(string)))
	case f.typ == "bytes":
		return base64.StdEncoding.EncodeToString(v.([]byte))
	}
	return v
}

// decimalBytes is Connect's Decimal encoding: the unscaled value,
// big-endian two's complement, in as few bytes as hold it.
func decimalBytes(tb testing.TB, f cfield, s string) []byte {
	tb.Helper()
	scale, _ := strconv.Atoi(f.params["scale"])
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		tb.Fatalf("decimal %q", s)
	}
	d, err := ratDecimal(r, scale)
	if err != nil {
		tb.Fatal(err)
	}
	n := d.unscaled
	if n.Sign() >= 0 {
		b := n.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// Two's complement of a negative number in k bytes.
	k := (n.BitLen() + 8) / 8
	m := new(big.Int).Add(n, new(big.Int).Lsh(big.NewInt(1), uint(k*8)))
	b := m.Bytes()
	for len(b) < k {
		b = append([]byte{0xff}, b...)
	}
	return b
}

// --- AvroConverter ---

// avroBase is AvroData's schema for a non-optional Connect schema.
func (f cfield) avroBase() any {
	var prim string
	props := map[string]any{}
	switch f.typ {
	case "int16", "int8":
		prim = "int"
		props["connect.type"] = f.typ
	case "int32":
		prim = "int"
	case "int64":
		prim = "long"
	case "float32":
		prim = "float"
	case "float64":
		prim = "double"
	default:
		prim = f.typ // string, boolean, bytes
	}
	if f.logical == nameDecimal {
		scale, _ := strconv.Atoi(f.params["scale"])
		props["scale"] = scale
		precision := 38
		if p, ok := f.params["connect.decimal.precision"]; ok {
			precision, _ = strconv.Atoi(p)
		}
		props["precision"] = precision
		props["logicalType"] = "decimal"
	}
	if f.logical != "" {
		props["connect.version"] = 1
		props["connect.name"] = f.logical
	}
	if f.params != nil {
		props["connect.parameters"] = f.params
	}
	if len(props) == 0 {
		return prim
	}
	props["type"] = prim
	return props
}

func (t ctable) avroSchemaJSON() map[string]any {
	var fields []any
	for _, f := range t.fields {
		fd := map[string]any{"name": f.name, "type": f.avroBase()}
		if f.optional {
			fd["type"] = []any{"null", f.avroBase()}
			fd["default"] = nil
		}
		fields = append(fields, fd)
	}
	value := map[string]any{"type": "record", "name": "Value", "fields": fields, "connect.name": t.ns() + ".Value"}
	optLong := func(name string) map[string]any {
		return map[string]any{"name": name, "type": []any{"null", "long"}, "default": nil}
	}
	str := func(name string) map[string]any { return map[string]any{"name": name, "type": "string"} }
	source := map[string]any{"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": []any{
		str("version"), str("connector"), str("name"),
		map[string]any{"name": "ts_ms", "type": "long"},
		map[string]any{"name": "snapshot", "type": []any{map[string]any{"type": "string", "connect.version": 1,
			"connect.parameters": map[string]any{"allowed": snapshotAllowed}, "connect.default": "false",
			"connect.name": "io.debezium.data.Enum"}, "null"}, "default": "false"},
		str("db"),
		map[string]any{"name": "sequence", "type": []any{"null", "string"}, "default": nil},
		optLong("ts_us"), optLong("ts_ns"), str("schema"), str("table"), optLong("txId"), optLong("lsn"), optLong("xmin"),
	}, "connect.name": "io.debezium.connector.postgresql.Source"}
	block := map[string]any{"type": "record", "name": "block", "namespace": "event", "fields": []any{
		str("id"), map[string]any{"name": "total_order", "type": "long"}, map[string]any{"name": "data_collection_order", "type": "long"},
	}, "connect.version": 1, "connect.name": "event.block"}
	return map[string]any{
		"type": "record", "name": "Envelope", "namespace": t.ns(),
		"fields": []any{
			map[string]any{"name": "before", "type": []any{"null", value}, "default": nil},
			map[string]any{"name": "after", "type": []any{"null", "Value"}, "default": nil},
			map[string]any{"name": "source", "type": source},
			map[string]any{"name": "transaction", "type": []any{"null", block}, "default": nil},
			str("op"),
			optLong("ts_ms"), optLong("ts_us"), optLong("ts_ns"),
		},
		"connect.version": 2, "connect.name": t.ns() + ".Envelope",
	}
}

func (t ctable) avroSchema(tb testing.TB) string {
	tb.Helper()
	b, err := json.Marshal(t.avroSchemaJSON())
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// avroEvent encodes e in the Confluent wire format with schema id.
func (t ctable) avroEvent(tb testing.TB, id int, e cevent) []byte {
	tb.Helper()
	codec, err := goavro.NewCodec(t.avroSchema(tb))
	if err != nil {
		tb.Fatalf("goavro rejects the schema: %v", err)
	}
	row := func(after bool) any {
		vals := e.rowOf(after)
		if vals == nil {
			return nil
		}
		out := map[string]any{}
		for _, f := range t.fields {
			out[f.name] = avroNative(tb, f, vals[f.name])
		}
		return goavro.Union(t.ns()+".Value", out)
	}
	src := e.source(t)
	native := map[string]any{}
	for k, v := range src {
		native[k] = v
	}
	native["snapshot"] = goavro.Union("string", src["snapshot"])
	native["sequence"] = goavro.Union("string", src["sequence"])
	for _, k := range []string{"ts_us", "ts_ns", "txId", "lsn"} {
		native[k] = goavro.Union("long", src[k])
	}
	datum := map[string]any{
		"before": row(false), "after": row(true), "source": native, "transaction": nil, "op": e.op,
		"ts_ms": goavro.Union("long", e.tsMs), "ts_us": goavro.Union("long", e.tsMs*1000), "ts_ns": goavro.Union("long", e.tsMs*1000000),
	}
	buf := binary.BigEndian.AppendUint32([]byte{0}, uint32(id))
	out, err := codec.BinaryFromNative(buf, datum)
	if err != nil {
		tb.Fatalf("goavro cannot encode the event: %v", err)
	}
	return out
}

func avroNative(tb testing.TB, f cfield, v any) any {
	tb.Helper()
	if v == nil {
		return nil
	}
	branch := ""
	switch f.typ {
	case "int16", "int32", "int8":
		v = int32(v.(int64))
		branch = "int"
	case "int64":
		branch = "long"
	case "float64":
		branch = "double"
	default:
		branch = f.typ
	}
	if f.logical == nameDecimal {
		r, _ := new(big.Rat).SetString(v.(string))
		v, branch = r, "bytes.decimal"
	}
	if f.optional {
		return goavro.Union(branch, v)
	}
	return v
}
