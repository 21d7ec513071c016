package route

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// confluentDeserializer decodes record values as a standard Confluent Avro
// deserializer does, knowing nothing of the router: franz-go's sr.Serde reads
// the wire-format header (magic byte 0, big-endian schema id), the writer's
// schema is fetched from the registry by that id, and the Avro binary datum
// is decoded with it by a plain goavro codec.
type confluentDeserializer struct {
	cl    *sr.Client
	serde *sr.Serde

	mu  sync.Mutex
	ids map[int]bool
}

func newConfluentDeserializer(cl *sr.Client) *confluentDeserializer {
	return &confluentDeserializer{cl: cl, serde: sr.NewSerde(), ids: map[int]bool{}}
}

// decode returns the schema id and the decoded datum.
func (d *confluentDeserializer) decode(ctx context.Context, b []byte) (int, any, error) {
	id, _, err := d.serde.DecodeID(b)
	if err != nil {
		return 0, nil, fmt.Errorf("not the Confluent wire format: %w", err)
	}
	d.mu.Lock()
	known := d.ids[id]
	d.mu.Unlock()
	if !known {
		s, err := d.cl.SchemaByID(ctx, id)
		if err != nil {
			return id, nil, fmt.Errorf("fetch schema id %d from the registry: %w", id, err)
		}
		if s.Type != sr.TypeAvro {
			return id, nil, fmt.Errorf("schema id %d is %s, not Avro", id, s.Type)
		}
		codec, err := goavro.NewCodec(s.Schema)
		if err != nil {
			return id, nil, fmt.Errorf("schema id %d: %w", id, err)
		}
		d.serde.Register(id, (*any)(nil), sr.DecodeFn(func(b []byte, v any) error {
			native, rest, err := codec.NativeFromBinary(b)
			if err != nil {
				return err
			}
			if len(rest) != 0 {
				return fmt.Errorf("%d bytes left after the Avro datum", len(rest))
			}
			*v.(*any) = native
			return nil
		}))
		d.mu.Lock()
		d.ids[id] = true
		d.mu.Unlock()
	}
	var v any
	if err := d.serde.Decode(b, &v); err != nil {
		return id, nil, fmt.Errorf("decode with schema id %d: %w", id, err)
	}
	return id, v, nil
}

// TestAvroRealRegistry runs the Avro value format against a real
// Confluent-API registry (Apicurio Registry, scripts/registry.sh) and the real
// Kafka broker: the schema is registered under <topic>-value, records go
// through Kafka and come back decodable by a Confluent deserializer with the
// schema fetched by id, a restart re-registers without a new version, a
// subject registered by someone else is looked up, and poison is ClassSchema.
func TestAvroRealRegistry(t *testing.T) {
	url := testenv.StartRegistry(t)
	brokers := testenv.SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType := "Order" + suffix
	topic := "outbox.event." + aggType
	subject := topic + "-value"

	cfg := DefaultConfig()
	cfg.ValueFormat = FormatAvro
	cfg.RegistryURLs = []string{url}
	cfg.AvroSchemas = map[string]string{subject: orderSchema}
	// Subjects registered by hand, and their payload JSON read by their
	// latest version (not the string schema Confluent derives for a jsonb
	// column): use.latest.version without the strict check.
	cfg.AvroUseLatestVersion, cfg.AvroLatestCompatibilityStrict = true, false
	r, err := NewContext(ctx, cfg)
	if err != nil {
		t.Fatalf("router with a real registry at %s: %v", url, err)
	}
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	des := newConfluentDeserializer(cl)

	row := func(aggID, payload string) *Row {
		rw := orderRow(payload)
		rw.Columns[0].Value = []byte(uuid.NewString())
		rw.Columns[1].Value = []byte(aggType)
		rw.Columns[2].Value = []byte(aggID)
		return rw
	}

	var registeredID int
	t.Run("schema registered under topic-value", func(t *testing.T) {
		subjects, err := cl.Subjects(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(subjects, subject) {
			t.Fatalf("subjects %v; want %q among them", subjects, subject)
		}
		ss, err := cl.SchemaByVersion(ctx, subject, -1)
		if err != nil {
			t.Fatal(err)
		}
		if ss.Type != sr.TypeAvro || ss.Version != 1 {
			t.Fatalf("subject %q: type %s version %d; want AVRO version 1", subject, ss.Type, ss.Version)
		}
		if got, want := canonical(t, ss.Schema.Schema), canonical(t, orderSchema); got != want {
			t.Fatalf("registered schema\n%s\nwant\n%s", got, want)
		}
		registeredID = ss.ID
		t.Logf("subject %s: id %d, version %d", subject, ss.ID, ss.Version)
	})

	t.Run("round trip through Kafka", func(t *testing.T) {
		want := []struct {
			key, payload string
			value        map[string]any
		}{
			{"1", orderPayload, map[string]any{
				"id": int32(1), "orderDate": "2019-01-31T12:13:01", "customerId": int64(123),
				"note":      map[string]any{"string": "gift"},
				"lineItems": []any{map[string]any{"id": int32(1), "item": "Debezium in Action", "status": "ENTERED", "quantity": int32(2), "totalPrice": 39.98}},
			}},
			{"2", `{"id": 2, "lineItems": [], "orderDate": "2019-02-01T00:00:00", "customerId": 9007199254740993, "note": null}`, map[string]any{
				"id": int32(2), "orderDate": "2019-02-01T00:00:00", "customerId": int64(9007199254740993),
				"note": nil, "lineItems": []any{},
			}},
			// "note" left out: the schema's default (null).
			{"3", `{"id": 3, "lineItems": [{"id": 7, "item": "ünïcödé ✓", "status": "SHIPPED", "quantity": 1, "totalPrice": 0.5}], "orderDate": "", "customerId": -1}`, map[string]any{
				"id": int32(3), "orderDate": "", "customerId": int64(-1), "note": nil,
				"lineItems": []any{map[string]any{"id": int32(7), "item": "ünïcödé ✓", "status": "SHIPPED", "quantity": int32(1), "totalPrice": 0.5}},
			}},
		}
		kc, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.RecordPartitioner(Partitioner()),
			kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		if _, err := kadm.NewClient(kc).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatalf("create topic %s: %v", topic, err)
		}
		for _, w := range want {
			rec, err := r.Route(ctx, row(w.key, w.payload))
			if err != nil {
				t.Fatalf("route %s: %v", w.payload, err)
			}
			if err := kc.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
		}
		var got []*kgo.Record
		for len(got) < len(want) && ctx.Err() == nil {
			fs := kc.PollFetches(ctx)
			if err := fs.Err0(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("consume: %v", err)
			}
			got = append(got, fs.Records()...)
		}
		if len(got) != len(want) {
			t.Fatalf("consumed %d records, want %d", len(got), len(want))
		}
		for i, rec := range got {
			id, v, err := des.decode(ctx, rec.Value)
			if err != nil {
				t.Fatalf("record %d (key %s): %v", i, rec.Key, err)
			}
			if id != registeredID {
				t.Errorf("record %d: schema id %d, registered %d", i, id, registeredID)
			}
			if string(rec.Key) != want[i].key || !reflect.DeepEqual(v, want[i].value) {
				t.Errorf("record %d: key %s, decoded %#v\nwant key %s, %#v", i, rec.Key, v, want[i].key, want[i].value)
			}
		}
	})

	t.Run("restart registers the same schema again", func(t *testing.T) {
		r2, err := NewContext(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := r2.Route(ctx, row("1", orderPayload))
		if err != nil {
			t.Fatal(err)
		}
		if id, _, err := des.decode(ctx, rec.Value); err != nil || id != registeredID {
			t.Fatalf("after a restart: schema id %d (%v), want %d", id, err, registeredID)
		}
		if vs, err := cl.SubjectVersions(ctx, subject); err != nil || len(vs) != 1 {
			t.Fatalf("versions of %s: %v (%v); want one", subject, vs, err)
		}
	})

	t.Run("looks up a subject registered by someone else", func(t *testing.T) {
		other := "outbox.event.Customer" + suffix
		ss, err := cl.CreateSchema(ctx, other+"-value", sr.Schema{Type: sr.TypeAvro,
			Schema: `{"type":"record","name":"Customer","namespace":"shop","fields":[{"name":"name","type":"string"},{"name":"vip","type":"boolean","default":false}]}`})
		if err != nil {
			t.Fatal(err)
		}
		rw := orderRow(`{"name": "Jane"}`)
		rw.Columns[1].Value = []byte("Customer" + suffix)
		rec, err := r.Route(ctx, rw)
		if err != nil {
			t.Fatal(err)
		}
		id, v, err := des.decode(ctx, rec.Value)
		if err != nil || id != ss.ID || !reflect.DeepEqual(v, map[string]any{"name": "Jane", "vip": false}) {
			t.Fatalf("id %d (registered %d), %#v, %v", id, ss.ID, v, err)
		}
	})

	// Subjects as Confluent's AvroConverter registers them for Debezium's
	// outbox (every event of the first was a dead letter before), and a
	// union of numbers, at the real registry and back through its API.
	t.Run("Debezium's io.debezium.data.Json subject and number unions", func(t *testing.T) {
		const jsonString = `{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}`
		for _, tc := range []struct {
			name, schema, payload string
			want                  any
		}{
			{"Json" + suffix, jsonString, orderPayload, orderPayload},
			{"OptionalJson" + suffix, `["null",` + jsonString + `]`, `{"ü": "𝄞"}`, map[string]any{"string": `{"ü": "𝄞"}`}},
			{"Number" + suffix, `{"type":"record","name":"N","fields":[{"name":"n","type":["null","long","double"]}]}`,
				`{"n": 9007199254740993}`, map[string]any{"n": map[string]any{"long": int64(9007199254740993)}}},
		} {
			ss, err := cl.CreateSchema(ctx, "outbox.event."+tc.name+"-value", sr.Schema{Type: sr.TypeAvro, Schema: tc.schema})
			if err != nil {
				t.Fatal(err)
			}
			rw := row("1", tc.payload)
			rw.Columns[1].Value = []byte(tc.name)
			rec, err := r.Route(ctx, rw)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			id, v, err := des.decode(ctx, rec.Value)
			if err != nil || id != ss.ID || !reflect.DeepEqual(v, tc.want) {
				t.Errorf("%s: id %d (registered %d), %#v, %v; want %#v", tc.name, id, ss.ID, v, err, tc.want)
			}
		}
		rw := row("1", `{"n": 123456789012345678901234567890}`)
		rw.Columns[1].Value = []byte("Number" + suffix)
		if _, err := r.Route(ctx, rw); ClassOf(err) != ClassSchema || !strings.Contains(err.Error(), "exactly") {
			t.Errorf("a number no branch holds exactly: %v; want a dead letter saying so", err)
		}
	})

	t.Run("poison is ClassSchema, a subject without a version waits", func(t *testing.T) {
		_, err := r.Route(ctx, row("1", `{"id": "one"}`))
		var re *Error
		if !errors.As(err, &re) || re.Class != ClassSchema || re.Err == nil || IsRetryable(err) {
			t.Fatalf("non-conforming payload: %v", err)
		}
		t.Logf("non-conforming payload: %v", err)
		// A subject with no version to use is the registry's state, not
		// the row's: the row waits for one, never a dead letter.
		rw := orderRow(`{}`)
		rw.Columns[1].Value = []byte("Unregistered" + suffix)
		_, err = r.Route(ctx, rw)
		if ClassOf(err) != ClassSchemaRejected || !IsRetryable(err) {
			t.Fatalf("subject without a schema at a real registry: %v (class %q)", err, ClassOf(err))
		}
		t.Logf("subject without a schema: %v", err)
	})
}

// TestAvroRealRegistryAutoRegister: with the defaults Confluent's
// AvroConverter has (auto.register.schemas=true, TopicNameStrategy), a real
// registry with no subject for the topic gets the schema AvroConverter
// derives for Debezium's outbox payload (an optional io.debezium.data.Json
// string; a record with table.expand.json.payload), once, and the records
// carry its id; a subject whose compatibility level refuses that schema
// stops the event with a clear, retryable error (never a dead letter)
// until the operator changes the level.
func TestAvroRealRegistryAutoRegister(t *testing.T) {
	url := testenv.StartRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	des := newConfluentDeserializer(cl)
	router := func(mod func(*Config)) *Router {
		cfg := DefaultConfig()
		cfg.ValueFormat = FormatAvro
		cfg.RegistryURLs = []string{url}
		if mod != nil {
			mod(&cfg)
		}
		r, err := NewContext(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	row := func(aggType, payload string) *Row {
		rw := orderRow(payload)
		rw.Columns[0].Value = []byte(uuid.NewString())
		rw.Columns[1].Value = []byte(aggType)
		return rw
	}

	t.Run("an empty subject gets Debezium's payload schema", func(t *testing.T) {
		aggType := "Auto" + suffix
		subject := "outbox.event." + aggType + "-value"
		r := router(nil)
		payloads := []string{orderPayload, `{"ü": "𝄞", "n": 9007199254740993}`}
		for _, p := range payloads {
			rec, err := r.Route(ctx, row(aggType, p))
			if err != nil {
				t.Fatal(err)
			}
			ss, err := cl.SchemaByVersion(ctx, subject, -1)
			if err != nil {
				t.Fatalf("nothing registered under %s: %v", subject, err)
			}
			if ss.Schema.Schema != debeziumJSONOptional {
				t.Fatalf("registered %s\nwant %s", ss.Schema.Schema, debeziumJSONOptional)
			}
			id, v, err := des.decode(ctx, rec.Value)
			if err != nil || id != ss.ID || !reflect.DeepEqual(v, map[string]any{"string": p}) {
				t.Fatalf("id %d (registered %d), %#v, %v; want the payload text", id, ss.ID, v, err)
			}
		}
		if vs, err := cl.SubjectVersions(ctx, subject); err != nil || len(vs) != 1 {
			t.Fatalf("versions of %s: %v (%v); want one", subject, vs, err)
		}
	})

	t.Run("an expanded payload registers its record", func(t *testing.T) {
		aggType := "Expanded" + suffix
		r := router(func(c *Config) { c.ExpandJSONPayload = true })
		rec, err := r.Route(ctx, row(aggType, `{"id": 7, "name": "Jane", "tags": ["a", "b"], "price": 1.5}`))
		if err != nil {
			t.Fatal(err)
		}
		ss, err := cl.SchemaByVersion(ctx, "outbox.event."+aggType+"-value", -1)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("registered: %s", ss.Schema.Schema)
		_, v, err := des.decode(ctx, rec.Value)
		want := map[string]any{"payload": map[string]any{
			"id":    map[string]any{"int": int32(7)},
			"name":  map[string]any{"string": "Jane"},
			"tags":  map[string]any{"array": []any{map[string]any{"string": "a"}, map[string]any{"string": "b"}}},
			"price": map[string]any{"double": 1.5},
		}}
		if err != nil || !reflect.DeepEqual(v, want) {
			t.Fatalf("decoded %#v, %v\nwant %#v", v, err, want)
		}
	})

	t.Run("an incompatible subject stops the event until its level changes", func(t *testing.T) {
		aggType := "Incompatible" + suffix
		subject := "outbox.event." + aggType + "-value"
		if _, err := cl.CreateSchema(ctx, subject, sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`}); err != nil {
			t.Fatal(err)
		}
		if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		r := router(nil)
		for i := 0; i < 2; i++ {
			_, err := r.Route(ctx, row(aggType, orderPayload))
			if ClassOf(err) != ClassSchemaRejected || !IsRetryable(err) || !strings.Contains(err.Error(), "incompatible") {
				t.Fatalf("attempt %d: %v (class %q); want a retryable ClassSchemaRejected saying incompatible", i, err, ClassOf(err))
			}
			t.Logf("refused: %v", err)
		}
		if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}, subject); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		rec, err := r.Route(ctx, row(aggType, orderPayload))
		if err != nil {
			t.Fatalf("after the level changed: %v", err)
		}
		if _, v, err := des.decode(ctx, rec.Value); err != nil || !reflect.DeepEqual(v, map[string]any{"string": orderPayload}) {
			t.Fatalf("decoded %#v, %v", v, err)
		}
	})
}

func canonical(t testing.TB, schema string) string {
	t.Helper()
	c, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	return c.CanonicalSchema()
}
