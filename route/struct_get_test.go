package route

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Tests from the review of issue 17 (each failed before its fix).
//
// Debezium's EventRouterDelegate reads every column through Struct.get
// (payload, key, headers, partition, route-by), which gives a field's
// default for null before any converter runs: so does the router
// (withDefaults), not only where a JSON converter writes the value.
func defaultsRow() *Row {
	info := func(def string) *ColumnInfo { return &ColumnInfo{Default: def, HasDefault: true} }
	return &Row{Columns: []Column{
		{Name: "id", Type: OIDUUID, HasTypeMod: true, TypeMod: -1, Value: []byte("4d47e190-0402-4048-bc2c-89dd54343cdc"), Info: &ColumnInfo{NotNull: true}},
		{Name: "aggregatetype", Type: OIDVarchar, HasTypeMod: true, TypeMod: -1, Value: []byte("Order")},
		{Name: "aggregateid", Type: OIDVarchar, HasTypeMod: true, TypeMod: -1, Null: true, Info: info("'none'::character varying")},
		{Name: "type", Type: OIDVarchar, HasTypeMod: true, TypeMod: -1, Value: []byte("OrderCreated")},
		{Name: "payload", Type: OIDJSONB, HasTypeMod: true, TypeMod: -1, Null: true, Info: info("'{}'::jsonb")},
		{Name: "channel", Type: OIDText, HasTypeMod: true, TypeMod: -1, Null: true, Info: info("'web'::text")},
	}, Source: Source{Table: "public.outbox", ProcessedTime: time.UnixMilli(1556890294484)}}
}

// propsRouter is a router for a Debezium properties file; with reg, its
// values are Avro against it.
func propsRouter(t testing.TB, props string, reg *srfake.Registry) *Router {
	t.Helper()
	cfg, err := ParseProperties(strings.NewReader(props))
	if err != nil {
		t.Fatal(err)
	}
	if reg != nil {
		cfg.ValueFormat = FormatAvro
		cfg.RegistryURLs = []string{reg.URL()}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNullIsDefaultInStringFormats(t *testing.T) {
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"key.converter=org.apache.kafka.connect.storage.StringConverter\nvalue.converter=org.apache.kafka.connect.storage.StringConverter\n" +
		"transforms.outbox.table.fields.additional.placement=channel:header\n"
	r := propsRouter(t, props, nil)
	rec, err := r.Route(context.Background(), defaultsRow())
	if err != nil {
		t.Fatal(err)
	}
	// Debezium: key "none", value "{}", header channel "web".
	t.Logf("key=%q value=%q headers=%q", rec.Key, rec.Value, rec.Headers)
	if string(rec.Key) != "none" {
		t.Errorf("key %q, Debezium's Struct.get gives the default \"none\"", rec.Key)
	}
	if string(rec.Value) != "{}" {
		t.Errorf("value %q, Debezium's Struct.get gives the default \"{}\"", rec.Value)
	}
	for _, h := range rec.Headers {
		if h.Key == "channel" && string(h.Value) != "web" {
			t.Errorf("header channel %q (nil: %v), Debezium gives \"web\"", h.Value, h.Value == nil)
		}
	}
}

func TestNullIsDefaultNotTombstone(t *testing.T) {
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n" +
		"transforms.outbox.route.tombstone.on.empty.payload=true\n"
	r := propsRouter(t, props, nil)
	rec, err := r.Route(context.Background(), defaultsRow())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("value=%q nil=%v", rec.Value, rec.Value == nil)
	if rec.Value == nil {
		t.Errorf("a tombstone; Debezium's payload is Struct.get's default \"{}\", not empty: JsonConverter writes \"\\\"{}\\\"\"")
	}
}

func TestAvroNullPayloadIsDefault(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
	r := propsRouter(t, props, reg)
	rec, err := r.Route(context.Background(), defaultsRow())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("value=%x nil=%v", rec.Value, rec.Value == nil)
	if rec.Value == nil {
		t.Errorf("a null value (a tombstone on a compacted topic); AvroConverter gets Struct.get's default \"{}\" and writes a datum")
	}
}

// Avro 1.12.1's default NameValidator.UTF_VALIDATOR takes any Unicode
// letter (Character.isLetter / isLetterOrDigit): AvroData derives and the
// serializer writes a record with a field "prénom"; so does the router
// (goavro, ASCII only, compiles a copy with the names renamed).
func TestAvroUnicodeNames(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"transforms.outbox.table.expand.json.payload=true\n" +
		"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
	r := propsRouter(t, props, reg)
	row := defaultsRow()
	for i := range row.Columns {
		row.Columns[i].Info = nil
		switch row.Columns[i].Name {
		case "payload":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte(`{"prénom": "Jean"}`)
		case "aggregateid":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte("1")
		}
	}
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatalf("class %q: %v (Java Avro 1.12.1 accepts the name: Debezium writes the record)", ClassOf(err), err)
	}
	_ = rec
}

func TestAvroDefaultsCompile(t *testing.T) {
	for _, tc := range []struct {
		typ, def string
		notNull  bool
		val      *string
	}{
		{"numeric(10,2)", "0", false, nil},
		{"numeric(10,2)", "1.5", false, ptr("2.25")},
		{"date", "'2020-01-02'::date", false, nil},
		{"timestamp", "'2020-01-02 03:04:05'::timestamp without time zone", false, nil},
		{"float8", "1.5", false, nil},
		{"int8", "'7'::bigint", true, ptr("8")},
		{"bool", "false", false, nil},
	} {
		t.Run(tc.typ+"_"+tc.def, func(t *testing.T) {
			reg := srfake.New()
			defer reg.Close()
			props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
				"transforms.outbox.table.fields.additional.placement=x:envelope\n" +
				"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
			cfg, err := ParseProperties(strings.NewReader(props))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ValueFormat = FormatAvro
			cfg.RegistryURLs = []string{reg.URL()}
			r, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			oid, typmod, ok := goldenType(tc.typ)
			if !ok {
				t.Fatalf("type %s", tc.typ)
			}
			row := defaultsRow()
			for i := range row.Columns {
				row.Columns[i].Info = nil
				switch row.Columns[i].Name {
				case "payload":
					row.Columns[i].Null, row.Columns[i].Value = false, []byte(`{"a": 1}`)
				case "aggregateid":
					row.Columns[i].Null, row.Columns[i].Value = false, []byte("1")
				}
			}
			x := Column{Name: "x", Type: oid, TypeMod: typmod, HasTypeMod: true, Null: tc.val == nil, Info: &ColumnInfo{NotNull: tc.notNull, Default: tc.def, HasDefault: true}}
			if tc.val != nil {
				x.Value = []byte(*tc.val)
			}
			row.Columns = append(row.Columns, x)
			rec, err := r.Route(context.Background(), row)
			if err != nil {
				t.Fatalf("class %q: %v", ClassOf(err), err)
			}
			t.Logf("%x", rec.Value)
		})
	}
}

func ptr(s string) *string { return &s }

// PostgreSQL 15+ allows numeric(p,s) with s > p. AvroData then writes a
// legacy decimal (its logicalType a mere property: "scale > precision
// cannot be serialized as native Avro logical decimal"), which goavro
// refused to compile.
func TestAvroLegacyDecimal(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"transforms.outbox.table.fields.additional.placement=x:envelope\n" +
		"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
	cfg, _ := ParseProperties(strings.NewReader(props))
	cfg.ValueFormat = FormatAvro
	cfg.RegistryURLs = []string{reg.URL()}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	row := defaultsRow()
	for i := range row.Columns {
		row.Columns[i].Info = nil
		switch row.Columns[i].Name {
		case "payload":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte(`{"a": 1}`)
		case "aggregateid":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte("1")
		}
	}
	row.Columns = append(row.Columns, Column{Name: "x", Type: OIDNumeric, TypeMod: NumericTypeMod(2, 5), HasTypeMod: true, Value: []byte("0.00012")})
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatalf("class %q: %v", ClassOf(err), err)
	}
	t.Logf("%x", rec.Value)
}

func TestAvroExpandShapes(t *testing.T) {
	for _, env := range []bool{false, true} {
		for _, p := range []string{
			`{"a":{"b":{"c":1}},"d":[{"e":1},{"e":2,"f":"x"}]}`,
			`{"m":[[{"a":1}],[{"a":2}]]}`,
			`{"a":{"x":1},"b":{"x":1}}`,
			`{"a":[{"x":{"y":1}},{"x":{"y":2}}]}`,
			`{}`,
			`{"a":null,"b":[],"c":[null]}`,
			`[{"a":1}]`,
			`"str"`,
			`12`,
			`{"a":{}}`,
			`{"big": 12345678901, "small": 1, "f": 1.5e300}`,
			`{"a":[1, 12345678901]}`,
		} {
			t.Run(p, func(t *testing.T) {
				reg := srfake.New()
				defer reg.Close()
				props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
					"transforms.outbox.table.expand.json.payload=true\n" +
					"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
				if env {
					props += "transforms.outbox.table.fields.additional.placement=type:envelope\n"
				}
				cfg, _ := ParseProperties(strings.NewReader(props))
				cfg.ValueFormat = FormatAvro
				cfg.RegistryURLs = []string{reg.URL()}
				r, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				row := defaultsRow()
				for i := range row.Columns {
					row.Columns[i].Info = nil
					switch row.Columns[i].Name {
					case "payload":
						row.Columns[i].Null, row.Columns[i].Value = false, []byte(p)
					case "aggregateid":
						row.Columns[i].Null, row.Columns[i].Value = false, []byte("1")
					}
				}
				rec, err := r.Route(context.Background(), row)
				if err != nil {
					t.Logf("env=%v class %q: %v", env, ClassOf(err), err)
					return
				}
				t.Logf("env=%v ok %x", env, rec.Value)
			})
		}
	}
}
