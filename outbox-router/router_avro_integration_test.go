package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// avroChangeEvents writes Debezium change events for the outbox table as
// Debezium's AvroConverter does: the envelope schema (cdc/testdata/outbox.avsc,
// written from Confluent's AvroData rules; see cdc/debezium_test.go) is
// registered under <topic>-value, and each value is byte 0, the schema id (4
// bytes big-endian) and the Avro binary datum.
type avroChangeEvents struct {
	id    int
	codec *goavro.Codec
}

func newAvroChangeEvents(t *testing.T, ctx context.Context, registryURL, subject string) *avroChangeEvents {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("cdc", "testdata", "outbox.avsc"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sr.NewClient(sr.URLs(registryURL))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: string(text), Type: sr.TypeAvro})
	if err != nil {
		t.Fatalf("register the envelope schema under %s at %s: %v", subject, registryURL, err)
	}
	codec, err := goavro.NewCodec(string(text))
	if err != nil {
		t.Fatal(err)
	}
	return &avroChangeEvents{id: ss.ID, codec: codec}
}

func (a *avroChangeEvents) event(t *testing.T, op, id, aggType, aggID, payload string, lsn int) []byte {
	t.Helper()
	row := goavro.Union("dbserver1.public.outbox.Value", map[string]any{
		"id": id, "aggregatetype": aggType, "aggregateid": aggID, "type": "Created",
		"payload": goavro.Union("string", payload), "created_at": "2025-11-30T10:00:00.000000Z",
	})
	before, after := any(nil), row
	if op == "d" {
		before, after = row, nil
	}
	long := func(n int64) any { return goavro.Union("long", n) }
	datum := map[string]any{
		"before": before, "after": after,
		"source": map[string]any{
			"version": "3.6.1.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": int64(1764496800000),
			"snapshot": goavro.Union("string", "false"), "db": "app", "sequence": goavro.Union("string", fmt.Sprintf(`[null,"%d"]`, lsn)),
			"ts_us": long(1764496800000000), "ts_ns": long(1764496800000000000), "schema": "public", "table": "outbox",
			"txId": long(int64(1000 + lsn)), "lsn": long(int64(lsn)), "xmin": nil,
		},
		"transaction": nil, "op": op,
		"ts_ms": long(1764496800123), "ts_us": long(1764496800123000), "ts_ns": long(1764496800123000000),
	}
	out, err := a.codec.BinaryFromNative(binary.BigEndian.AppendUint32([]byte{0}, uint32(a.id)), datum)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAvroChangeEvents routes a topic of Avro change events (with a JSON one
// among them, told apart by its first byte) against the real broker and the
// real schema registry. While the registry is unreachable the router retries
// and routes nothing, dead-letters nothing; then, with a kill -9 between
// two halves of the topic, a read_committed consumer sees every outbox
// insert exactly once with the right topic, key, value and id header;
// deletes and tombstones are skipped; a record of an unknown schema id and a record whose datum does
// not decode are dead letters kept byte for byte, and the line goes on.
func TestAvroChangeEvents(t *testing.T) {
	registryURL := testenv.StartRegistry(t)
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "outbox-router")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	source := "dbserver1.public.outbox.avro" + suffix
	aggType := "avro" + suffix
	dlq := "outbox.dlq.avro" + suffix
	events := newAvroChangeEvents(t, ctx, registryURL, source+"-value")

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(source))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, source); err != nil {
		t.Fatal(err)
	}
	type want struct{ aggID, payload string }
	inserts := map[string]want{}
	var recs []*kgo.Record
	var poison [][]byte
	const n = 3000
	for i := 0; i < n; i++ {
		id := uuid.NewString()
		aggID := fmt.Sprint(i % 40)
		payload := fmt.Sprintf(`{"n": %d, "s": "é\"\\"}`, i)
		switch {
		case i%25 == 24:
			// A delete, then Debezium's tombstone for it.
			recs = append(recs,
				&kgo.Record{Key: []byte(id), Value: events.event(t, "d", id, aggType, aggID, payload, i)},
				&kgo.Record{Key: []byte(id)})
			continue
		case i == 700:
			// A JSON change event in the same topic.
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: changeEvent("c", id, aggType, aggID, i)})
			inserts[id] = want{aggID, fmt.Sprintf(`{"n": %d}`, i)}
			continue
		case i == 1200:
			// A schema id the registry does not know.
			v := events.event(t, "c", id, aggType, aggID, payload, i)
			binary.BigEndian.PutUint32(v[1:5], 0x7ffffff0)
			poison = append(poison, v)
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: v})
			continue
		case i == 1800:
			// A datum cut short.
			v := events.event(t, "c", id, aggType, aggID, payload, i)
			v = v[:len(v)/2]
			poison = append(poison, v)
			recs = append(recs, &kgo.Record{Key: []byte(id), Value: v})
			continue
		}
		recs = append(recs, &kgo.Record{Key: []byte(id), Value: events.event(t, "c", id, aggType, aggID, payload, i)})
		inserts[id] = want{aggID, payload}
	}
	// The first half now, the second after a kill -9.
	half := len(recs) / 2
	firstInserts := 0
	for _, r := range recs[:half] {
		if _, ok := inserts[string(r.Key)]; ok && r.Value != nil {
			firstInserts++
		}
	}
	if err := cl.ProduceSync(ctx, recs[:half]...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	topic := "outbox.event." + aggType
	out := testenv.StartConsumer(t, brokers, topic)
	dead := testenv.StartConsumer(t, brokers, dlq)
	env := map[string]string{
		"OUTBOX_KAFKA_BROKERS":           brokers,
		"OUTBOX_ROUTER_SOURCE_TOPIC":     source,
		"OUTBOX_ROUTER_GROUP":            "router-avro-" + suffix,
		"OUTBOX_ROUTER_TRANSACTIONAL_ID": "router-avro-" + suffix,
		"OUTBOX_ROUTER_SESSION_TIMEOUT":  "6s",
		"OUTBOX_DLQ_TOPIC":               dlq,
	}

	// The registry unreachable: retried, nothing routed, nothing dead.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env["OUTBOX_ROUTE_REGISTRY_URL"] = "http://" + l.Addr().String()
	l.Close()
	p := testenv.StartProc(t, bin, env)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.Output(), "schema registry unavailable") {
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("no retry of the unreachable registry; output:\n%s", p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if out.Count() != 0 || dead.Count() != 0 || p.Exited() {
		t.Fatalf("registry unreachable: %d routed, %d dead letters, exited %v; want 0, 0, running; output:\n%s", out.Count(), dead.Count(), p.Exited(), p.Output())
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM while retrying: exit %d; output:\n%s", code, p.Output())
	}

	// The real registry: the first half, a kill -9, the second half to a
	// new process, which must start from the committed offsets.
	env["OUTBOX_ROUTE_REGISTRY_URL"] = registryURL
	p = testenv.StartProc(t, bin, env)
	deadline = time.Now().Add(90 * time.Second)
	for out.Count() < firstInserts {
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("read %d of the first %d routed records; output:\n%s", out.Count(), firstInserts, p.Output())
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Signal(syscall.SIGKILL)
	p.Wait(t, 10*time.Second)
	if err := cl.ProduceSync(ctx, recs[half:]...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p = testenv.StartProc(t, bin, env)
	deadline = time.Now().Add(2 * time.Minute)
	for out.Count() < len(inserts) || dead.Count() < len(poison) {
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("read %d of %d routed records, %d of %d dead letters; output:\n%s", out.Count(), len(inserts), dead.Count(), len(poison), p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // anything extra would show up by now
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 90*time.Second); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, p.Output())
	}

	seen := map[string]int{}
	for _, r := range out.Records() {
		id := testenv.Header(r, "id")
		seen[id]++
		w, ok := inserts[id]
		switch {
		case !ok:
			t.Errorf("record for id %q, which was not an insert", id)
		case seen[id] == 1 && (r.Topic != topic || string(r.Key) != w.aggID || string(r.Value) != w.payload):
			t.Errorf("id %s: topic %q key %q value %q; want %q %q %q", id, r.Topic, r.Key, r.Value, topic, w.aggID, w.payload)
		}
	}
	dups, missing := 0, 0
	for id := range inserts {
		switch seen[id] {
		case 0:
			missing++
		case 1:
		default:
			dups += seen[id] - 1
		}
	}
	t.Logf("%d change events (%d inserts, 1 of them JSON; %d poison) routed, with a kill -9 between two halves: %d records read_committed, %d duplicates, %d missing",
		len(recs), len(inserts), len(poison), out.Count(), dups, missing)
	if dups != 0 || missing != 0 {
		t.Fatalf("exactly-once broken: %d duplicates, %d missing", dups, missing)
	}

	// The dead letters: each poison record once, whole, with its reason.
	if dead.Count() != len(poison) {
		t.Fatalf("%d dead letters, want %d", dead.Count(), len(poison))
	}
	wantClass := map[string]string{ // by the record's bytes in \x hex
		`\x` + hex.EncodeToString(poison[0]): "schema",
		`\x` + hex.EncodeToString(poison[1]): "invalid-payload",
	}
	for i, r := range dead.Records() {
		var v struct{ Value string }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("dead letter %d: %v: %s", i, err, r.Value)
		}
		class, ok := wantClass[v.Value]
		if !ok {
			t.Errorf("dead letter %d keeps %.60s…, which is not a poison record's bytes", i, v.Value)
			continue
		}
		delete(wantClass, v.Value)
		if c := testenv.Header(r, "error.class"); c != class {
			t.Errorf("dead letter %d: error.class %q, want %q (error %q)", i, c, class, testenv.Header(r, "error"))
		}
	}
}
