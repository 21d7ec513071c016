package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/pgoutbox/pgoutbox/route"
)

// fakeRegistry is franz-go's in-memory Confluent-API registry, with a client.
type fakeRegistry struct {
	srv *srfake.Registry
	cl  *sr.Client
}

func newFakeRegistry(t testing.TB) *fakeRegistry {
	t.Helper()
	srv := srfake.New()
	t.Cleanup(srv.Close)
	cl, err := sr.NewClient(sr.URLs(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return &fakeRegistry{srv: srv, cl: cl}
}

func (f *fakeRegistry) register(t testing.TB, subject, schema string) int {
	t.Helper()
	id, _, err := f.srv.RegisterSchema(subject, sr.Schema{Schema: schema, Type: sr.TypeAvro})
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return id
}

// countingRegistry counts schema look-ups.
type countingRegistry struct {
	Registry
	n atomic.Int32
}

func (c *countingRegistry) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	c.n.Add(1)
	return c.Registry.SchemaByID(ctx, id)
}

const (
	commitMs  = int64(1764496800000) // 2025-11-30 10:00:00 UTC
	processMs = int64(1764496800250)
)

func outboxInsert(id, aggType, aggID, payload string) cevent {
	after := map[string]any{
		"id": id, "aggregatetype": aggType, "aggregateid": aggID, "type": "Created",
		"payload": nil, "created_at": "2025-11-30T09:59:59.987654Z",
	}
	if payload != "" {
		after["payload"] = payload
	}
	return cevent{op: "c", after: after, lsn: 24023128, sourceTsMs: commitMs, tsMs: processMs}
}

func typedInsert() cevent {
	return cevent{op: "c", lsn: 24023500, sourceTsMs: commitMs, tsMs: processMs, after: map[string]any{
		"id": "5a1f0d3e-8c4b-4f7e-9a59-6d0e1c2b3a41", "aggregatetype": "Invoice", "aggregateid": "inv-7", "type": "Issued",
		"payload": []byte{0x00, 0x01, 0x7b, 0xff, '"', '\\'}, "note": "a \"quoted\" note",
		"occurred_at": int64(1764496799123456), "version": int64(3), "seq": nil, "priority": int64(-5),
		"urgent": true, "amount": "-12.50", "due": int64(20422), "ratio": 0.25,
		"meta": `{"tags": ["a", "b"], "n": 1.5}`, "created_at": "2025-11-30T10:00:00.000000Z",
	}}
}

// TestAvroSchemaLikeAvroConverter checks the test's schema writer against
// the outbox envelope schema written out by hand (testdata/outbox.avsc), and
// that goavro and the decoder both accept it.
func TestAvroSchemaLikeAvroConverter(t *testing.T) {
	raw, err := os.ReadFile("testdata/outbox.avsc")
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(outboxTable.avroSchema(t)), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("generated schema differs from testdata/outbox.avsc:\n%s", outboxTable.avroSchema(t))
	}
	if _, err := goavro.NewCodec(string(raw)); err != nil {
		t.Fatalf("goavro: %v", err)
	}
	for _, tbl := range []ctable{outboxTable, typedTable, textTable} {
		if _, err := envelopeType(sr.Schema{Schema: tbl.avroSchema(t)}); err != nil {
			t.Errorf("%s: %v", tbl.table, err)
		}
	}
}

type wantCol struct {
	name string
	oid  uint32
	val  *string // nil: SQL NULL
}

func str(s string) *string { return &s }

func TestAvroDecode(t *testing.T) {
	reg := newFakeRegistry(t)
	dec := NewAvroDecoder(reg.cl)
	ids := map[string]int{}
	for _, tbl := range []ctable{outboxTable, typedTable, textTable} {
		ids[tbl.table] = reg.register(t, tbl.ns()+"-value", tbl.avroSchema(t))
	}
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	outboxCols := func(payload *string) []wantCol {
		return []wantCol{
			{"id", route.OIDUUID, str("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10")},
			{"aggregatetype", route.OIDText, str("Order")},
			{"aggregateid", route.OIDText, str("42")},
			{"type", route.OIDText, str("Created")},
			{"payload", route.OIDJSONB, payload},
			{"created_at", route.OIDTimestamptz, str("2025-11-30 09:59:59.987654+00")},
		}
	}
	ins := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"n": 1, "s": "é"}`)
	del := ins
	del.op, del.before, del.after = "d", ins.after, nil
	read := ins
	read.op, read.snapshot = "r", "true"
	nullPayload := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", "")
	textEv := cevent{op: "c", lsn: 7, sourceTsMs: commitMs, tsMs: processMs, after: map[string]any{
		"id": "9d4c2a1b-6e3f-4a8b-b7c6-5d4e3f2a1b0c", "aggregatetype": "Note", "aggregateid": "n1", "type": "Said", "payload": "hello, \"world\"\n"}}

	for _, tc := range []struct {
		name      string
		tbl       ctable
		ev        cevent
		op        route.Op
		cols      []wantCol
		wantValue *string // the routed record's value; nil: skipped
	}{
		{name: "jsonb payload", tbl: outboxTable, ev: ins, op: route.OpInsert,
			cols: outboxCols(str(`{"n": 1, "s": "é"}`)), wantValue: str(`{"n": 1, "s": "é"}`)},
		{name: "snapshot read", tbl: outboxTable, ev: read, op: route.OpRead,
			cols: outboxCols(str(`{"n": 1, "s": "é"}`)), wantValue: str(`{"n": 1, "s": "é"}`)},
		{name: "null jsonb payload", tbl: outboxTable, ev: nullPayload, op: route.OpInsert,
			cols: outboxCols(nil), wantValue: nil},
		{name: "delete is skipped", tbl: outboxTable, ev: del, op: route.OpDelete},
		{name: "bytea payload and typed columns", tbl: typedTable, ev: typedInsert(), op: route.OpInsert,
			cols: []wantCol{
				{"id", route.OIDUUID, str("5a1f0d3e-8c4b-4f7e-9a59-6d0e1c2b3a41")},
				{"aggregatetype", route.OIDText, str("Invoice")},
				{"aggregateid", route.OIDText, str("inv-7")},
				{"type", route.OIDText, str("Issued")},
				{"payload", route.OIDBytea, str(`\x00017bff225c`)},
				{"note", route.OIDText, str(`a "quoted" note`)},
				{"occurred_at", route.OIDTimestamp, str("2025-11-30 09:59:59.123456")},
				{"version", route.OIDInt4, str("3")},
				{"seq", route.OIDInt8, nil},
				{"priority", route.OIDInt2, str("-5")},
				{"urgent", route.OIDBool, str("t")},
				{"amount", route.OIDNumeric, str("-12.50")},
				{"due", route.OIDDate, str("2025-11-30")},
				{"ratio", route.OIDFloat8, str("0.25")},
				{"meta", route.OIDJSONB, str(`{"tags": ["a", "b"], "n": 1.5}`)},
				{"created_at", route.OIDTimestamptz, str("2025-11-30 10:00:00+00")},
			},
			wantValue: str("\x00\x01\x7b\xff\"\\")},
		{name: "text payload", tbl: textTable, ev: textEv, op: route.OpInsert,
			cols: []wantCol{
				{"id", route.OIDUUID, str("9d4c2a1b-6e3f-4a8b-b7c6-5d4e3f2a1b0c")},
				{"aggregatetype", route.OIDText, str("Note")},
				{"aggregateid", route.OIDText, str("n1")},
				{"type", route.OIDText, str("Said")},
				{"payload", route.OIDText, str("hello, \"world\"\n")},
			},
			wantValue: str("hello, \"world\"\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			row, err := dec.Decode(ctx, tc.tbl.avroEvent(t, ids[tc.tbl.table], tc.ev))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if row.Op != tc.op {
				t.Errorf("op %v, want %v", row.Op, tc.op)
			}
			src := row.Source
			if src.LSN != uint64(tc.ev.lsn) || src.Table != tc.tbl.schema+"."+tc.tbl.table ||
				src.CommitTime.UnixMilli() != commitMs || src.ProcessedTime.UnixMilli() != processMs {
				t.Errorf("source %+v", src)
			}
			checkColumns(t, row.Columns, tc.cols)
			rec, err := router.Route(ctx, row)
			switch {
			case tc.op == route.OpDelete:
				if !errors.Is(err, route.ErrSkip) {
					t.Fatalf("routing a delete: %v, %v; want it skipped", rec, err)
				}
			case err != nil:
				t.Fatalf("Route: %v", err)
			case tc.wantValue == nil && rec.Value != nil:
				t.Errorf("value %q, want null", rec.Value)
			case tc.wantValue != nil && string(rec.Value) != *tc.wantValue:
				t.Errorf("value %q, want %q", rec.Value, *tc.wantValue)
			}
		})
	}

	t.Run("tombstone", func(t *testing.T) {
		for _, v := range [][]byte{nil, {}} {
			if row, err := dec.Decode(context.Background(), v); !errors.Is(err, ErrTombstone) {
				t.Errorf("Decode(%q) = %v, %v; want ErrTombstone", v, row, err)
			}
		}
	})
}

func checkColumns(t *testing.T, got []route.Column, want []wantCol) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d columns %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.name || g.Type != w.oid {
			t.Errorf("column %d: %s type %d, want %s type %d", i, g.Name, g.Type, w.name, w.oid)
		}
		switch {
		case w.val == nil && !g.Null:
			t.Errorf("column %s: %q, want NULL", w.name, g.Value)
		case w.val != nil && (g.Null || string(g.Value) != *w.val):
			t.Errorf("column %s: %q (null %v), want %q", w.name, g.Value, g.Null, *w.val)
		}
	}
}

// deadRegistry is the URL of a port nothing listens on.
func deadRegistry(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	return url
}

func TestAvroDecodeErrors(t *testing.T) {
	reg := newFakeRegistry(t)
	id := reg.register(t, "outbox-value", outboxTable.avroSchema(t))
	flat, _ := json.Marshal(outboxTable.avroSchemaJSON()["fields"].([]any)[0].(map[string]any)["type"].([]any)[1])
	flatID := reg.register(t, "flattened-value", string(flat))
	jsonID, _, err := reg.srv.RegisterSchema("json-value", sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	good := outboxTable.avroEvent(t, id, outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{}`))
	withID := func(id int) []byte {
		b := append([]byte(nil), good...)
		b[1], b[2], b[3], b[4] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
		return b
	}

	client := func(url string) Registry {
		cl, err := sr.NewClient(sr.URLs(url), sr.HTTPClient(&http.Client{Timeout: 2 * time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	for _, tc := range []struct {
		name  string
		reg   Registry
		value []byte
		class route.ErrorClass
		msg   string
	}{
		{"unknown schema id", reg.cl, withID(999), route.ClassSchema, "schema id 999 is not in the schema registry"},
		{"registry unreachable", client(deadRegistry(t)), good, route.ClassRegistry, "fetch the schema of id"},
		{"registry URL without the API (404, no error code)", client(reg.srv.URL() + "/not/the/api"), good, route.ClassRegistry, "fetch the schema of id"},
		{"JSON, not the wire format", reg.cl, []byte(`{"op":"c"}`), route.ClassInvalidPayload, "first byte is 0x7b"},
		{"header cut short", reg.cl, []byte{0, 0, 0}, route.ClassInvalidPayload, "shorter than the 5-byte header"},
		{"datum cut short", reg.cl, good[:len(good)-3], route.ClassInvalidPayload, "does not decode"},
		{"bytes after the datum", reg.cl, append(append([]byte(nil), good...), 0, 0), route.ClassInvalidPayload, "2 bytes after the datum"},
		{"flattened (ExtractNewRecordState) schema", reg.cl, withID(flatID), route.ClassSchema, "not a Debezium change-event envelope"},
		{"JSON Schema id", reg.cl, withID(jsonID), route.ClassSchema, "it is a JSON schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row, err := NewAvroDecoder(tc.reg).Decode(context.Background(), tc.value)
			if row != nil || route.ClassOf(err) != tc.class {
				t.Fatalf("Decode = %v, %v; want error class %s", row, err, tc.class)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if route.IsRetryable(err) != (tc.class == route.ClassRegistry) {
				t.Errorf("IsRetryable(%v) = %v", err, route.IsRetryable(err))
			}
		})
	}
}

// TestAvroSchemaCache: one registry request per schema id; an unknown id
// is asked again only after a minute; a failed request is not remembered.
func TestAvroSchemaCache(t *testing.T) {
	reg := newFakeRegistry(t)
	id := reg.register(t, "outbox-value", outboxTable.avroSchema(t))
	counting := &countingRegistry{Registry: reg.cl}
	dec := NewAvroDecoder(counting)
	now := time.Unix(1e9, 0)
	dec.now = func() time.Time { return now }
	ctx := context.Background()
	ev := outboxTable.avroEvent(t, id, outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{}`))
	for i := 0; i < 3; i++ {
		if _, err := dec.Decode(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := counting.n.Load(); n != 1 {
		t.Fatalf("%d registry requests for one schema id, want 1", n)
	}
	unknown := append([]byte{0, 0, 0, 0x30, 0x39}, ev[5:]...) // id 12345
	for i := 0; i < 3; i++ {
		if _, err := dec.Decode(ctx, unknown); route.ClassOf(err) != route.ClassSchema {
			t.Fatal(err)
		}
	}
	if n := counting.n.Load(); n != 2 {
		t.Fatalf("%d registry requests, want 2 (the unknown id asked once)", n)
	}
	now = now.Add(unknownIDTTL + time.Second)
	if _, err := dec.Decode(ctx, unknown); route.ClassOf(err) != route.ClassSchema {
		t.Fatal(err)
	}
	if n := counting.n.Load(); n != 3 {
		t.Fatalf("%d registry requests, want 3 (the unknown id asked again after %s)", n, unknownIDTTL)
	}

	// A registry that fails, then answers.
	down := &countingRegistry{Registry: failingRegistry{}}
	dec = NewAvroDecoder(down)
	for i := 0; i < 2; i++ {
		if _, err := dec.Decode(ctx, ev); !route.IsRetryable(err) {
			t.Fatalf("Decode with the registry down: %v; want a retryable error", err)
		}
	}
	if n := down.n.Load(); n != 2 {
		t.Fatalf("%d registry requests, want 2: a failure must not be remembered", n)
	}
	down.Registry = reg.cl
	if _, err := dec.Decode(ctx, ev); err != nil {
		t.Fatalf("Decode once the registry answers: %v", err)
	}
}

type failingRegistry struct{}

func (failingRegistry) SchemaByID(context.Context, int) (sr.Schema, error) {
	return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusServiceUnavailable, Message: "registry starting"}
}

// TestDecoderFormat: which decoder a value goes to under each input format.
func TestDecoderFormat(t *testing.T) {
	reg := newFakeRegistry(t)
	id := reg.register(t, "outbox-value", outboxTable.avroSchema(t))
	ev := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"a": 1}`)
	avro := outboxTable.avroEvent(t, id, ev)
	js := outboxTable.jsonEvent(t, ev)
	avroDec := NewAvroDecoder(reg.cl)
	ctx := context.Background()
	for _, tc := range []struct {
		format  Format
		avro    *AvroDecoder
		value   []byte
		wantErr func(error) bool
	}{
		{FormatAuto, avroDec, avro, nil},
		{FormatAuto, avroDec, js, nil},
		{FormatAuto, nil, js, nil},
		{FormatAuto, nil, avro, func(err error) bool { return errors.Is(err, ErrNoRegistry) }},
		{FormatAvro, avroDec, avro, nil},
		{FormatAvro, avroDec, js, func(err error) bool { return route.ClassOf(err) == route.ClassInvalidPayload }},
		{FormatJSON, avroDec, js, nil},
		{FormatJSON, avroDec, avro, func(err error) bool { return err != nil && route.ClassOf(err) == "" }},
		{FormatJSON, nil, nil, func(err error) bool { return errors.Is(err, ErrTombstone) }},
		{FormatAvro, avroDec, nil, func(err error) bool { return errors.Is(err, ErrTombstone) }},
	} {
		d := &Decoder{Format: tc.format, PayloadField: "payload", Avro: tc.avro}
		row, err := d.Decode(ctx, tc.value)
		name := string(tc.format) + "/registry=" + strconv.FormatBool(tc.avro != nil) + "/" + string(tc.value[:min(len(tc.value), 1)])
		switch {
		case tc.wantErr == nil && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.wantErr == nil && (row.Lookup("payload") == nil || string(row.Lookup("payload").Value) != `{"a": 1}`):
			t.Errorf("%s: row %+v", name, row)
		case tc.wantErr != nil && !tc.wantErr(err):
			t.Errorf("%s: error %v", name, err)
		}
	}
	for _, s := range []string{"auto", "json", "avro"} {
		if f, err := ParseFormat(s); err != nil || string(f) != s {
			t.Errorf("ParseFormat(%q) = %q, %v", s, f, err)
		}
	}
	if _, err := ParseFormat("protobuf"); err == nil {
		t.Error("ParseFormat(protobuf) succeeded")
	}
}

// BenchmarkAvroDecode decodes an outbox insert (the schema cached).
func BenchmarkAvroDecode(b *testing.B) {
	reg := mapRegistry{1: outboxTable.avroSchema(b)}
	dec := NewAvroDecoder(reg)
	ev := outboxTable.avroEvent(b, 1, outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"id": 42, "lines": [{"sku": "A-1", "qty": 2}]}`))
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if _, err := dec.Decode(ctx, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeJSON decodes the same insert written by the JsonConverter
// with schemas, for comparison.
func BenchmarkDecodeJSON(b *testing.B) {
	ev := outboxTable.jsonEvent(b, outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"id": 42, "lines": [{"sku": "A-1", "qty": 2}]}`))
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		if _, err := DecodeJSON(ev, "payload"); err != nil {
			b.Fatal(err)
		}
	}
}
