package cdc

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/route"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the routed JSON change events")

// goldenOutput is what the router made of one change event.
type goldenOutput struct {
	Name       string `json:"name"`
	Properties string `json:"properties"`
	// Skipped is the error class of an event the router drops.
	Skipped route.ErrorClass `json:"skipped,omitempty"`
	Record  *goldenRecord    `json:"record,omitempty"`
}

type goldenRecord struct {
	Topic string  `json:"topic"`
	Key   *string `json:"key"`
	// Value is the value as text, or "hex:..." when it is not UTF-8.
	Value       *string      `json:"value"`
	Headers     [][2]*string `json:"headers"`
	TimestampMS int64        `json:"timestamp_ms"`
	Partition   int32        `json:"partition"`
}

func text(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	if !utf8.ValidString(s) {
		s = "hex:" + hex.EncodeToString(b)
	}
	return &s
}

func goldenOf(name, props string, rec *kgo.Record, err error) (goldenOutput, error) {
	out := goldenOutput{Name: name, Properties: props}
	if err != nil {
		if !errors.Is(err, route.ErrSkip) {
			return out, err
		}
		out.Skipped = route.ClassOf(err)
		return out, nil
	}
	g := &goldenRecord{Topic: rec.Topic, Key: text(rec.Key), Value: text(rec.Value), TimestampMS: rec.Timestamp.UnixMilli(), Partition: rec.Partition}
	for _, h := range rec.Headers {
		k := h.Key
		g.Headers = append(g.Headers, [2]*string{&k, text(h.Value)})
	}
	out.Record = g
	return out, nil
}

const (
	jsonValues  = "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=true\n"
	jsonHeaders = "header.converter=org.apache.kafka.connect.json.JsonConverter\nheader.converter.schemas.enable=true\n"
)

// TestJSONAvroEquivalence decodes the same Debezium change event as the
// JsonConverter (schemas enabled) and as the AvroConverter wrote it, routes
// both with the same router settings, and requires identical records,
// equal to testdata/golden/<case>.json. The settings place typed columns in
// headers and in the envelope with Connect schemas, so a column whose type
// came out differently in the two decoders shows in the record.
func TestJSONAvroEquivalence(t *testing.T) {
	reg := newFakeRegistry(t)
	dec := NewAvroDecoder(reg.cl)
	ids := map[string]int{}
	for _, tbl := range []ctable{outboxTable, typedTable, textTable} {
		ids[tbl.table] = reg.register(t, tbl.ns()+"-value", tbl.avroSchema(t))
	}
	ins := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"id": 42, "lines": [{"sku": "A-1", "qty": 2}], "note": "\"quoted\" é"}`)
	upd := ins
	upd.op, upd.before = "u", ins.after
	del := ins
	del.op, del.before, del.after = "d", ins.after, nil
	read := ins
	read.op, read.snapshot = "r", "last"
	null := outboxInsert("1c9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a11", "Order", "43", "")
	typed := typedInsert()
	typedNulls := typedInsert()
	for _, k := range []string{"note", "priority", "urgent", "amount", "due", "ratio", "meta"} {
		typedNulls.after[k] = nil
	}
	textEv := cevent{op: "c", lsn: 7, sourceTsMs: commitMs, tsMs: processMs, after: map[string]any{
		"id": "9d4c2a1b-6e3f-4a8b-b7c6-5d4e3f2a1b0c", "aggregatetype": "Note", "aggregateid": "n1", "type": "Said", "payload": "plain text, not JSON"}}
	typedProps := "table.fields.additional.placement=occurred_at:header,version:header,seq:header,priority:header,urgent:header,amount:header,due:header,ratio:header,meta:header,created_at:header,note:header:remark,id:envelope:eventId\ntable.field.event.timestamp=occurred_at\n"

	for _, tc := range []struct {
		name  string
		tbl   ctable
		ev    cevent
		props string
	}{
		{"outbox_jsonb_string_converter", outboxTable, ins, ""},
		{"outbox_jsonb_json_schema_envelope", outboxTable, ins, jsonValues + jsonHeaders + "table.fields.additional.placement=type:envelope:eventType,created_at:envelope,created_at:header\nroute.topic.replacement=${routedByValue}.events\n"},
		{"outbox_jsonb_expand_payload", outboxTable, ins, jsonValues + "table.expand.json.payload=true\n"},
		{"outbox_snapshot_read", outboxTable, read, ""},
		{"outbox_update_skipped", outboxTable, upd, ""},
		{"outbox_delete_skipped", outboxTable, del, ""},
		{"outbox_null_payload_tombstone", outboxTable, null, "route.tombstone.on.empty.payload=true\n"},
		{"typed_bytea_payload_string_headers", typedTable, typed, typedProps},
		{"typed_bytea_payload_json_schema_headers", typedTable, typed, jsonHeaders + typedProps},
		{"typed_envelope_json_schema", typedTable, typed, jsonValues + "table.fields.additional.placement=occurred_at:envelope,version:envelope,seq:envelope,priority:envelope,urgent:envelope,amount:envelope,due:envelope,ratio:envelope,meta:envelope,created_at:envelope,id:envelope:eventId,version:partition\n"},
		{"typed_nulls_json_schema_headers", typedTable, typedNulls, jsonHeaders + typedProps},
		{"text_payload_string_converter", textTable, textEv, ""},
		{"text_payload_json_converter", textTable, textEv, "value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := route.ParseProperties(strings.NewReader(tc.props))
			if err != nil {
				t.Fatal(err)
			}
			router, err := route.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			jsonRow, err := DecodeJSON(tc.tbl.jsonEvent(t, tc.ev), cfg.FieldPayload)
			if err != nil {
				t.Fatalf("JSON: %v", err)
			}
			avroRow, err := dec.Decode(ctx, tc.tbl.avroEvent(t, ids[tc.tbl.table], tc.ev))
			if err != nil {
				t.Fatalf("Avro: %v", err)
			}
			rec, err := router.Route(ctx, jsonRow)
			fromJSON, err := goldenOf(tc.name, tc.props, rec, err)
			if err != nil {
				t.Fatalf("routing the JSON event: %v", err)
			}
			rec, err = router.Route(ctx, avroRow)
			fromAvro, err := goldenOf(tc.name, tc.props, rec, err)
			if err != nil {
				t.Fatalf("routing the Avro event: %v", err)
			}
			j, _ := json.MarshalIndent(fromJSON, "", " ")
			a, _ := json.MarshalIndent(fromAvro, "", " ")
			if string(j) != string(a) {
				t.Fatalf("the JSON and the Avro change event route differently:\nJSON: %s\nAvro: %s", j, a)
			}
			path := filepath.Join("testdata", "golden", tc.name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, append(j, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if strings.TrimSpace(string(want)) != string(j) {
				t.Fatalf("routed record differs from %s:\n got %s\nwant %s", path, j, want)
			}
		})
	}
}
