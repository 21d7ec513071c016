package audit

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecodeID(t *testing.T) {
	for _, c := range []struct {
		in   string
		nil_ bool
		want string
		ok   bool
	}{
		{in: "0193a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b", want: "0193a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b", ok: true},
		{in: `"0193a1b2-7c3d"`, want: "0193a1b2-7c3d", ok: true},
		{in: `"a\"b"`, want: `a"b`, ok: true},
		{in: "12345", want: "12345", ok: true}, // a number: JSON or string, the same text
		{in: `{"schema":{"type":"string","optional":false},"payload":"abc"}`, want: "abc", ok: true},
		{in: `{"schema":{"type":"int64","optional":false},"payload":42}`, want: "42", ok: true},
		{in: `{"schema":{"type":"string"},"payload":null}`, ok: false},
		{in: `{"not":"an envelope"}`, want: `{"not":"an envelope"}`, ok: true},
		{in: `"unterminated`, want: `"unterminated`, ok: true},
		{in: "", want: "", ok: true},
		{nil_: true, ok: false},
		// The schema registry's framing (magic byte 0, a 4-byte schema
		// id, then Avro's string: zigzag length 2×5, "abcde"): a
		// converter the audit does not know, no id.
		{in: "\x00\x00\x00\x00\x01\x0aabcde", ok: false},
		{in: "\xff\xfe", ok: false}, // not UTF-8
	} {
		var in []byte
		if !c.nil_ {
			in = []byte(c.in)
		}
		got, ok := DecodeID(in)
		if got != c.want || ok != c.ok {
			t.Errorf("DecodeID(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// FuzzDecodeID: an id written by any of the converters reads back as
// itself, and no value makes DecodeID panic.
func FuzzDecodeID(f *testing.F) {
	f.Add("0193a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b")
	f.Add(`{"payload":"x"}`)
	f.Add(`"x"`)
	f.Fuzz(func(t *testing.T, id string) {
		_, _ = DecodeID([]byte(id))
		if !utf8.ValidString(id) || strings.HasPrefix(id, "\x00") {
			return // JSON has no text for it; no PostgreSQL text has a NUL
		}
		j, _ := json.Marshal(id)
		for _, v := range []string{string(j), `{"schema":{"type":"string","optional":false},"payload":` + string(j) + `}`} {
			if got, ok := DecodeID([]byte(v)); !ok || got != id {
				t.Fatalf("DecodeID(%q) = %q, %v; want %q", v, got, ok, id)
			}
		}
		if len(id) > 1 && (id[0] == '"' || id[0] == '{') {
			return // the string converter's text of such an id is ambiguous
		}
		if got, ok := DecodeID([]byte(id)); !ok || got != id {
			t.Fatalf("DecodeID(%q) = %q, %v; want it as is", id, got, ok)
		}
	})
}
