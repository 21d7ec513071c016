package expand

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

// TestExpand: what the EventRouter's expansion leaves for a payload that is
// no JSON object or array, one it expands, and one whose value does not fit
// the schema inferred for it (the golden files in route hold the records).
func TestExpand(t *testing.T) {
	var x Expander
	for _, p := range []string{"", "plain text", `"a string"`, `{"a":`} {
		if r, s, _ := x.Expand([]byte(p), "payload"); r != Kept || s != nil {
			t.Errorf("%q: %v, %v; want kept, no schema", p, r, s)
		}
	}
	r, s, v := x.Expand([]byte(`{"id":7,"name":"x","tags":["a","b"]}`), "payload")
	if r != Done || s.Type != connect.TypeStruct || len(s.Fields) != 3 || s.Fields[0].Name != "id" || len(v.List) != 3 {
		t.Fatalf("object: %v, %+v, %+v", r, s, v)
	}
	if got := string(connect.AppendValueJSON(nil, s, &v)); got != `{"id":7,"name":"x","tags":["a","b"]}` {
		t.Errorf("expanded value %s", got)
	}
}
