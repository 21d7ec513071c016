package redrive

import (
	"bytes"
	"strings"
	"testing"
)

// TestRowFrom: a dead letter's row_data is read back as the connector
// stores it: text values, NULLs, and {"base64": ...} for values PostgreSQL
// text cannot hold (a NUL byte, bytes that are not UTF-8), byte for byte.
func TestRowFrom(t *testing.T) {
	for _, tc := range []struct {
		name, values, types string
		want                map[string][]byte // nil value: NULL
		err                 string
	}{
		{name: "text and null", values: `{"id":"e1","payload":"{\"a\":1}","key":null}`, types: `{"payload":3802}`,
			want: map[string][]byte{"id": []byte("e1"), "payload": []byte(`{"a":1}`), "key": nil}},
		{name: "base64", values: `{"id":"e2","payload":{"base64":"AGZv/w=="}}`,
			want: map[string][]byte{"id": []byte("e2"), "payload": {0x00, 'f', 'o', 0xff}}},
		{name: "not an object", values: `[1]`, err: "not a JSON object of columns"},
		{name: "object without base64", values: `{"payload":{"x":"y"}}`, err: `column "payload"`},
		{name: "bad base64", values: `{"payload":{"base64":"!!"}}`, err: `column "payload"`},
		{name: "number", values: `{"payload":7}`, err: `column "payload"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row, err := rowFrom([]byte(tc.values), []byte(tc.types))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v; want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(row.Columns) != len(tc.want) {
				t.Fatalf("%d columns; want %d", len(row.Columns), len(tc.want))
			}
			for _, c := range row.Columns {
				w, ok := tc.want[c.Name]
				if !ok {
					t.Fatalf("unexpected column %q", c.Name)
				}
				if (w == nil) != c.Null || !bytes.Equal(w, c.Value) {
					t.Errorf("column %q = %q (null %v); want %q", c.Name, c.Value, c.Null, w)
				}
				if c.Name == "payload" && tc.types != "" && c.Type != 3802 {
					t.Errorf("payload type %d; want 3802", c.Type)
				}
			}
		})
	}
}
