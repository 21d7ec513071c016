package route

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/route/connect"
	"github.com/twmb/franz-go/pkg/kgo"
)

func itoa(i int64) string {
	return strings.TrimSpace(string(connect.AppendJavaBigDecimal(nil, &connect.Decimal{Unscaled: *bigInt(i)})))
}

func TestTopicRule(t *testing.T) {
	for _, c := range []struct{ re, repl, in, want string }{
		{"(?<routedByValue>.*)", "outbox.event.${routedByValue}", "Order", "outbox.event.Order"},
		{"(?<routedByValue>.*)", "outbox.event.${routedByValue}", "a\rb", "a\rb"}, // Java's . stops at \r: no match
		{"(?<routedByValue>.*)", "x.\\$y", "v", "x.$y"},
		{"(a)(b)?c", "$1-$2-$12", "ac", "a--a2"},
		{"a|ab", "X", "ab", "Xb"}, // matches() is true; replaceFirst replaces find()'s "a"
		{"[.]x", "y", ".x", "y"},
	} {
		r, err := compileTopicRule(c.re, c.repl)
		if err != nil {
			t.Fatalf("%s: %v", c.re, err)
		}
		if got := r.apply(c.in); got != c.want {
			t.Errorf("%s / %s (%q): %q, want %q", c.re, c.repl, c.in, got, c.want)
		}
	}
	for _, c := range [][2]string{{"(?<a_b>.*)", "x"}, {"(.*)", "$2"}, {"(.*)", "${x}"}, {"(.*)", "x\\"}, {"(.*)", "$"}, {"[a[b]]", "x"}, {"(?<=a)b", "x"}} {
		if _, err := compileTopicRule(c[0], c[1]); err == nil {
			t.Errorf("%q %q: no error", c[0], c[1])
		}
	}
}

func TestRouteNeverAliasesRow(t *testing.T) {
	r, _ := New(DefaultConfig())
	row := orderRow(orderPayload)
	rec, err := r.Route(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	for i := range row.Columns {
		for j := range row.Columns[i].Value {
			row.Columns[i].Value[j] = 'X'
		}
	}
	if string(rec.Value) != orderPayload || string(rec.Key) != "1" {
		t.Fatalf("the record changed with the row: %s", rec.Value)
	}
}

func TestRouteClockAndErrors(t *testing.T) {
	r, _ := New(DefaultConfig())
	r.now = func() time.Time { return time.UnixMilli(42) }
	row := orderRow(orderPayload)
	row.Source.ProcessedTime = time.Time{}
	rec, err := r.Route(context.Background(), row)
	if err != nil || rec.Timestamp.UnixMilli() != 42 {
		t.Fatalf("%v %v", rec, err)
	}
	if _, err := r.Route(context.Background(), nil); ClassOf(err) != ClassInvalidPayload {
		t.Fatal(err)
	}
	row.Op = OpDelete
	_, err = r.Route(context.Background(), row)
	if !errors.Is(err, ErrSkip) || !ClassOf(err).Skip() || ClassOf(err).Poison() {
		t.Fatal(err)
	}
}

func TestDeadLetter(t *testing.T) {
	row := &Row{Columns: []Column{{Name: "id", Type: OIDUUID, Value: []byte("e1")}, {Name: "payload", Type: OIDJSONB, Value: []byte(`{"a": "\u00e9"}`)}, {Name: "n", Type: OIDText, Null: true}},
		Source: Source{LSN: 0x1_0000_00AB, CommitLSN: 0x2_0000_0001, Table: "public.outbox"}}
	cause := &Error{Class: ClassInvalidTopic, Msg: "bad"}
	rec := DeadLetter(row, "outbox.event.x y", cause, "outbox.dlq")
	if rec.Topic != "outbox.dlq" || string(rec.Key) != "e1" || string(rec.Value) != `{"id":"e1","payload":"{\"a\": \"\\u00e9\"}","n":null}` {
		t.Fatalf("%s", rec.Value)
	}
	want := map[string]string{"id": "e1", "error": cause.Error(), "error.class": "invalid-topic", "source.lsn": "1/AB", "source.commit.lsn": "2/1",
		"source.table": "public.outbox", "column.types": `{"id":2950,"payload":3802,"n":25}`, "topic": "outbox.event.x y"}
	for _, h := range rec.Headers {
		if want[h.Key] != string(h.Value) {
			t.Errorf("header %s=%s, want %s", h.Key, h.Value, want[h.Key])
		}
	}
	if dl := DeadLetter(nil, "", nil, "d"); dl.Value == nil {
		t.Fatal("nil row")
	}
}

func TestRowFromMessage(t *testing.T) {
	row, err := RowFromMessage([]byte(`{"id":"e1","aggregatetype":"Order","aggregateid":"1","type":"T","payload":{"a": 1},"tracingspancontext":"traceparent=x","n":3,"f":1.5,"b":true}`), Source{Message: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := row.Lookup("payload"); c.Type != OIDJSONB || string(c.Value) != `{"a": 1}` {
		t.Fatalf("%+v", c)
	}
	if row.Lookup("n").Type != OIDInt8 || row.Lookup("f").Type != OIDFloat8 || string(row.Lookup("b").Value) != "t" || row.Lookup("tracingspancontext").Type != OIDText {
		t.Fatalf("%+v", row.Columns)
	}
	r, _ := New(DefaultConfig())
	rec, err := r.Route(context.Background(), row)
	if err != nil || rec.Topic != "outbox.event.Order" || string(rec.Value) != `{"a": 1}` {
		t.Fatalf("%v %v", rec, err)
	}
	for _, bad := range []string{`[]`, `{"id": 1}`, `{"id":"x"} {}`, `{`} {
		if _, err := RowFromMessage([]byte(bad), Source{}); ClassOf(err) != ClassInvalidPayload {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func TestPartitioner(t *testing.T) {
	tp := Partitioner().ForTopic("t")
	if p := tp.Partition(&kgo.Record{Partition: 3, Key: []byte("k")}, 8); p != 3 {
		t.Fatal(p)
	}
	k := &kgo.Record{Partition: -1, Key: []byte("k")}
	if p := tp.Partition(k, 8); p != tp.Partition(k, 8) || !tp.RequiresConsistency(k) {
		t.Fatal("keyed records must hash consistently")
	}
}

func bigInt(i int64) *bigIntT { v := new(bigIntT); v.SetInt64(i); return v }

type bigIntT = big.Int

func TestRouteConcurrent(t *testing.T) {
	r, _ := New(DefaultConfig())
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func(g int) {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 200; i++ {
				row := orderRow(orderPayload)
				row.Columns[1].Value = []byte("T" + strings.Repeat("x", (g*200+i)%7))
				rec, err := r.Route(context.Background(), row)
				if err != nil || !strings.HasPrefix(rec.Topic, "outbox.event.T") {
					t.Errorf("%v %v", rec, err)
					return
				}
			}
		}(g)
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}

// TestNumericScale: the two BigDecimal operations Debezium applies to a
// numeric value, setScale (numeric(p,s)) and stripTrailingZeros then
// setScale(0) when negative (numeric).
func TestNumericScale(t *testing.T) {
	for _, c := range []struct {
		in      string
		strip   string // unscaled/scale after stripping
		setTo   int32
		set     string // after setScale(setTo); "" when digits would be lost
		typmod  int32
		p, s    int32
		bounded bool
	}{
		{"100", "100/0", 2, "10000/2", NumericTypeMod(10, 2), 10, 2, true},
		{"12.50", "125/1", 2, "1250/2", NumericTypeMod(5, 0), 5, 0, true},
		{"100.000", "100/0", 1, "1000/1", NumericTypeMod(1000, 1000), 1000, 1000, true},
		{"-0.00100", "-1/3", 2, "", NoTypeMod, 0, 0, false},
		{"0.000", "0/0", 0, "0/0", 0, 0, 0, false}, // 0: invalid, not a declaration
		{"0.0000001", "1/7", 7, "1/7", 4, 0, 0, false},
	} {
		d, _ := connect.ParseDecimal([]byte(c.in))
		d.StripTrailingZeros()
		if got := d.Unscaled.String() + "/" + itoa(int64(d.Scale)); got != c.strip {
			t.Errorf("%s stripped: %s, want %s", c.in, got, c.strip)
		}
		d, _ = connect.ParseDecimal([]byte(c.in))
		got := ""
		if d.SetScale(c.setTo) {
			got = d.Unscaled.String() + "/" + itoa(int64(d.Scale))
		}
		if got != c.set {
			t.Errorf("%s setScale(%d): %q, want %q", c.in, c.setTo, got, c.set)
		}
		if p, s, ok := numericPrecisionScale(c.typmod); p != c.p || s != c.s || ok != c.bounded {
			t.Errorf("typmod %d: %d, %d, %v; want %d, %d, %v", c.typmod, p, s, ok, c.p, c.s, c.bounded)
		}
	}
}

// TestNumericUnknownDeclaration: without the column's type modifier (a row
// built by hand, or from a change event without Debezium's schema) a numeric
// is a Decimal of the value's own scale, without precision, as before the
// modifier was known; with it, what Debezium writes (golden cases 47-49).
func TestNumericUnknownDeclaration(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HeaderFormat = FormatJSONSchema
	cfg.AdditionalFields = []AdditionalField{{Column: "amount", Placement: PlaceHeader, Alias: "amount"}}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const vsd = `{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"},"payload":{"scale":1,"value":"fQ=="}}`
	for _, c := range []struct {
		name string
		col  Column
		want string
	}{
		{"unknown", Column{Value: []byte("12.50")},
			`{"schema":{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2"}},"payload":"BOI="}`},
		{"numeric", Column{Value: []byte("12.50"), TypeMod: NoTypeMod, HasTypeMod: true}, vsd},
		{"numeric(10,2)", Column{Value: []byte("12.50"), TypeMod: NumericTypeMod(10, 2), HasTypeMod: true},
			`{"schema":{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}},"payload":"BOI="}`},
		// A modifier that says nothing (no precision, no scale) is
		// Debezium's isVariableScaleDecimal too.
		{"typmod 4", Column{Value: []byte("12.50"), TypeMod: 4, HasTypeMod: true}, vsd},
	} {
		t.Run(c.name, func(t *testing.T) {
			row := orderRow(orderPayload)
			c.col.Name, c.col.Type = "amount", OIDNumeric
			row.Columns = append(row.Columns, c.col)
			rec, err := r.Route(context.Background(), row)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(rec.Headers[1].Value); got != c.want {
				t.Errorf("header\n got %s\nwant %s", got, c.want)
			}
		})
	}
	// NaN has no Decimal (decimal.handling.mode=precise fails on it).
	row := orderRow(orderPayload)
	row.Columns = append(row.Columns, Column{Name: "amount", Type: OIDNumeric, Value: []byte("NaN"), TypeMod: NoTypeMod, HasTypeMod: true})
	if _, err := r.Route(context.Background(), row); ClassOf(err) != ClassInvalidPayload {
		t.Fatalf("NaN: %v", err)
	}
}
