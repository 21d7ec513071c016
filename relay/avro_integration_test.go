package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/route"
)

// testedSchema is the Avro schema of testenv.Writer's payloads.
const testedSchema = `{"type": "record", "name": "Tested", "namespace": "pgoutbox.test",
  "fields": [{"name": "agg", "type": "string"}, {"name": "seq", "type": "int"}]}`

// startRelayWith runs a relay whose router is built from cfg.Route (startRelay
// uses the router's defaults).
func startRelayWith(t testing.TB, cfg config.Config) *running {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	router, err := route.NewContext(ctx, cfg.Route)
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelInfo
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	m := metrics.New()
	r := New(cfg, router, log, m)
	rctx, rcancel := context.WithCancel(context.Background())
	run := &running{cancel: rcancel, done: make(chan error, 1), relay: r, m: m}
	go func() { run.done <- r.Run(rctx) }()
	t.Cleanup(func() { _ = run.stop(t) })
	return run
}

// TestAvroPoisonToDLQ: with the Avro value format against a real schema
// registry (Apicurio, Confluent API), events that conform to their topic's
// schema arrive in the Confluent wire format, decodable with the schema the
// registry returns for the record's id; an event that does not conform (in
// its own transaction, and one in the middle of a transaction of conforming
// events) goes whole to the DLQ topic with error.class=schema and the Avro
// validation error, and the events after it flow on.
func TestAvroPoisonToDLQ(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	url := testenv.StartRegistry(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("avro")
	topic, dlq := "outbox.event."+aggType, "dlq."+aggType

	// The topic's schema is registered up front, as an operator would; the
	// router looks it up on first use.
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeAvro, Schema: testedSchema})
	if err != nil {
		t.Fatalf("register the schema of %s: %v", topic, err)
	}

	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.Route.ValueFormat = route.FormatAvro
	cfg.Route.RegistryURLs = []string{url}
	cfg.DLQTopic = dlq
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, topic)
	dc := testenv.StartConsumer(t, brokers, dlq)
	run := startRelayWith(t, cfg)
	run.waitStreaming(t)

	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 40, 4, 5)
	bad := []struct{ id, aggID, payload string }{
		{uuid.NewString(), "bad-1", `{"agg": "bad-1", "seq": "one"}`}, // wrong type
		{uuid.NewString(), "bad-2", `{"agg": "bad-2"}`},               // missing field
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Bad', $4)`,
		bad[0].id, aggType, bad[0].aggID, bad[0].payload); err != nil {
		t.Fatal(err)
	}
	// A transaction with the second bad event between conforming ones.
	mixed := []testenv.Event{
		{ID: uuid.NewString(), AggType: aggType, AggID: "mixed", Type: "Tested", Seq: 1, Payload: `{"agg": "mixed", "seq": 1}`},
		{ID: uuid.NewString(), AggType: aggType, AggID: "mixed", Type: "Tested", Seq: 2, Payload: `{"agg": "mixed", "seq": 2}`},
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ id, aggID, payload string }{
		{mixed[0].ID, mixed[0].AggID, mixed[0].Payload}, bad[1], {mixed[1].ID, mixed[1].AggID, mixed[1].Payload},
	} {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Tested', $4)`,
			r.id, aggType, r.aggID, r.payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 40, 4, 5)
	want := append(w.Snapshot(), mixed...)

	c.WaitFor(t, want, time.Minute)
	dc.WaitFor(t, []testenv.Event{{ID: bad[0].id}, {ID: bad[1].id}}, time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}

	// Conforming events: Avro in the Confluent wire format, the registered
	// schema's id, the payload's values; per aggregate in commit order.
	des := &avroDecoder{cl: cl, serde: sr.NewSerde(), known: map[int]bool{}}
	byID := map[string]testenv.Event{}
	for _, e := range want {
		byID[e.ID] = e
	}
	seen := map[string]bool{}
	lastSeq := map[string]int{}
	for _, r := range c.Records() {
		id := testenv.Header(r, "id")
		if id == bad[0].id || id == bad[1].id {
			t.Errorf("the non-conforming event %s reached %s", id, r.Topic)
			continue
		}
		e, ok := byID[id]
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		sid, v, err := des.decode(ctx, r.Value)
		if err != nil {
			t.Errorf("event %s: value %x is not decodable: %v", id, r.Value, err)
			continue
		}
		var p struct {
			Agg string `json:"agg"`
			Seq int32  `json:"seq"`
		}
		if err := json.Unmarshal([]byte(e.Payload), &p); err != nil {
			t.Fatal(err)
		}
		if wantV := map[string]any{"agg": p.Agg, "seq": p.Seq}; sid != ss.ID || !reflect.DeepEqual(v, wantV) || string(r.Key) != e.AggID {
			t.Errorf("event %s: schema id %d, key %s, value %#v; want id %d, key %s, %#v", id, sid, r.Key, v, ss.ID, e.AggID, wantV)
		}
		if e.Seq <= lastSeq[e.AggID] {
			t.Errorf("aggregate %s: seq %d delivered after seq %d", e.AggID, e.Seq, lastSeq[e.AggID])
		}
		lastSeq[e.AggID] = e.Seq
	}
	if len(seen) != len(want) {
		t.Errorf("%d distinct conforming events delivered, want %d", len(seen), len(want))
	}

	// The non-conforming events: whole in the DLQ topic, with the reason.
	for _, b := range bad {
		var found bool
		for _, r := range dc.Records() {
			if testenv.Header(r, "id") != b.id {
				continue
			}
			found = true
			if got := testenv.Header(r, "error.class"); got != string(route.ClassSchema) {
				t.Errorf("event %s: DLQ error.class %q, want %q", b.id, got, route.ClassSchema)
			}
			if e := testenv.Header(r, "error"); !strings.Contains(e, "does not conform to the Avro schema") || !strings.Contains(e, topic+"-value") {
				t.Errorf("event %s: DLQ error %q does not give the Avro validation error", b.id, e)
			}
			var row map[string]*string
			if err := json.Unmarshal(r.Value, &row); err != nil {
				t.Fatalf("DLQ value %s: %v", r.Value, err)
			}
			if row["id"] == nil || *row["id"] != b.id || row["aggregateid"] == nil || *row["aggregateid"] != b.aggID ||
				row["aggregatetype"] == nil || *row["aggregatetype"] != aggType || row["payload"] == nil || !sameJSON(*row["payload"], b.payload) {
				t.Errorf("event %s: DLQ value does not hold the row whole: %s", b.id, r.Value)
			}
			t.Logf("DLQ record: error.class=%s error=%q topic=%q value=%s", testenv.Header(r, "error.class"), testenv.Header(r, "error"), testenv.Header(r, "topic"), r.Value)
		}
		if !found {
			t.Errorf("the non-conforming event %s is not in the DLQ topic %s", b.id, dlq)
		}
	}
	if got := metricValue(t, run, "outbox_connector_events_dead_lettered_total"); !strings.Contains(got, "class=schema") || !strings.Contains(got, ":2") {
		t.Errorf("outbox_connector_events_dead_lettered_total = %q; want 2 with class=schema", got)
	}
}

// avroDecoder decodes values as a Confluent Avro deserializer does: the
// schema id from the wire-format header (franz-go's sr.Serde), the writer's
// schema fetched from the registry by id, the datum decoded with it.
type avroDecoder struct {
	cl    *sr.Client
	serde *sr.Serde
	known map[int]bool
}

func (d *avroDecoder) decode(ctx context.Context, b []byte) (int, any, error) {
	id, _, err := d.serde.DecodeID(b)
	if err != nil {
		return 0, nil, err
	}
	if !d.known[id] {
		s, err := d.cl.SchemaByID(ctx, id)
		if err != nil {
			return id, nil, fmt.Errorf("schema id %d: %w", id, err)
		}
		codec, err := goavro.NewCodec(s.Schema)
		if err != nil {
			return id, nil, err
		}
		d.serde.Register(id, (*any)(nil), sr.DecodeFn(func(b []byte, v any) error {
			native, rest, err := codec.NativeFromBinary(b)
			if err == nil && len(rest) != 0 {
				err = fmt.Errorf("%d bytes after the datum", len(rest))
			}
			*v.(*any) = native
			return err
		}))
		d.known[id] = true
	}
	var v any
	err = d.serde.Decode(b, &v)
	return id, v, err
}

func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}
