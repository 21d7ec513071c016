package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	neturl "net/url"
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
	// The payload JSON read by the subject's latest version, not the
	// string schema derived for a jsonb column.
	cfg.Route.AvroUseLatestVersion, cfg.Route.AvroLatestCompatibilityStrict = true, false
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

// TestAvroRegistryFaults: the relay with Confluent's defaults
// (auto.register.schemas) against a real registry that goes down (a proxy
// in front of it refuses connections) while events of a new topic, whose
// schema is not registered yet, are written, then comes back: nothing is
// published or dead-lettered while it is down, and everything is after, in
// order, with the registered schema's id. Then a subject whose
// compatibility level refuses the derived schema: the line stops with an
// error naming the subject and what to do, nothing is dead-lettered, and
// it goes on once the operator changes the level.
func TestAvroRegistryFaults(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	url := testenv.StartRegistry(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, u.Host)
	proxied := *u
	proxied.Host = proxy.Addr
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	aggType, refused := uniqueType("avroDown"), uniqueType("avroRefused")
	topic, topic2, dlq := "outbox.event."+aggType, "outbox.event."+refused, "dlq."+aggType

	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.Route.ValueFormat = route.FormatAvro
	cfg.Route.RegistryURLs = []string{proxied.String()}
	cfg.DLQTopic = dlq
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, topic)
	c2 := testenv.StartConsumer(t, brokers, topic2)
	dc := testenv.StartConsumer(t, brokers, dlq)
	// Values decoded as a Confluent deserializer does: the registered
	// schema, the union's string branch holding the payload text.
	des := &avroDecoder{cl: cl, serde: sr.NewSerde(), known: map[int]bool{}}
	c.Decode = func(b []byte) (string, error) {
		_, v, err := des.decode(ctx, b)
		if err != nil {
			return "", err
		}
		m, ok := v.(map[string]any)
		text, ok2 := m["string"].(string)
		if !ok || !ok2 || len(m) != 1 {
			return "", fmt.Errorf("decoded %#v, not the optional string's branch", v)
		}
		return text, nil
	}
	c2.Decode = c.Decode
	run := startRelayWith(t, cfg)
	run.waitStreaming(t)
	deadLetters := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox_dead_letter").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n + dc.Count()
	}

	// Down before the topic's first event: its schema cannot be registered.
	proxy.Down()
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 60, 4, 5)
	time.Sleep(4 * time.Second)
	if n := c.Count(); n != 0 {
		t.Fatalf("%d records published while the registry was down", n)
	}
	if n := deadLetters(); n != 0 {
		t.Fatalf("%d dead letters while the registry was down; want none", n)
	}
	retries := metricValue(t, run, "outbox_connector_route_retries_total")
	if !strings.Contains(retries, "class="+string(route.ClassRegistry)) {
		t.Fatalf("outbox_connector_route_retries_total = %q while the registry was down; want class=%s", retries, route.ClassRegistry)
	}
	t.Logf("registry down 4 s: nothing published, nothing dead-lettered; retries: %s", retries)
	proxy.Up(t)
	w.Write(t, ctx, conn, aggType, 20, 4, 5)
	want := w.Snapshot()
	c.WaitFor(t, want, time.Minute)
	if dups := c.Verify(t, want); dups != 0 {
		t.Errorf("%d duplicates across a registry outage; want 0", dups)
	}
	ss, err := cl.SchemaByVersion(ctx, topic+"-value", -1)
	if err != nil {
		t.Fatal(err)
	}
	const jsonOptional = `["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]`
	if ss.Schema.Schema != jsonOptional || ss.Version != 1 {
		t.Errorf("registered version %d: %s; want version 1: %s", ss.Version, ss.Schema.Schema, jsonOptional)
	}
	for _, r := range c.Records() {
		if id, _, err := des.serde.DecodeID(r.Value); err != nil || id != ss.ID {
			t.Fatalf("record %s: schema id %d (%v); registered %d", testenv.Header(r, "id"), id, err, ss.ID)
		}
	}

	// A subject that refuses the derived schema: the line stops there.
	subject := topic2 + "-value"
	if _, err := cl.CreateSchema(ctx, subject, sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`}); err != nil {
		t.Fatal(err)
	}
	if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	w2 := testenv.NewWriter()
	w2.Write(t, ctx, conn, refused, 10, 2, 3)
	// Events after it, of the topic that works, wait behind it.
	w.Write(t, ctx, conn, aggType, 10, 4, 5)
	time.Sleep(3 * time.Second)
	if n := c2.Count(); n != 0 {
		t.Fatalf("%d records published under a subject that refuses their schema", n)
	}
	if n := deadLetters(); n != 0 {
		t.Fatalf("%d dead letters for a refused schema; want none", n)
	}
	if n := c.Count(); n != len(want) {
		t.Fatalf("%d records of %s, want the %d from before: the events after the refused one wait", n, topic, len(want))
	}
	if got := metricValue(t, run, "outbox_connector_route_retries_total"); !strings.Contains(got, "class="+string(route.ClassSchemaRejected)) {
		t.Fatalf("outbox_connector_route_retries_total = %q; want class=%s", got, route.ClassSchemaRejected)
	}
	if res := cl.SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatNone}, subject); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	c2.WaitFor(t, w2.Snapshot(), time.Minute)
	all := w.Snapshot()
	c.WaitFor(t, all, time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if dups := c.Verify(t, all) + c2.Verify(t, w2.Snapshot()); dups != 0 {
		t.Errorf("%d duplicates; want 0", dups)
	}
	if n := deadLetters(); n != 0 {
		t.Errorf("%d dead letters; want none", n)
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
