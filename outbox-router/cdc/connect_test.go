package cdc

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/route"
)

// TestNumericTypeMod: a numeric column's Connect schema tells its
// declaration (VariableScaleDecimal: numeric; Decimal with
// connect.decimal.precision: numeric(p,s)), and the router, given the row,
// writes the header Debezium Server wrote for the same column
// (route/testdata/golden/47 and 48, observed from a real run).
func TestNumericTypeMod(t *testing.T) {
	const vsd = `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"`
	const dec = `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}`
	const bare = `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"3"}`
	event := `{"schema":{"type":"struct","fields":[{"type":"struct","optional":true,"field":"after","fields":[` +
		`{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1,"field":"id"},` +
		`{"type":"string","optional":false,"field":"aggregatetype"},{"type":"string","optional":false,"field":"aggregateid"},` +
		`{"type":"string","optional":false,"field":"type"},{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},` +
		vsd + `,"field":"u"},` + vsd + `,"field":"u_null"},` + dec + `,"field":"c"},` + bare + `,"field":"b"}]},` +
		`{"type":"string","optional":false,"field":"op"}],"optional":false,"name":"dbserver1.public.outbox.Envelope"},` +
		`"payload":{"after":{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","aggregatetype":"Order","aggregateid":"1","type":"OrderCreated",` +
		`"payload":"{}","u":{"scale":1,"value":"fQ=="},"u_null":null,"c":"/2o=","b":"MDk="},"op":"c"}}`
	row, err := DecodeJSON([]byte(event), "payload")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		col        string
		value      string
		typmod     int32
		hasTypeMod bool
		schema     string // the header's, as the "after" field's less "field"
		payload    string
	}{
		{"u", "12.5", route.NoTypeMod, true, vsd, `{"scale":1,"value":"fQ=="}`},
		{"u_null", "", route.NoTypeMod, true, vsd, `null`},
		{"c", "-1.50", route.NumericTypeMod(10, 2), true, dec, `"/2o="`},
		// Not from Debezium's PostgreSQL connector: the declaration stays
		// unknown and the value keeps its scale.
		{"b", "12.345", 0, false, bare, `"MDk="`},
	}
	cfg := route.DefaultConfig()
	cfg.HeaderFormat = route.FormatJSONSchema
	for _, tt := range tests {
		cfg.AdditionalFields = append(cfg.AdditionalFields, route.AdditionalField{Column: tt.col, Placement: route.PlaceHeader, Alias: tt.col})
	}
	r, err := route.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		t.Run(tt.col, func(t *testing.T) {
			c := row.Lookup(tt.col)
			if c == nil {
				t.Fatalf("no column %s", tt.col)
			}
			if string(c.Value) != tt.value || c.TypeMod != tt.typmod || c.HasTypeMod != tt.hasTypeMod {
				t.Errorf("value %q typmod %d (known %v), want %q %d (%v)", c.Value, c.TypeMod, c.HasTypeMod, tt.value, tt.typmod, tt.hasTypeMod)
			}
			h := rec.Headers[i+1] // after id
			want := `{"schema":` + tt.schema + `},"payload":` + tt.payload + `}`
			if h.Key != tt.col || string(h.Value) != want {
				t.Errorf("header %s=%s\nwant %s", h.Key, h.Value, want)
			}
		})
	}
}
