package avro

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// native reads plain JSON with a schema as Encode does, and decodes the
// binary datum again: what a consumer gets.
func native(t *testing.T, schema, payload string) (any, error) {
	t.Helper()
	s, err := compile(schema)
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	text, err := appendAvroText(nil, s.root, []byte(payload))
	if err != nil {
		return nil, err
	}
	v, _, err := s.codec.NativeFromTextual(text)
	if err != nil {
		return nil, err
	}
	bin, err := s.codec.BinaryFromNative(nil, v)
	if err != nil {
		return nil, err
	}
	out, rest, err := s.codec.NativeFromBinary(bin)
	if err == nil && len(rest) > 0 {
		t.Fatalf("%d bytes left", len(rest))
	}
	return out, err
}

// TestUnionNumbers: a number in a union goes into the branch that holds it
// exactly, in the schema's order, or is refused; goavro's own plain-JSON
// reading took the double for every number (7 became 7.0,
// 9007199254740993 became 9007199254740992.0).
func TestUnionNumbers(t *testing.T) {
	const ld = `["null","long","double"]`
	for _, tc := range []struct {
		schema, payload string
		want            any
		err             string
	}{
		{ld, `7`, map[string]any{"long": int64(7)}, ""},
		{ld, `-9007199254740993`, map[string]any{"long": int64(-9007199254740993)}, ""},
		{ld, `9223372036854775807`, map[string]any{"long": int64(9223372036854775807)}, ""},
		{ld, `7.5`, map[string]any{"double": 7.5}, ""},
		{ld, `1e3`, map[string]any{"double": 1000.0}, ""},
		{ld, `null`, nil, ""},
		// Beyond a long, and not a double exactly: refused, not rounded.
		{ld, `9223372036854775809`, nil, "holds the number 9223372036854775809 exactly"},
		// Beyond a long but a double exactly (2^64).
		{ld, `18446744073709551616`, map[string]any{"double": 18446744073709551616.0}, ""},
		{`["null","double","long"]`, `7`, map[string]any{"long": int64(7)}, ""},
		{`["null","int","long"]`, `7`, map[string]any{"int": int32(7)}, ""},
		{`["null","int","long"]`, `2147483648`, map[string]any{"long": int64(2147483648)}, ""},
		{`["null","int","float"]`, `2147483648`, map[string]any{"float": float32(2147483648)}, ""},
		{`["null","int","float"]`, `16777217`, map[string]any{"int": int32(16777217)}, ""},
		{`["null","float"]`, `16777217`, nil, "exactly"},
		{`["null","float"]`, `0.5`, map[string]any{"float": float32(0.5)}, ""},
		{`["null","float"]`, `0.1`, nil, "exactly"},
		{`["null","double"]`, `9007199254740993`, nil, "exactly"},
		{`["null","double"]`, `1e400`, nil, "exactly"},
		{`["null","long"]`, `7.5`, nil, "exactly"},
		// Outside a union, a double that an integer cannot be exactly.
		{`"double"`, `9007199254740993`, nil, "cannot be a double exactly"},
		{`"double"`, `9007199254740992`, 9007199254740992.0, ""},
		{`"long"`, `9007199254740993`, int64(9007199254740993), ""},
	} {
		got, err := native(t, tc.schema, tc.payload)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %s: %#v, %v; want an error with %q", tc.schema, tc.payload, got, err, tc.err)
		case tc.err == "" && (err != nil || !reflect.DeepEqual(got, tc.want)):
			t.Errorf("%s %s: %#v, %v; want %#v", tc.schema, tc.payload, got, err, tc.want)
		}
	}
}

// TestUnionBranches: every kind of JSON value finds its branch, by name as
// goavro names it (named types by full name, logical types as
// "long.timestamp-millis"), nested in records, arrays and maps.
func TestUnionBranches(t *testing.T) {
	schema := `{"type":"record","name":"Order","namespace":"shop","fields":[
	  {"name":"id","type":["null","int","long"]},
	  {"name":"status","type":["null",{"type":"enum","name":"Status","symbols":["NEW","PAID"]}],"default":null},
	  {"name":"note","type":["null","string"],"default":null},
	  {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null},
	  {"name":"day","type":["null",{"type":"int","logicalType":"date"}],"default":null},
	  {"name":"tags","type":["null",{"type":"array","items":["null","string","long"]}],"default":null},
	  {"name":"attrs","type":["null",{"type":"map","values":["boolean","double"]}],"default":null},
	  {"name":"line","type":["null",{"type":"record","name":"Line","fields":[{"name":"qty","type":["int","double"]}]}],"default":null},
	  {"name":"next","type":["null","Line"],"default":null},
	  {"name":"raw","type":["null","bytes"],"default":null}
	]}`
	got, err := native(t, schema, `{"id": 7, "status": "PAID", "note": "x", "at": 1556890294484, "day": 1,
	  "tags": ["a", 3, null], "attrs": {"ok": true, "w": 2}, "line": {"qty": 2}, "next": {"qty": 2.5}, "raw": "\u00ff\u0000"}`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"id": map[string]any{"int": int32(7)}, "status": map[string]any{"shop.Status": "PAID"},
		"note":  map[string]any{"string": "x"},
		"at":    map[string]any{"long.timestamp-millis": time.UnixMilli(1556890294484).UTC()},
		"day":   map[string]any{"int.date": time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC)},
		"tags":  map[string]any{"array": []any{map[string]any{"string": "a"}, map[string]any{"long": int64(3)}, nil}},
		"attrs": map[string]any{"map": map[string]any{"ok": map[string]any{"boolean": true}, "w": map[string]any{"double": 2.0}}},
		"line":  map[string]any{"shop.Line": map[string]any{"qty": map[string]any{"int": int32(2)}}},
		"next":  map[string]any{"shop.Line": map[string]any{"qty": map[string]any{"double": 2.5}}},
		"raw":   map[string]any{"bytes": []byte{0xff, 0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
	// Defaults left out, and a record field that is missing still named.
	if got, err := native(t, schema, `{"id": null}`); err != nil || got.(map[string]any)["note"] != nil {
		t.Errorf("defaults: %#v, %v", got, err)
	}
	if _, err := native(t, schema, `{"id": 1, "line": {}}`); err == nil || !strings.Contains(err.Error(), `record "shop.Line": only found 0 of 1 fields`) {
		t.Errorf("a record without its field: %v; want goavro's error naming the record", err)
	}
	if _, err := native(t, schema, `{"id": 1, "status": "LOST"}`); err == nil {
		t.Error("an enum symbol the schema lacks was taken")
	}
}

// TestTextSchemas: the payload text goes as it is into every string schema,
// whatever its attributes (Debezium's io.debezium.data.Json, which goavro's
// canonical form writes as {"type":"string"}), and into an optional one's
// string branch; other schemas are not text schemas.
func TestTextSchemas(t *testing.T) {
	for _, tc := range []struct {
		schema string
		text   bool
		branch string
	}{
		{`"string"`, true, ""},
		{`{"type":"string"}`, true, ""},
		{`{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}`, true, ""},
		{`{"type":"string","logicalType":"uuid"}`, true, ""},
		{`["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`, true, "string"},
		{`"bytes"`, false, ""},
		{`{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}`, false, ""},
	} {
		s, err := compile(tc.schema)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.text != nil; got != tc.text {
			t.Errorf("%s: text schema %v, want %v", tc.schema, got, tc.text)
		}
		if tc.branch != "" && (s.text == s.root || s.text.branch != tc.branch) {
			t.Errorf("%s: branch %+v, want %q", tc.schema, s.text, tc.branch)
		}
	}
}

// FuzzAvroText: any payload, valid JSON or not, is read into Avro or
// refused with an error; nothing panics.
func FuzzAvroText(f *testing.F) {
	s, err := compile(`{"type":"record","name":"R","fields":[
	  {"name":"a","type":["null","int","long","float","double","string","boolean",{"type":"array","items":["null","R"]},{"type":"map","values":"R"}],"default":null},
	  {"name":"b","type":["null",{"type":"enum","name":"E","symbols":["X"]},"bytes"],"default":null}]}`)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{`{"a": 7}`, `{"a": [{"a": 1.5}]}`, `{"a": {"k": {"b": "X"}}}`, `{"b": "\u00ff"}`, `[1]`, `{"a": 1e999}`, `{`, `{"a": -0}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		text, err := appendAvroText(nil, s.root, []byte(payload))
		if err != nil {
			return
		}
		if v, _, err := s.codec.NativeFromTextual(text); err == nil {
			if _, err := s.codec.BinaryFromNative(nil, v); err != nil {
				t.Logf("read but not written: %v", err)
			}
		}
	})
}
