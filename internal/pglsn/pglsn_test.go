package pglsn

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want pglogrepl.LSN
		bad  bool
	}{
		{in: "0/0", want: 0},
		{in: "0/191FA68", want: 0x191FA68},
		{in: "16/B374D848", want: 0x16B374D848},
		{in: "16/b374d848", want: 0x16B374D848},
		{in: "FFFFFFFF/FFFFFFFF", want: pglogrepl.LSN(^uint64(0))},
		{in: "191FA68", bad: true},
		{in: "x/1", bad: true},
		{in: "1/", bad: true},
		{in: "/1", bad: true},
		{in: "1/100000000", bad: true}, // pglogrepl.ParseLSN: 2/0
		{in: "100000000/0", bad: true},
		{in: "1/2x", bad: true}, // pglogrepl.ParseLSN: 1/2
		{in: "1/2/3", bad: true},
	} {
		got, err := Parse(tt.in)
		switch {
		case tt.bad && err == nil:
			t.Errorf("Parse(%q) = %v; want an error", tt.in, got)
		case !tt.bad && (err != nil || got != tt.want):
			t.Errorf("Parse(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		case !tt.bad && got.String() != strings.ToUpper(tt.in):
			t.Errorf("Parse(%q).String() = %q; want it back in PostgreSQL's form", tt.in, got.String())
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "1/", "/1", "x/y", "1/2/3", "1/2x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse(s)
		if err != nil {
			return
		}
		back, err := Parse(l.String())
		if err != nil || back != l {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, uint64(l), l.String(), uint64(back), err)
		}
	})
}
