package route

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

const orderSchema = `{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "int"},
    {"name": "lineItems", "type": {"type": "array", "items": {"type": "record", "name": "LineItem", "fields": [
      {"name": "id", "type": "int"}, {"name": "item", "type": "string"}, {"name": "status", "type": "string"},
      {"name": "quantity", "type": "int"}, {"name": "totalPrice", "type": "double"}]}}},
    {"name": "orderDate", "type": "string"},
    {"name": "customerId", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": null}
  ]}`

// confluentDecode is an independent Confluent wire-format decoder: magic
// byte 0, a big-endian schema id looked up in the registry, then the Avro
// binary datum decoded with the registry's schema by a plain goavro codec.
func confluentDecode(t testing.TB, cl *sr.Client, b []byte) (int, any) {
	t.Helper()
	if len(b) < 5 || b[0] != 0 {
		t.Fatalf("not Confluent wire format: % x", b[:min(len(b), 8)])
	}
	id := int(binary.BigEndian.Uint32(b[1:5]))
	s, err := cl.SchemaByID(context.Background(), id)
	if err != nil {
		t.Fatalf("schema id %d: %v", id, err)
	}
	codec, err := goavro.NewCodec(s.Schema)
	if err != nil {
		t.Fatal(err)
	}
	v, rest, err := codec.NativeFromBinary(b[5:])
	if err != nil || len(rest) != 0 {
		t.Fatalf("decode: %v (%d bytes left)", err, len(rest))
	}
	return id, v
}

func avroRouter(t testing.TB, reg *srfake.Registry, mod func(*Config)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ValueFormat = FormatAvro
	cfg.RegistryURLs = []string{reg.URL()}
	cfg.AvroSchemas = map[string]string{"outbox.event.Order-value": orderSchema}
	if mod != nil {
		mod(&cfg)
	}
	r, err := NewContext(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func orderRow(payload string) *Row {
	return &Row{Columns: []Column{
		{Name: "id", Type: OIDUUID, Value: []byte("4d47e190-0402-4048-bc2c-89dd54343cdc")},
		{Name: "aggregatetype", Type: OIDVarchar, Value: []byte("Order")},
		{Name: "aggregateid", Type: OIDVarchar, Value: []byte("1")},
		{Name: "type", Type: OIDVarchar, Value: []byte("OrderCreated")},
		{Name: "payload", Type: OIDJSONB, Value: []byte(payload)},
	}, Source: Source{Table: "public.outbox", ProcessedTime: time.UnixMilli(1556890294484)}}
}

const orderPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}], "orderDate": "2019-01-31T12:13:01", "customerId": 123, "note": "gift"}`

func TestAvroRegisteredSchema(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	r := avroRouter(t, reg, nil)
	rec, err := r.Route(context.Background(), orderRow(orderPayload))
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	ss, err := cl.SchemaByVersion(context.Background(), "outbox.event.Order-value", -1)
	if err != nil {
		t.Fatalf("the schema was not registered under the topic's subject: %v", err)
	}
	id, v := confluentDecode(t, cl, rec.Value)
	if id != ss.ID {
		t.Fatalf("id %d, registered %d", id, ss.ID)
	}
	want := map[string]any{
		"id": int32(1), "orderDate": "2019-01-31T12:13:01", "customerId": int64(123),
		"note":      map[string]any{"string": "gift"},
		"lineItems": []any{map[string]any{"id": int32(1), "item": "Debezium in Action", "status": "ENTERED", "quantity": int32(2), "totalPrice": 39.98}},
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("decoded %#v\nwant %#v", v, want)
	}
	if string(rec.Key) != "1" || rec.Topic != "outbox.event.Order" || string(rec.Headers[0].Value) != "4d47e190-0402-4048-bc2c-89dd54343cdc" {
		t.Fatalf("record %+v", rec)
	}
}

func TestAvroLooksUpLatestSchema(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	id, _, err := reg.RegisterSchema("outbox.event.Customer-value", sr.Schema{Schema: `{"type":"record","name":"C","fields":[{"name":"name","type":"string"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	r := avroRouter(t, reg, func(c *Config) { c.AvroUseLatestVersion, c.AvroAutoRegister = true, false })
	row := orderRow(`{"name": "Jane"}`)
	row.Columns[1].Value = []byte("Customer")
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	gotID, v := confluentDecode(t, cl, rec.Value)
	if gotID != id || !reflect.DeepEqual(v, map[string]any{"name": "Jane"}) {
		t.Fatalf("id %d (want %d), %v", gotID, id, v)
	}
}

func TestAvroErrors(t *testing.T) {
	reg := srfake.New()
	r := avroRouter(t, reg, func(c *Config) { c.AvroUseLatestVersion, c.AvroAutoRegister = true, false })
	ctx := context.Background()

	// A payload that does not conform: ClassSchema carrying goavro's error.
	_, err := r.Route(ctx, orderRow(`{"id": "one"}`))
	var re *Error
	if !errors.As(err, &re) || re.Class != ClassSchema || re.Err == nil {
		t.Fatalf("non-conforming payload: %v", err)
	}
	// No schema under the subject, with use.latest.version: the row
	// waits for one, retried, never a dead letter.
	row := orderRow(`{}`)
	row.Columns[1].Value = []byte("Unknown")
	if _, err := r.Route(ctx, row); ClassOf(err) != ClassSchemaRejected || !IsRetryable(err) {
		t.Fatalf("unknown subject: %v", err)
	}
	// The registry is down: retryable, not poison.
	reg.Close()
	row.Columns[1].Value = []byte("Other")
	if _, err := r.Route(ctx, row); ClassOf(err) != ClassRegistry || !IsRetryable(err) {
		t.Fatalf("registry down: %v", err)
	}
	// A cached subject still routes.
	if _, err := r.Route(ctx, orderRow(orderPayload)); err != nil {
		t.Fatalf("cached schema: %v", err)
	}
}

func TestAvroEnvelopeNullAndBytea(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	env := fmt.Sprintf(`{"type":"record","name":"Env","fields":[{"name":"payload","type":["null",%s]},{"name":"eventType","type":"string"}]}`, orderSchema)
	r := avroRouter(t, reg, func(c *Config) {
		c.AvroSchemas = map[string]string{"outbox.event.Order-value": env}
		c.AdditionalFields = []AdditionalField{{Column: "type", Placement: PlaceEnvelope, Alias: "eventType"}}
	})
	ctx := context.Background()
	rec, err := r.Route(ctx, orderRow(orderPayload))
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	_, v := confluentDecode(t, cl, rec.Value)
	m := v.(map[string]any)
	if m["eventType"] != "OrderCreated" || m["payload"].(map[string]any)["shop.Order"].(map[string]any)["customerId"] != int64(123) {
		t.Fatalf("envelope %v", v)
	}

	// Without an envelope, a null payload is a null value (the Confluent
	// serializer's null), and a bytea payload is already-framed Avro.
	plain := avroRouter(t, reg, nil)
	row := orderRow("")
	row.Columns[4].Null = true
	if rec, err := plain.Route(ctx, row); err != nil || rec.Value != nil {
		t.Fatalf("null payload: %v %v", rec, err)
	}
	row.Columns[4] = Column{Name: "payload", Type: OIDBytea, Value: []byte(`\x0000000001ff`)}
	if rec, err := plain.Route(ctx, row); err != nil || string(rec.Value) != "\x00\x00\x00\x00\x01\xff" {
		t.Fatalf("bytea payload: %v %v", rec, err)
	}
}

// TestAvroEnvelopeNumeric: numeric envelope fields go to Avro as Confluent's
// AvroConverter writes Debezium's schemas: an unconstrained numeric as the
// VariableScaleDecimal record, a numeric(p,s) as Avro's decimal; a numeric
// of unknown declaration stays a number (a double field).
func TestAvroEnvelopeNumeric(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	const env = `{"type":"record","name":"Env","fields":[{"name":"payload","type":["null","string"]},
		{"name":"amount","type":["null",{"type":"record","name":"VariableScaleDecimal","namespace":"io.debezium.data",
			"fields":[{"name":"scale","type":"int"},{"name":"value","type":"bytes"}],
			"connect.doc":"Variable scaled decimal","connect.version":1,"connect.name":"io.debezium.data.VariableScaleDecimal"}],"default":null},
		{"name":"price","type":["null",{"type":"bytes","scale":2,"precision":10,"connect.version":1,
			"connect.parameters":{"scale":"2","connect.decimal.precision":"10"},"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
		{"name":"ratio","type":["null","double"],"default":null}]}`
	r := avroRouter(t, reg, func(c *Config) {
		c.AvroSchemas = map[string]string{"outbox.event.Order-value": env}
		c.AdditionalFields = []AdditionalField{{Column: "amount", Placement: PlaceEnvelope, Alias: "amount"},
			{Column: "price", Placement: PlaceEnvelope, Alias: "price"}, {Column: "ratio", Placement: PlaceEnvelope, Alias: "ratio"}}
	})
	row := orderRow(`"text"`)
	row.Columns[4].Type = OIDText
	row.Columns = append(row.Columns,
		Column{Name: "amount", Type: OIDNumeric, Value: []byte("-12.500"), TypeMod: NoTypeMod, HasTypeMod: true},
		Column{Name: "price", Type: OIDNumeric, Value: []byte("-1.28"), TypeMod: NumericTypeMod(10, 2), HasTypeMod: true},
		Column{Name: "ratio", Type: OIDNumeric, Value: []byte("0.25")})
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	_, v := confluentDecode(t, cl, rec.Value)
	m := v.(map[string]any)
	amount := m["amount"].(map[string]any)["io.debezium.data.VariableScaleDecimal"].(map[string]any)
	if amount["scale"] != int32(1) || !reflect.DeepEqual(amount["value"], []byte{0x83}) { // -125: -12.5, trailing zeros stripped
		t.Errorf("amount %#v", amount)
	}
	if price := m["price"].(map[string]any)["bytes.decimal"].(*big.Rat); price.RatString() != "-32/25" {
		t.Errorf("price %v, want -1.28", price)
	}
	if ratio := m["ratio"].(map[string]any)["double"]; ratio != 0.25 {
		t.Errorf("ratio %#v", ratio)
	}
}

// TestAvroDebeziumSchemas: subjects as Confluent's AvroConverter registers
// them for Debezium's outbox: the JSON payload as io.debezium.data.Json (a
// string with attributes, which goavro's canonical form writes as
// {"type":"string"}; every event was a dead letter before), optional or
// not; and a union of a long and a double, which read 7 as 7.0 and
// 9007199254740993 as 9007199254740992.0 before, and now takes the long or
// refuses a value no branch holds exactly.
func TestAvroDebeziumSchemas(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	const jsonString = `{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}`
	r := avroRouter(t, reg, func(c *Config) {
		c.AvroSchemas = map[string]string{
			"outbox.event.Order-value":    jsonString,
			"outbox.event.Optional-value": `["null",` + jsonString + `]`,
			"outbox.event.Number-value":   `{"type":"record","name":"N","fields":[{"name":"n","type":["null","long","double"]}]}`,
		}
	})
	ctx := context.Background()
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	route := func(aggType, payload string) (any, error) {
		row := orderRow(payload)
		row.Columns[1].Value = []byte(aggType)
		rec, err := r.Route(ctx, row)
		if err != nil {
			return nil, err
		}
		_, v := confluentDecode(t, cl, rec.Value)
		return v, nil
	}
	for _, tc := range []struct {
		aggType, payload string
		want             any
	}{
		{"Order", orderPayload, orderPayload},
		{"Optional", `{"a": [1, "ü"]}`, map[string]any{"string": `{"a": [1, "ü"]}`}},
		{"Number", `{"n": 7}`, map[string]any{"n": map[string]any{"long": int64(7)}}},
		{"Number", `{"n": 9007199254740993}`, map[string]any{"n": map[string]any{"long": int64(9007199254740993)}}},
		{"Number", `{"n": 0.25}`, map[string]any{"n": map[string]any{"double": 0.25}}},
	} {
		v, err := route(tc.aggType, tc.payload)
		if err != nil || !reflect.DeepEqual(v, tc.want) {
			t.Errorf("%s %s: %#v, %v; want %#v", tc.aggType, tc.payload, v, err, tc.want)
		}
	}
	_, err := route("Number", `{"n": 123456789012345678901234567890}`)
	if ClassOf(err) != ClassSchema || err == nil || !strings.Contains(err.Error(), "exactly") {
		t.Errorf("a number no branch holds exactly: %v (class %q); want a dead letter saying so", err, ClassOf(err))
	}
}

// debeziumJSONOptional is what Confluent's AvroConverter registers for
// Debezium's outbox payload, a nullable jsonb column: an optional
// io.debezium.data.Json string.
const debeziumJSONOptional = `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`

// TestAvroAutoRegister: with the defaults (auto.register.schemas=true,
// TopicNameStrategy), an empty registry gets the schema Confluent's
// AvroConverter derives from Debezium's, under <topic>-value, once; the
// value is written with it, as AvroConverter writes it (the union's string
// branch holding the payload text).
func TestAvroAutoRegister(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	var posts atomic.Int32
	reg.Intercept(func(_ http.ResponseWriter, req *http.Request) bool {
		if req.Method == http.MethodPost {
			posts.Add(1)
		}
		return false
	})
	r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas = nil })
	ctx := context.Background()
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	for i := 0; i < 3; i++ {
		rec, err := r.Route(ctx, orderRow(orderPayload))
		if err != nil {
			t.Fatal(err)
		}
		ss, err := cl.SchemaByVersion(ctx, "outbox.event.Order-value", -1)
		if err != nil {
			t.Fatalf("nothing registered under outbox.event.Order-value: %v", err)
		}
		if ss.Schema.Schema != debeziumJSONOptional || ss.Version != 1 {
			t.Fatalf("registered version %d: %s\nwant version 1: %s", ss.Version, ss.Schema.Schema, debeziumJSONOptional)
		}
		// Byte 0, the id, the union's branch 1 (zigzag 2), the length
		// (zigzag), the text.
		want := binary.BigEndian.AppendUint32([]byte{0}, uint32(ss.ID))
		want = append(want, 2)
		want = binary.AppendVarint(want, int64(len(orderPayload)))
		want = append(want, orderPayload...)
		if string(rec.Value) != string(want) {
			t.Fatalf("value % x\nwant  % x", rec.Value, want)
		}
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("%d POSTs to the registry for three events of one schema; want 1 (registered once, then cached)", n)
	}
}

// TestAvroRegistrySettings: the subject name strategies, and what an event
// waits for (ClassSchemaRejected: retried, never a dead letter) when the
// registry does not hold what the settings require.
func TestAvroRegistrySettings(t *testing.T) {
	ctx := context.Background()
	expanded := `{"id": 1, "name": "x"}`
	envelope := []AdditionalField{{Column: "type", Placement: PlaceEnvelope, Alias: "eventType"}}
	t.Run("RecordNameStrategy names the subject after the envelope's record", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		r := avroRouter(t, reg, func(c *Config) {
			c.AvroSchemas, c.AdditionalFields, c.AvroSubject = nil, envelope, "${record}"
		})
		if _, err := r.Route(ctx, orderRow(expanded)); err != nil {
			t.Fatal(err)
		}
		cl, _ := sr.NewClient(sr.URLs(reg.URL()))
		subjects, err := cl.Subjects(ctx)
		if err != nil || len(subjects) != 1 || strings.Contains(subjects[0], "outbox.event") {
			t.Fatalf("subjects %v, %v; want one, the record's full name", subjects, err)
		}
	})
	t.Run("TopicRecordNameStrategy", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		r := avroRouter(t, reg, func(c *Config) {
			c.AvroSchemas, c.AdditionalFields, c.AvroSubject = nil, envelope, "${topic}-${record}"
		})
		if _, err := r.Route(ctx, orderRow(expanded)); err != nil {
			t.Fatal(err)
		}
		cl, _ := sr.NewClient(sr.URLs(reg.URL()))
		subjects, _ := cl.Subjects(ctx)
		if len(subjects) != 1 || !strings.HasPrefix(subjects[0], "outbox.event.Order-") || strings.HasSuffix(subjects[0], "-value") {
			t.Fatalf("subjects %v; want outbox.event.Order-<record name>", subjects)
		}
	})
	t.Run("RecordNameStrategy refuses a string payload and an optional record", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		for _, expand := range []bool{false, true} {
			r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas, c.AvroSubject, c.ExpandJSONPayload = nil, "${record}", expand })
			_, err := r.Route(ctx, orderRow(expanded))
			if ClassOf(err) != ClassSchemaRejected || !strings.Contains(err.Error(), "TopicNameStrategy") {
				t.Fatalf("expand %v: %v (class %q); want ClassSchemaRejected naming what to do", expand, err, ClassOf(err))
			}
		}
	})
	t.Run("auto.register.schemas=false waits for the schema to be registered", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas, c.AvroAutoRegister = nil, false })
		_, err := r.Route(ctx, orderRow(orderPayload))
		if ClassOf(err) != ClassSchemaRejected || !IsRetryable(err) || !strings.Contains(err.Error(), "OUTBOX_ROUTE_AVRO_AUTO_REGISTER") {
			t.Fatalf("%v (class %q); want a retryable ClassSchemaRejected naming the setting", err, ClassOf(err))
		}
		id, _, err := reg.RegisterSchema("outbox.event.Order-value", sr.Schema{Schema: debeziumJSONOptional})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := r.Route(ctx, orderRow(orderPayload))
		if err != nil {
			t.Fatal(err)
		}
		if got := int(binary.BigEndian.Uint32(rec.Value[1:5])); got != id {
			t.Fatalf("written with id %d, registered %d", got, id)
		}
	})
	t.Run("use.latest.version with latest.compatibility.strict refuses an incompatible latest version", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		if _, _, err := reg.RegisterSchema("outbox.event.Order-value", sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`}); err != nil {
			t.Fatal(err)
		}
		// srfake finds everything compatible: answer as a registry would.
		reg.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
			if !strings.HasPrefix(req.URL.Path, "/compatibility/") {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"is_compatible":false}`))
			return true
		})
		r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas, c.AvroUseLatestVersion = nil, true })
		_, err := r.Route(ctx, orderRow(orderPayload))
		if ClassOf(err) != ClassSchemaRejected || !strings.Contains(err.Error(), "not compatible") {
			t.Fatalf("%v (class %q); want ClassSchemaRejected: not compatible", err, ClassOf(err))
		}
	})
	t.Run("an incompatible registration is refused, retried, not poison", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		reg.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
			if req.Method != http.MethodPost {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema"}`))
			return true
		})
		r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas = nil })
		_, err := r.Route(ctx, orderRow(orderPayload))
		if ClassOf(err) != ClassSchemaRejected || !IsRetryable(err) || !strings.Contains(err.Error(), "incompatible") {
			t.Fatalf("%v (class %q); want a retryable ClassSchemaRejected: incompatible", err, ClassOf(err))
		}
	})
	t.Run("a registry that fails is retried", func(t *testing.T) {
		reg := srfake.New()
		defer reg.Close()
		reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		})
		r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas = nil })
		_, err := r.Route(ctx, orderRow(orderPayload))
		if ClassOf(err) != ClassRegistry {
			t.Fatalf("%v (class %q); want ClassRegistry", err, ClassOf(err))
		}
	})
}

// TestExpandBrokenIsPoison: with table.expand.json.payload, a payload whose
// values do not fit the schema inferred from it (an integer beyond 64
// bits, a top-level array), which stops Debezium Server, is a dead letter
// for the JSON and Avro value formats, never a wedge.
func TestExpandBrokenIsPoison(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	for _, f := range []Format{FormatJSON, FormatJSONSchema, FormatAvro} {
		cfg := DefaultConfig()
		cfg.ExpandJSONPayload = true
		cfg.ValueFormat = f
		cfg.RegistryURLs = []string{reg.URL()}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{`{"n": 123456789012345678901234567890}`, `[1, 2]`} {
			if _, err := r.Route(context.Background(), orderRow(p)); ClassOf(err) != ClassInvalidPayload {
				t.Errorf("%s %s: %v (class %q); want invalid-payload", f, p, err, ClassOf(err))
			}
		}
	}
}

// TestAvroSchemasPerSubjectBounded: past the per-subject bound of cached
// schemas, values of yet other shapes still route (the cache is emptied
// and fills again): memory bounded, the line never stopped. From the
// reviews of issue 17 (a first fix refused them: a wedge until restart).
func TestAvroSchemasPerSubjectBounded(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	r := avroRouter(t, reg, func(c *Config) { c.AvroSchemas, c.ExpandJSONPayload, c.AvroMaxSchemasPerSubject = nil, true, 5 })
	ctx := context.Background()
	for i := 0; i < 12; i++ {
		if _, err := r.Route(ctx, orderRow(fmt.Sprintf(`{"k%d": 1}`, i))); err != nil {
			t.Fatalf("shape %d: %v", i, err)
		}
	}
	// A shape seen long before routes again, with its id.
	rec, err := r.Route(ctx, orderRow(`{"k0": 2}`))
	if err != nil {
		t.Fatalf("an early shape again: %v", err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	if _, v := confluentDecode(t, cl, rec.Value); !reflect.DeepEqual(v, map[string]any{"payload": map[string]any{"k0": map[string]any{"int": int32(2)}}}) {
		t.Fatalf("decoded %#v", v)
	}
	if got := r.avro.Cached(); got > 5 {
		t.Fatalf("%d schemas cached; want at most the bound, 5", got)
	}
}

// TestAvroGivenSchemaUnderRecordSubject: a schema given for a subject that
// a record subject strategy names is used as given, not replaced by the
// derived one. From the review of issue 17.
func TestAvroGivenSchemaUnderRecordSubject(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	const given = `{"type":"record","name":"Value","namespace":"outbox.public.outbox.Order","fields":[{"name":"payload","type":["null","string"],"default":null},{"name":"eventType","type":"string"}]}`
	r := avroRouter(t, reg, func(c *Config) {
		c.AvroSchemas = map[string]string{"outbox.public.outbox.Order.Value": given}
		c.AvroSubject = "${record}"
		c.AdditionalFields = []AdditionalField{{Column: "type", Placement: PlaceEnvelope, Alias: "eventType"}}
	})
	if _, err := r.Route(context.Background(), orderRow(`{"a": 1}`)); err != nil {
		t.Fatal(err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))
	vs, err := cl.SubjectVersions(context.Background(), "outbox.public.outbox.Order.Value")
	if err != nil || len(vs) != 1 {
		t.Fatalf("versions %v, %v; want only the given schema's", vs, err)
	}
}
