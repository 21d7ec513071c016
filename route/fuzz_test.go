package route

import (
	"context"
	"errors"
	"strings"
	"testing"
)

var fuzzTypes = []uint32{OIDJSONB, OIDJSON, OIDText, OIDVarchar, OIDBytea, OIDInt4, OIDInt8, OIDBool, OIDTimestamp,
	OIDTimestamptz, OIDNumeric, OIDFloat8, OIDFloat4, OIDUUID, OIDDate, OIDTime, OIDInt2}

// FuzzRoute routes arbitrary rows under arbitrary options: Route must never
// panic, and must return exactly one of a record with a valid topic and an
// *Error.
func FuzzRoute(f *testing.F) {
	f.Add("", "Order", "1", []byte(`{"a": 1}`), uint8(0), "", uint8(0), uint8(0))
	f.Add("route.topic.replacement=${routedByValue}.x\ntable.expand.json.payload=true\nvalue.converter=org.apache.kafka.connect.json.JsonConverter",
		"a_b", "k", []byte(`{"a": [{"b": 1}, {"c": [null, 2]}], "d": 1e400}`), uint8(0), "x:envelope,p:partition", uint8(5), uint8(1))
	f.Fuzz(func(t *testing.T, props, routeBy, key string, payload []byte, ptype uint8, extra string, extraType uint8, op uint8) {
		cfg, err := ParseProperties(strings.NewReader(props))
		if err != nil {
			cfg = DefaultConfig()
		}
		if af, err := ParseAdditionalFields(extra); err == nil {
			cfg.AdditionalFields = af
		}
		r, err := New(cfg)
		if err != nil {
			return
		}
		row := &Row{Op: Op(op % 5), Columns: []Column{
			{Name: "id", Type: OIDUUID, Value: []byte(key + "-id")},
			{Name: "aggregatetype", Type: OIDVarchar, Value: []byte(routeBy)},
			{Name: "aggregateid", Type: fuzzTypes[int(extraType)%len(fuzzTypes)], Value: []byte(key)},
			{Name: "payload", Type: fuzzTypes[int(ptype)%len(fuzzTypes)], Value: payload, Null: ptype > 200},
		}}
		for _, f := range cfg.AdditionalFields {
			c := Column{Name: f.Column, Type: fuzzTypes[int(extraType+ptype)%len(fuzzTypes)], Value: payload}
			// The declaration: unknown, none (numeric) or numeric(p,s).
			switch extraType % 3 {
			case 1:
				c.TypeMod, c.HasTypeMod = NoTypeMod, true
			case 2:
				c.TypeMod, c.HasTypeMod = NumericTypeMod(int(ptype)%40+1, int(extraType)%12), true
			}
			row.Columns = append(row.Columns, c)
		}
		rec, err := r.Route(context.Background(), row)
		if (rec == nil) == (err == nil) {
			t.Fatalf("Route returned %v, %v: want exactly one", rec, err)
		}
		if err != nil {
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *route.Error", err, err)
			}
			if dl := r.DeadLetter(row, "", err, "outbox.dlq"); dl == nil || dl.Value == nil {
				t.Fatal("no dead letter")
			}
			return
		}
		if err := ValidTopic(rec.Topic); err != nil {
			t.Fatalf("routed to an invalid topic: %v", err)
		}
		if _, err := RowFromMessage(payload, Source{Message: true}); err != nil && ClassOf(err) == "" {
			t.Fatalf("RowFromMessage error %T is not a *route.Error", err)
		}
	})
}
