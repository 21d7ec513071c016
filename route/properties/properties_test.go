package properties

import "testing"

// TestParse: comments, the three separators, escapes and continuation
// lines, as Properties.load reads them.
func TestParse(t *testing.T) {
	p := Parse([]byte("! comment\n  a = 1\nb:2\nc 3\nd\\ e=f\\u0041\\\n   g\r\nh=\\\nempty=\nk=v\\\\\nz=\n"))
	want := map[string]string{"a": "1", "b": "2", "c": "3", "d e": "fAg", "h": "empty=", "z": "", "k": `v\`}
	for k, v := range want {
		if got, ok := p.Get(k); !ok || got != v {
			t.Errorf("%q = %q, %v; want %q", k, got, ok, v)
		}
	}
}
