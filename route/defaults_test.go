package route

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

// TestColumnDefaults: the default value Debezium's PostgresDefaultValueConverter
// puts in a column's schema for a default expression as pg_get_expr prints
// it, per type: literals parsed, generated defaults (a function call, a
// current date/time keyword) as the type's placeholder, and none for NULL,
// a struct (an unconstrained numeric), a type without a mapper, or an
// expression the mapper cannot parse.
func TestColumnDefaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		typ    uint32
		typmod int32
		expr   string
		want   string // the default as JsonConverter writes it; "" none
	}{
		{"timestamptz now()", OIDTimestamptz, -1, "now()", `"1970-01-01T00:00:00.000000Z"`},
		{"timestamptz CURRENT_TIMESTAMP", OIDTimestamptz, -1, "CURRENT_TIMESTAMP", `"1970-01-01T00:00:00.000000Z"`},
		{"timestamptz literal", OIDTimestamptz, -1, "'2020-01-02 03:04:05.5+02'::timestamp with time zone", `"2020-01-02T01:04:05.500000Z"`},
		{"timestamp now()", OIDTimestamp, -1, "now()", `0`},
		{"timestamp literal", OIDTimestamp, -1, "'2020-01-02 03:04:05'::timestamp without time zone", `1577934245000000`},
		{"date CURRENT_DATE", OIDDate, -1, "CURRENT_DATE", `0`},
		{"date literal", OIDDate, -1, "'2020-01-02'::date", `18263`},
		{"time", OIDTime, -1, "LOCALTIME", `0`},
		{"uuid gen_random_uuid()", OIDUUID, -1, "gen_random_uuid()", `"00000000-0000-0000-0000-000000000000"`},
		{"int4 literal", OIDInt4, -1, "42", `42`},
		{"int4 negative", OIDInt4, -1, "'-7'::integer", `-7`},
		{"int8 serial", OIDInt8, -1, "nextval('outbox_seq_seq'::regclass)", `0`},
		{"int2 too big", OIDInt2, -1, "70000", ``},
		{"bool", OIDBool, -1, "true", `true`},
		{"bool false", OIDBool, -1, "false", `false`},
		{"text literal", OIDText, -1, "'it''s'::text", `"it's"`},
		{"varchar", OIDVarchar, -1, "'Order'::character varying", `"Order"`},
		{"jsonb", OIDJSONB, -1, "'{}'::jsonb", `"{}"`},
		{"float8", OIDFloat8, -1, "0.5", `0.5`},
		{"numeric(10,2) raised to the scale", OIDNumeric, NumericTypeMod(10, 2), "0", `"AA=="`},
		{"numeric(10,2) of a greater scale", OIDNumeric, NumericTypeMod(10, 2), "1.234", ``},
		{"numeric unconstrained: a struct", OIDNumeric, -1, "1.5", ``},
		{"NULL", OIDInt4, -1, "NULL::integer", ``},
		{"bytea: no mapper", OIDBytea, -1, "'\\x00'::bytea", ``},
		{"name: no mapper", OIDName, -1, "'x'::name", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Column{Name: "c", Type: tc.typ, TypeMod: tc.typmod, HasTypeMod: true}
			v, ok := defaultValue(c, tc.expr)
			got := ""
			if ok {
				got = string(connect.AppendValueJSON(nil, colSchema(c, false, &v), &v))
			}
			if got != tc.want {
				t.Fatalf("default of %s %q: %s, want %s", tc.name, tc.expr, orNone(got), orNone(tc.want))
			}
		})
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// TestColumnInfoSchemas: what the catalog says decides optional-ness over
// RequiredColumns, and the default is on the schema; a null value is
// optional whatever either says.
func TestColumnInfoSchemas(t *testing.T) {
	r, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	info := &ColumnInfo{NotNull: true, Default: "now()", HasDefault: true}
	c := &Column{Name: "created_at", Type: OIDTimestamptz, Info: info, Value: []byte("2019-05-03 13:31:34.344+02")}
	v, err := colValue(c)
	if err != nil {
		t.Fatal(err)
	}
	s := r.schemaOf(c, &v)
	if got := string(connect.AppendSchemaJSON(nil, s, "", false)); got != `{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","version":1,"default":"1970-01-01T00:00:00.000000Z"}` {
		t.Fatalf("schema %s", got)
	}
	// The catalog's nullable id beats RequiredColumns.
	id := &Column{Name: "id", Type: OIDUUID, Info: &ColumnInfo{}, Value: []byte("4d47e190-0402-4048-bc2c-89dd54343cdc")}
	v, _ = colValue(id)
	if !r.schemaOf(id, &v).Optional {
		t.Fatal("a nullable column in the catalog is required")
	}
	null := &Column{Name: "created_at", Type: OIDTimestamptz, Info: info, Null: true}
	nv := connect.Value{Kind: connect.KindNull}
	if s := r.schemaOf(null, &nv); !s.Optional || s.Default == nil {
		t.Fatalf("a null value: optional %v, default %v; want optional, with the default", s.Optional, s.Default)
	}
}
