package cdc

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/route"
)

// mapRegistry serves schemas from memory, answering unknown ids as a
// Confluent registry does (404, error code 40403).
type mapRegistry map[int]string

func (m mapRegistry) SchemaByID(_ context.Context, id int) (sr.Schema, error) {
	s, ok := m[id]
	if !ok {
		return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, ErrorCode: sr.ErrSchemaNotFound.Code, Message: "schema not found"}
	}
	return sr.Schema{Schema: s, Type: sr.TypeAvro}, nil
}

// FuzzAvroDecode feeds arbitrary values (mutations of real change events)
// to the Avro decoder: it must not panic, hang or allocate beyond the input,
// and a value it accepts must make a well-formed row.
func FuzzAvroDecode(f *testing.F) {
	reg := mapRegistry{1: outboxTable.avroSchema(f), 2: typedTable.avroSchema(f), 3: textTable.avroSchema(f),
		// A recursive record and arrays: shapes Debezium does not send,
		// which the decoder must still survive.
		4: `{"type":"record","name":"E","fields":[{"name":"op","type":"string"},{"name":"source","type":{"type":"record","name":"S","fields":[]}},` +
			`{"name":"after","type":["null",{"type":"record","name":"V","fields":[{"name":"next","type":["null","V"]},{"name":"xs","type":{"type":"array","items":"null"}},{"name":"m","type":{"type":"map","values":"V"}}]}]}]}`,
	}
	ins := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"n": 1}`)
	f.Add(outboxTable.avroEvent(f, 1, ins))
	del := ins
	del.op, del.before, del.after = "d", ins.after, nil
	f.Add(outboxTable.avroEvent(f, 1, del))
	f.Add(typedTable.avroEvent(f, 2, typedInsert()))
	f.Add([]byte{0, 0, 0, 0, 4, 2, 'c', 2, 2, 0, 0x81, 0x80, 0x80, 0x80, 0x08, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 4, 2, 'c', 2, 2, 0, 0x01, 2, 0})
	f.Add([]byte{0, 0, 0, 0, 9})
	dec := NewAvroDecoder(reg)
	f.Fuzz(func(t *testing.T, value []byte) {
		row, err := dec.Decode(context.Background(), value)
		if err != nil {
			if row != nil {
				t.Fatalf("row %+v with error %v", row, err)
			}
			if !errors.Is(err, ErrTombstone) && route.ClassOf(err) == "" {
				t.Fatalf("error without a route class: %v", err)
			}
			return
		}
		for _, c := range row.Columns {
			if c.Null == (c.Value != nil) {
				t.Fatalf("column %s: null %v, value %q", c.Name, c.Null, c.Value)
			}
		}
	})
}

// FuzzDecodeJSON does the same for the JSON decoder.
func FuzzDecodeJSON(f *testing.F) {
	ins := outboxInsert("0b9e4c7a-0c55-4c1e-9c43-3d1f7b3c2a10", "Order", "42", `{"n": 1}`)
	f.Add(outboxTable.jsonEvent(f, ins))
	f.Add(typedTable.jsonEvent(f, typedInsert()))
	f.Add([]byte(`{"before":null,"after":{"id":"x","payload":"{}","n":1,"b":true},"source":{"lsn":5,"schema":"public","table":"outbox"},"op":"c","ts_ms":1}`))
	f.Add([]byte(`{"schema":{"type":"struct","fields":[{"field":"after","fields":[{"field":"a","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"-3"}}]}]},"payload":{"op":"c","after":{"a":1.5e3}}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		row, err := DecodeJSON(value, "payload")
		if err != nil {
			return
		}
		for _, c := range row.Columns {
			if c.Null == (c.Value != nil) {
				t.Fatalf("column %s: null %v, value %q", c.Name, c.Null, c.Value)
			}
		}
	})
}
