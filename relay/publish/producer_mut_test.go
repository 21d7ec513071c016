package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// Unit tests of producer.go (no PostgreSQL: the dead-letter table is
// fakeDeadLetters; Kafka is kfake). Each asserts what a decision of the
// producer is for: where an event ends, when it is acked, how fast a
// retry comes back.

// TestClientOptsSettings: the client settings rule 1 and 3 rest on, as
// ClientOpts documents them: acks from all in-sync replicas, unknown
// topics retried without limit (a topic created late is waited for, never
// a failed record), metadata refreshed every 250 ms at most, batches
// bounded by OUTBOX_KAFKA_MAX_MESSAGE_BYTES, buffers bounded.
func TestClientOptsSettings(t *testing.T) {
	cl, err := kgo.NewClient(ClientOpts(123, 2<<20, "zstd", 7*time.Millisecond)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, tc := range []struct {
		name string
		opt  any
		want any
	}{
		{"UnknownTopicRetries", kgo.UnknownTopicRetries, int64(-1)},
		{"MetadataMinAge", kgo.MetadataMinAge, 250 * time.Millisecond},
		{"MaxBufferedRecords", kgo.MaxBufferedRecords, int64(123)},
		{"MaxBufferedBytes", kgo.MaxBufferedBytes, int64(BufferedBytes(2 << 20))},
		{"ProducerLinger", kgo.ProducerLinger, 7 * time.Millisecond},
	} {
		if got := cl.OptValue(tc.opt); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s = %v (%T); want %v", tc.name, got, got, tc.want)
		}
	}
	if acks := cl.OptValue(kgo.RequiredAcks); acks != kgo.AllISRAcks() {
		t.Errorf("RequiredAcks = %v; want all in-sync replicas", acks)
	}
}

// TestRecordSizeCoversBatch: RecordSize, by which a record over
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES goes to the dead-letter table without
// being offered to Kafka, is never below what the record takes in a
// record batch of its own as franz-go measures it against
// ProducerBatchMaxBytes (which ClientOpts sets to that limit; Kafka's
// max.message.bytes counts 4 bytes less), for records as the router makes
// them: a topic outbox.event.<type>, headers. An estimate below it would
// offer Kafka a record that cannot fit.
func TestRecordSizeCoversBatch(t *testing.T) {
	var cases []*kgo.Record
	for _, k := range []int{0, 1, 36, 200} {
		for _, v := range []int{0, 2, 127, 128, 5000, 70000} {
			for _, nh := range []int{0, 1, 3, 12} {
				r := &kgo.Record{Topic: "outbox.event." + strings.Repeat("t", k%7+1), Key: make([]byte, k), Value: make([]byte, v)}
				for h := range nh {
					r.Headers = append(r.Headers, kgo.RecordHeader{Key: strings.Repeat("h", h%3), Value: make([]byte, (h*37)%300)})
				}
				cases = append(cases, r)
			}
		}
	}
	for _, r := range cases {
		if est, wire := RecordSize(r), batchBytes(r); est < wire {
			t.Errorf("record (topic %d, key %d, value %d bytes, %d headers): RecordSize %d below its %d bytes in a batch",
				len(r.Topic), len(r.Key), len(r.Value), len(r.Headers), est, wire)
		}
	}
}

// batchBytes is the size of a record batch holding r alone as franz-go
// counts it (recBatch.tryBuffer): recordBatchOverhead, 65 bytes (the v2
// batch header, 61, and its length prefix), and the record.
func batchBytes(r *kgo.Record) int {
	kr := kmsg.Record{Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		kr.Headers = append(kr.Headers, kmsg.Header{Key: h.Key, Value: h.Value})
	}
	body := len(kr.AppendTo(nil)) - 1 // AppendTo writes Length (0 here) as one byte
	kr.Length = int32(body)
	return 65 + len(kr.AppendTo(nil))
}

// routed returns the record the router makes of row, with the headers
// cfg adds: what produce measures.
func routed(t testing.TB, router *route.Router, cfg Config, row *route.Row) *kgo.Record {
	t.Helper()
	rec, err := router.Route(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Headers != nil {
		rec.Headers = append(rec.Headers, cfg.Headers()...)
	}
	return rec
}

// TestSizeLimitBoundary: a record whose size is OUTBOX_KAFKA_MAX_MESSAGE_BYTES
// exactly is produced to Kafka; one byte more and it goes to the
// dead-letter table, whole, acked once stored. The same for a dead letter's
// DLQ record: at the limit to the DLQ topic, over it to the table.
func TestSizeLimitBoundary(t *testing.T) {
	s := uniq()
	aggType, dlq := "size"+s, "dlq"+s
	topic := "outbox.event." + aggType
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, topic, dlq))
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	token := func() []kgo.RecordHeader {
		return []kgo.RecordHeader{{Key: "outbox.lease.token", Value: []byte("7")}}
	}
	row := func(id string) *route.Row {
		return eventRow("id", id, aggType, "a", `{"n": "`+strings.Repeat("x", 300)+`"}`, 90, 100)
	}
	size := RecordSize(routed(t, router, Config{Headers: token}, row("ev-1")))
	// The DLQ record of an unroutable row.
	bad := unroutableRow("id", "ev-1", aggType, 90, 100)
	_, rerr := router.Route(context.Background(), bad)
	dl := router.DeadLetter(bad, intendedTopic(rerr), rerr, dlq)
	dl.Headers = append(dl.Headers, token()...)
	dlSize := RecordSize(dl)

	for _, tc := range []struct {
		name     string
		row      *route.Row
		limit    int
		to       string // the topic it must reach, or "" for the table
		dlTopics int    // dead letters counted in the DLQ topic
	}{
		{"at the limit", row("ev-1"), size, topic, 0},
		{"over the limit", row("ev-1"), size - 1, "", 0},
		{"dead letter at the limit", bad, dlSize, dlq, 1},
		{"dead letter over the limit", bad, dlSize - 1, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newFakeDeadLetters()
			m := newSession(t, brokers, Config{DLQTopic: dlq, MaxMessageBytes: tc.limit, TopicCreate: true, Headers: token}, sessionOpts{router: router, db: db})
			before := map[string]int{topic: len(committed(t, brokers, topic)), dlq: len(committed(t, brokers, dlq))}
			m.start()
			m.send(100, tc.row)
			if err := m.close(); err != nil {
				t.Fatal(err)
			}
			if m.tr.Acked() != 100 {
				t.Fatalf("acked %d; want 100", m.tr.Acked())
			}
			for _, tp := range []string{topic, dlq} {
				n := len(committed(t, brokers, tp)) - before[tp]
				if want := map[bool]int{true: 1}[tp == tc.to]; n != want {
					t.Errorf("%d new records in %s; want %d", n, tp, want)
				}
			}
			if stored := db.stored(); (tc.to == "") != (len(stored) == 1) {
				t.Errorf("dead-letter table rows %v; want one only when over the limit", stored)
			}
			if r, ok := db.row("ev-1"); ok && tc.row != bad && r.class != string(route.ClassTooLarge) {
				t.Errorf("class %q; want %q", r.class, route.ClassTooLarge)
			}
			if got := metricValue(t, m.m.Registry, "outbox_connector_events_dead_lettered_total", map[string]string{"topic": "", "class": string(route.ClassMissingField), "sink": "topic"}); tc.dlTopics == 1 && got != 1 {
				t.Errorf("dead letters counted in the DLQ topic: %v; want 1", got)
			}
		})
	}
}

// place is the dead-letter id of an event without an event id: its place
// in the WAL (commit LSN, LSN, ordinal at that position).
func place(commit, lsn uint64, ord int) string {
	return fmt.Sprintf("lsn:%s:%s:%d", wal.FormatLSN(commit), wal.FormatLSN(lsn), ord)
}

// TestDeadLetterTableKeys: dead letters in outbox_dead_letter are keyed by
// the configured event id column (table.field.event.id), not by "id";
// events without one by their place in the WAL, distinct for the rows of a
// snapshot (all at LSN 0); an id another event holds gets the next free
// suffix, #2 up to #100, then the id and its place; a repeat of an event
// stored before (read again after a restart) is acked without a second
// row. Every event is acked, each once its row is stored, and the row
// holds every column (null as null).
func TestDeadLetterTableKeys(t *testing.T) {
	s := uniq()
	aggType, dlq := "tbl"+s, "dlq"+s
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, "outbox.event."+aggType))
	rcfg := route.DefaultConfig()
	rcfg.FieldEventID = "event_id"
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	row := func(eventID, payload string, lsn, commit uint64) *route.Row {
		r := eventRow("event_id", eventID, aggType, "agg-"+payload, `{"p": "`+payload+`"}`, lsn, commit)
		// An "id" column that is not the event id.
		return &route.Row{Source: r.Source, Columns: append([]route.Column{{Name: "id", Type: route.OIDText, Value: []byte("not-the-event-id")}}, r.Columns...)}
	}
	db := newFakeDeadLetters()
	db.put("dup", `{"other": "event"}`)
	db.put("full", `{"other": "event"}`)
	db.put("over", `{"other": "event"}`)
	for i := 2; i <= maxDeadLetterIDs; i++ {
		if i < maxDeadLetterIDs {
			db.put(fmt.Sprintf("full#%d", i), `{"other": "event"}`)
		}
		db.put(fmt.Sprintf("over#%d", i), `{"other": "event"}`)
	}
	r := newRig(t, brokers, Config{DLQTopic: dlq, MaxMessageBytes: 100, TopicCreate: true}, sessionOpts{router: router, db: db})
	r.add(100, row("e1", "1", 90, 100))
	r.add(200, row("", "2", 0, 200), row("", "3", 0, 200)) // a snapshot's rows: LSN 0, no event id
	r.add(300, row("dup", "4", 290, 300))
	r.add(400, row("full", "5", 390, 400))
	r.add(500, row("over", "6", 490, 500))
	r.run(1)
	want := []string{"e1", place(200, 0, 0), place(200, 0, 1), "dup#2", fmt.Sprintf("full#%d", maxDeadLetterIDs), "over@" + place(500, 490, 0)}
	if got := db.stored(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored as %q; want %q", got, want)
	}
	for _, id := range want {
		if rw, _ := db.row(id); rw.class != string(route.ClassTooLarge) || !strings.Contains(rw.errText, "OUTBOX_KAFKA_MAX_MESSAGE_BYTES") || rw.topic != "outbox.event."+aggType {
			t.Errorf("row %s: class %q, topic %q, error %q", id, rw.class, rw.topic, rw.errText)
		}
	}
	// The row is whole: every column, by name, the null event id as null.
	rw, _ := db.row(place(200, 0, 1))
	var data map[string]*string
	if err := json.Unmarshal(rw.rowData, &data); err != nil {
		t.Fatal(err)
	}
	if len(data) != 6 || data["event_id"] != nil || data["id"] == nil || *data["id"] != "not-the-event-id" || data["payload"] == nil || *data["payload"] != `{"p": "3"}` {
		t.Errorf("row data %s", rw.rowData)
	}
	if rw.aggType == nil || *rw.aggType != aggType || rw.aggID == nil || *rw.aggID != "agg-3" || rw.lsn != "0/0" {
		t.Errorf("row columns: aggregatetype %v, aggregateid %v, source_lsn %q", rw.aggType, rw.aggID, rw.lsn)
	}
	if got := metricValue(t, r.o.m.Registry, "outbox_connector_events_dead_lettered_total", map[string]string{"topic": "outbox.event." + aggType, "class": string(route.ClassTooLarge), "sink": "table"}); got != float64(len(want)) {
		t.Errorf("dead letters counted in the table: %v; want %d", got, len(want))
	}

	// Read again after a restart: the same events are repeats, acked,
	// nothing stored twice.
	r.confirmed, r.sessions = 0, 0
	r.run(1)
	if got := db.stored(); len(got) != len(want) {
		t.Errorf("after a repeat, stored %q; want %q", got, want)
	}
}

// TestDeadLetterTableRetries: a dead letter the table does not take (the
// database down) is retried with a growing pause and acked only once
// stored; a dead letter whose id, every variant and its place are taken is
// never acked (retried until the session ends); a producer that may no
// longer publish stores nothing.
func TestDeadLetterTableRetries(t *testing.T) {
	s := uniq()
	aggType, dlq := "retry"+s, "dlq"+s
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, "outbox.event."+aggType))
	cfg := Config{DLQTopic: dlq, MaxMessageBytes: 100, TopicCreate: true}

	t.Run("database down", func(t *testing.T) {
		db := newFakeDeadLetters()
		db.fail = 3
		m := newSession(t, brokers, cfg, sessionOpts{db: db}).start()
		start := time.Now()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		if !m.waitAcked(100, 10*time.Second) {
			t.Fatal("not acked within 10 s")
		}
		took := time.Since(start)
		if got := db.stored(); len(got) != 1 || got[0] != "e1" {
			t.Fatalf("acked with the table holding %q", got)
		}
		// Three failures: 100, 200 and 400 ms apart.
		if took < 650*time.Millisecond {
			t.Errorf("stored after 3 failures in %v; the retries do not back off (want 100+200+400 ms)", took)
		}
		if db.count() != 4 {
			t.Errorf("%d inserts; want 4", db.count())
		}
		if err := m.close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("database down until the session ends", func(t *testing.T) {
		db := newFakeDeadLetters()
		db.fail = 1 << 30
		m := newSession(t, brokers, cfg, sessionOpts{db: db}).start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		time.Sleep(400 * time.Millisecond)
		m.cancel()
		if err := m.wait(5 * time.Second); !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v; want the context's end", err)
		}
		if m.tr.Acked() != 0 || len(db.stored()) != 0 {
			t.Errorf("acked %d, stored %q", m.tr.Acked(), db.stored())
		}
		if db.count() > 5 {
			t.Errorf("%d inserts in 400 ms: no backoff", db.count())
		}
	})
	t.Run("every id taken", func(t *testing.T) {
		db := newFakeDeadLetters()
		db.put("e1", `{}`)
		for i := 2; i <= maxDeadLetterIDs; i++ {
			db.put(fmt.Sprintf("e1#%d", i), `{}`)
		}
		db.put("e1@"+place(100, 90, 0), `{}`)
		m := newSession(t, brokers, cfg, sessionOpts{db: db}).start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		time.Sleep(400 * time.Millisecond)
		m.cancel()
		if err := m.wait(5 * time.Second); !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v; want the context's end", err)
		}
		if m.tr.Acked() != 0 || len(db.stored()) != 0 {
			t.Errorf("acked %d, stored %q; want neither", m.tr.Acked(), db.stored())
		}
	})
	t.Run("fenced", func(t *testing.T) {
		db := newFakeDeadLetters()
		c := cfg
		calls := 0
		// Valid is asked before the record is measured, then before
		// its row is written: the lease is lost in between.
		c.Valid = func() bool { calls++; return calls <= 1 }
		m := newSession(t, brokers, c, sessionOpts{db: db})
		m.start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		if err := m.wait(5 * time.Second); !errors.Is(err, ErrFenced) {
			t.Errorf("Run: %v; want ErrFenced", err)
		}
		if m.tr.Acked() != 0 || db.count() != 0 {
			t.Errorf("acked %d, %d inserts; want none", m.tr.Acked(), db.count())
		}
	})
}

// TestRoutingFailuresDeadLettered: an event the stream could not decode
// (Event.Err) and an event the router refuses (a missing column) are
// dead letters in the DLQ topic, keyed and headed by the configured event
// id column, with the error and its class; each is acked, and the events
// after them are published, in order. Dead letters are not counted as
// published, events are, once each.
func TestRoutingFailuresDeadLettered(t *testing.T) {
	for _, mode := range []string{"idempotent", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			s := uniq()
			aggType, dlq := "routefail"+s, "dlq"+s
			topic := "outbox.event." + aggType
			_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
			rcfg := route.DefaultConfig()
			rcfg.FieldEventID = "event_id"
			router, err := route.New(rcfg)
			if err != nil {
				t.Fatal(err)
			}
			var published atomic.Int64
			m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true, Transactional: mode == "transactional", Published: &published},
				sessionOpts{router: router}).start()
			m.send(100, eventRow("event_id", "e1", aggType, "a", `{"n": 1}`, 90, 100))
			txn := m.tr.Begin(200)
			txn.Add()
			m.in <- wal.Event{Txn: txn, Row: eventRow("event_id", "e2", aggType, "a", `{"n": 2}`, 190, 200), Err: errors.New("decode column payload: bad bytes")}
			txn.Commit(200)
			m.send(300, unroutableRow("event_id", "e3", aggType, 290, 300))
			m.send(400, eventRow("event_id", "e4", aggType, "a", `{"n": 4}`, 390, 400))
			if err := m.close(); err != nil {
				t.Fatal(err)
			}
			if m.tr.Acked() != 400 {
				t.Fatalf("acked %d; want 400", m.tr.Acked())
			}
			if got := ids(committed(t, brokers, topic)); fmt.Sprint(got) != "[e1 e4]" {
				t.Errorf("%s holds %v; want [e1 e4]", topic, got)
			}
			dls := committed(t, brokers, dlq)
			if got := ids(dls); fmt.Sprint(got) != "[e2 e3]" {
				t.Fatalf("%s holds %v; want [e2 e3]", dlq, got)
			}
			if e := testenv.Header(dls[0], "error"); !strings.Contains(e, "bad bytes") {
				t.Errorf("e2's dead letter has error %q; want the decode error", e)
			}
			if c := testenv.Header(dls[1], "error.class"); c != string(route.ClassMissingField) {
				t.Errorf("e3's dead letter: class %q; want %q", c, route.ClassMissingField)
			}
			if string(dls[1].Key) != "e3" {
				t.Errorf("e3's dead letter has key %q; want its event id", dls[1].Key)
			}
			if published.Load() != 2 || metricValue(t, m.m.Registry, "outbox_connector_events_published_total", map[string]string{"topic": topic}) != 2 {
				t.Errorf("published: Config.Published %d, metric %v; want 2 (dead letters are not published events)",
					published.Load(), metricValue(t, m.m.Registry, "outbox_connector_events_published_total", map[string]string{"topic": topic}))
			}
		})
	}
}

// TestRegistryOutageBacksOff: a schema registry that fails (the row cannot
// be encoded yet) is retried with a growing pause, not in a loop, and the
// event is published once it answers; it is never dead-lettered for it.
func TestRegistryOutageBacksOff(t *testing.T) {
	s := uniq()
	aggType, dlq := "avro"+s, "dlq"+s
	topic := "outbox.event." + aggType
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
	reg := srfake.New()
	defer reg.Close()
	if _, _, err := reg.RegisterSchema(topic+"-value", sr.Schema{Schema: `{"type": "record", "name": "E", "fields": [{"name": "n", "type": "int"}]}`}); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	var refused atomic.Int64
	down.Store(true)
	reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if down.Load() && strings.Contains(r.URL.Path, "/subjects/") {
			refused.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	rcfg := route.DefaultConfig()
	rcfg.ValueFormat = route.FormatAvro
	rcfg.RegistryURLs = []string{reg.URL()}
	router, err := route.NewContext(context.Background(), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true}, sessionOpts{router: router}).start()
	m.send(100, eventRow("id", "e1", aggType, "a", `{"n": 1}`, 90, 100))
	// Down for 250 ms: looked up at 0, 100 and 300 ms.
	time.Sleep(250 * time.Millisecond)
	down.Store(false)
	if !m.waitAcked(100, 10*time.Second) {
		t.Fatal("not acked within 10 s of the registry's return")
	}
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(m.log.String(), "routing needs the schema registry"); n < 1 || n > 3 {
		t.Errorf("%d retries in 250 ms of outage (%d requests refused); want 2: a retry waits 100 ms, then 200 ms", n, refused.Load())
	}
	if got := ids(committed(t, brokers, topic)); fmt.Sprint(got) != "[e1]" {
		t.Errorf("%s holds %v; want [e1]", topic, got)
	}
	if n := len(committed(t, brokers, dlq)); n != 0 {
		t.Errorf("%d dead letters; want none", n)
	}
}

// TestAcquittedCountedOnce: records whose batch Kafka refused once are
// produced alone in the next session and, taken, published in their
// place: an event counts as published, a dead letter (its DLQ record
// refused once too) does not. In both modes the published counts equal
// the records a read_committed consumer reads from the event topic.
func TestAcquittedCountedOnce(t *testing.T) {
	for _, mode := range []string{"idempotent", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			s := uniq()
			aggType, dlq := "acquit"+s, "dlq"+s
			topic := "outbox.event." + aggType
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
			var published atomic.Int64
			r := newRig(t, brokers, Config{DLQTopic: dlq, TopicCreate: true, Transactional: mode == "transactional", Published: &published}, sessionOpts{})
			evMark, dlMark := "ev-mark-"+s, "dl-mark-"+s
			r.add(100, eventRow("id", "e1", aggType, "a", `{"n": 1}`, 90, 100))
			r.add(200, eventRow("id", "e2", aggType, "a", `{"n": 2, "m": "`+evMark+`"}`, 190, 200))
			bad := unroutableRow("id", "e3", aggType, 290, 300)
			bad.Columns[3].Value = []byte(dlMark) // the type column: in the DLQ record's value
			r.add(300, bad)
			r.add(400, eventRow("id", "e4", aggType, "a", `{"n": 4}`, 390, 400))
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.PolicyViolation, When: batchHolds(t, brokers, topic, evMark)})
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlq, Err: kerr.PolicyViolation, When: batchHolds(t, brokers, dlq, dlMark)})
			r.run(6)
			recs := committed(t, brokers, topic)
			pub := metricValue(t, r.o.m.Registry, "outbox_connector_events_published_total", map[string]string{"topic": topic})
			if int(published.Load()) != len(recs) || int(pub) != len(recs) {
				t.Errorf("published: Config.Published %d, metric %v; %s holds %d records %v", published.Load(), pub, topic, len(recs), ids(recs))
			}
			last := map[string]bool{}
			for _, id := range ids(recs) {
				last[id] = true
			}
			if !last["e1"] || !last["e2"] || !last["e4"] || len(last) != 3 {
				t.Errorf("%s holds %v; want e1, e2, e4", topic, ids(recs))
			}
			if got := ids(committed(t, brokers, dlq)); fmt.Sprint(got) != "[e3]" {
				t.Errorf("%s holds %v; want [e3]", dlq, got)
			}
			if n := metricValue(t, r.o.m.Registry, "outbox_connector_kafka_refused_records_total", map[string]string{"topic": topic, "verdict": "innocent"}); n < 1 {
				t.Errorf("no innocent record counted for %s", topic)
			}
			if len(r.o.db.stored()) != 0 {
				t.Errorf("dead-letter table holds %v; want nothing", r.o.db.stored())
			}
		})
	}
}

// TestConvictedWhereTheErrorSays: a record Kafka refuses alone too is
// dead-lettered where its error says: too large (MESSAGE_TOO_LARGE) in the
// table, refused for another reason (POLICY_VIOLATION) in the DLQ topic
// with class kafka-refused; a dead letter whose DLQ record Kafka refuses
// alone in the table, with both reasons and the class of the first. The
// events around it are published, and nothing innocent is dead-lettered.
func TestConvictedWhereTheErrorSays(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ferr      *kerr.Error
		dead      bool   // the event is a dead letter already: its DLQ record is refused
		sink      string // "table" or "topic"
		class     route.ErrorClass
		transacts bool
	}{
		{"too large", kerr.MessageTooLarge, false, "table", route.ClassTooLarge, false},
		{"policy", kerr.PolicyViolation, false, "topic", ClassRefused, false},
		{"policy/transactional", kerr.PolicyViolation, false, "topic", ClassRefused, true},
		{"dead letter refused", kerr.PolicyViolation, true, "table", route.ClassMissingField, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := uniq()
			aggType, dlq := "convict"+s, "dlq"+s
			topic := "outbox.event." + aggType
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
			r := newRig(t, brokers, Config{DLQTopic: dlq, TopicCreate: true, Transactional: tc.transacts}, sessionOpts{})
			mark := "bad-" + s
			r.add(100, eventRow("id", "e1", aggType, "a", `{"n": 1}`, 90, 100))
			bad := eventRow("id", "e2", aggType, "a", `{"n": 2, "m": "`+mark+`"}`, 190, 200)
			faulted := topic
			if tc.dead {
				bad = unroutableRow("id", "e2", aggType, 190, 200)
				bad.Columns[3].Value = []byte(mark)
				faulted = dlq
			}
			r.add(200, bad)
			r.add(300, eventRow("id", "e3", aggType, "a", `{"n": 3}`, 290, 300))
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: faulted, Err: tc.ferr, Count: -1, When: batchHolds(t, brokers, faulted, mark)})
			r.run(6)
			got := ids(committed(t, brokers, topic))
			if !contains(got, "e1") || !contains(got, "e3") || contains(got, "e2") {
				t.Errorf("%s holds %v; want e1 and e3, not e2", topic, got)
			}
			dls := committed(t, brokers, dlq)
			stored := r.o.db.stored()
			switch tc.sink {
			case "table":
				if len(dls) != 0 || fmt.Sprint(stored) != "[e2]" {
					t.Fatalf("DLQ topic %v, table %v; want e2 in the table only", ids(dls), stored)
				}
				row, _ := r.o.db.row("e2")
				if row.class != string(tc.class) || !strings.Contains(row.errText, tc.ferr.Message) {
					t.Errorf("table row: class %q, error %q; want class %s, naming %s", row.class, row.errText, tc.class, tc.ferr.Message)
				}
				if tc.dead && !strings.Contains(row.errText, "payload") {
					t.Errorf("table row error %q does not say why the event is a dead letter", row.errText)
				}
			case "topic":
				if len(stored) != 0 || fmt.Sprint(ids(dls)) != "[e2]" {
					t.Fatalf("DLQ topic %v, table %v; want e2 in the DLQ topic only", ids(dls), stored)
				}
				if cl := testenv.Header(dls[0], "error.class"); cl != string(tc.class) || !strings.Contains(testenv.Header(dls[0], "error"), tc.ferr.Message) {
					t.Errorf("DLQ record: class %q, error %q", cl, testenv.Header(dls[0], "error"))
				}
			}
			if n := metricValue(t, r.o.m.Registry, "outbox_connector_kafka_refused_records_total", map[string]string{"topic": faulted, "verdict": "guilty"}); n != 1 {
				t.Errorf("guilty records counted: %v; want 1", n)
			}
		})
	}
}

// TestTopicCreated: with OUTBOX_TOPIC_CREATE a missing topic is created
// with the configured partitions; a create that fails for a passing
// reason is retried with a growing pause (100 ms, then 200 ms), not in a
// loop and not given up; Kafka refusing the topic's name makes the event a
// dead letter (invalid-topic) and the line goes on; refusing the DLQ
// topic's name is fatal and says which setting to change.
func TestTopicCreated(t *testing.T) {
	s := uniq()
	aggType, dlq := "create"+s, "dlq"+s
	topic := "outbox.event." + aggType
	t.Run("retried", func(t *testing.T) {
		c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
		// First an answer that lacks the topic (an error of the request,
		// not of the topic), then the topic's REQUEST_TIMED_OUT.
		answered := 0
		c.ControlKey(int16(kmsg.CreateTopics), func(req kmsg.Request) (kmsg.Response, error, bool) {
			r := req.(*kmsg.CreateTopicsRequest)
			if len(r.Topics) != 1 || r.Topics[0].Topic != topic || answered == 2 {
				c.KeepControl()
				return nil, nil, false
			}
			c.KeepControl()
			answered++
			resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
			if answered == 2 {
				st := kmsg.NewCreateTopicsResponseTopic()
				st.Topic, st.ErrorCode = topic, kerr.RequestTimedOut.Code
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
		m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true, TopicPartitions: 3}, sessionOpts{}).start()
		start := time.Now()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		if !m.waitAcked(100, 10*time.Second) {
			t.Fatal("not acked within 10 s")
		}
		took := time.Since(start)
		if err := m.close(); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(m.log.String(), "create topic failed; retrying"); n != 2 || took < 280*time.Millisecond {
			t.Errorf("created after %d retries in %v; want 2, 100 ms and 200 ms apart", n, took)
		}
		details, err := kadm.NewClient(m.cl).ListTopics(context.Background(), topic)
		if err != nil || len(details[topic].Partitions) != 3 {
			t.Errorf("topic %s: %d partitions (%v); want 3", topic, len(details[topic].Partitions), err)
		}
		if got := ids(committed(t, brokers, topic)); fmt.Sprint(got) != "[e1]" {
			t.Errorf("%s holds %v", topic, got)
		}
	})
	t.Run("name refused", func(t *testing.T) {
		c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, "outbox.event.other"+s))
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Topic: topic, Err: kerr.InvalidTopicException, Count: -1})
		m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true}, sessionOpts{}).start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		m.send(200, eventRow("id", "e2", "other"+s, "a", `{}`, 190, 200))
		if err := m.close(); err != nil {
			t.Fatal(err)
		}
		if m.tr.Acked() != 200 {
			t.Fatalf("acked %d; want 200", m.tr.Acked())
		}
		dls := committed(t, brokers, dlq)
		if fmt.Sprint(ids(dls)) != "[e1]" || testenv.Header(dls[0], "error.class") != string(route.ClassInvalidTopic) || testenv.Header(dls[0], "topic") != topic {
			t.Errorf("dead letters %v (class %q); want e1 as invalid-topic for %s", ids(dls), testenv.Header(dls[0], "error.class"), topic)
		}
		if got := ids(committed(t, brokers, "outbox.event.other"+s)); fmt.Sprint(got) != "[e2]" {
			t.Errorf("the next event's topic holds %v; want [e2]", got)
		}
	})
	t.Run("DLQ topic name refused", func(t *testing.T) {
		c, brokers := fakeKafka(t, kfake.NumBrokers(1))
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Topic: dlq, Err: kerr.InvalidTopicException, Count: -1})
		m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true}, sessionOpts{}).start()
		err := m.wait(10 * time.Second)
		var fe *fatal.Error
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "OUTBOX_DLQ_TOPIC") || !m.fatal.Load() {
			t.Errorf("Run: %v (onFatal called: %v); want a fatal.Error naming OUTBOX_DLQ_TOPIC", err, m.fatal.Load())
		}
	})
}

// TestTopicLimit: a topic whose max.message.bytes is below
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES stops the producer with a fatal.Error
// naming both (Kafka would refuse batches the producer fills to its own
// limit), whether the producer created it or found it; at our limit or
// above, the event is published.
func TestTopicLimit(t *testing.T) {
	const ours = 100_000
	for _, create := range []bool{true, false} {
		for _, tc := range []struct {
			limit int
			fatal bool
		}{{ours - 1, true}, {ours, false}, {ours + 1, false}} {
			t.Run(fmt.Sprintf("create=%v/%d", create, tc.limit), func(t *testing.T) {
				s := uniq()
				aggType, dlq := "limit"+s, "dlq"+s
				topic := "outbox.event." + aggType
				_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
				v := fmt.Sprint(tc.limit)
				cfg := Config{DLQTopic: dlq, TopicCreate: create, MaxMessageBytes: ours}
				if create {
					cfg.TopicConfigs = map[string]*string{"max.message.bytes": &v}
				} else {
					cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
					if err != nil {
						t.Fatal(err)
					}
					resp, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, -1, map[string]*string{"max.message.bytes": &v}, topic)
					cl.Close()
					if err == nil {
						err = resp.Err
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				m := newSession(t, brokers, cfg, sessionOpts{}).start()
				m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
				err := m.close()
				var fe *fatal.Error
				if tc.fatal {
					if !errors.As(err, &fe) || !strings.Contains(err.Error(), "max.message.bytes") || !strings.Contains(err.Error(), v) || m.tr.Acked() != 0 {
						t.Errorf("Run: %v, acked %d; want a fatal.Error naming the topic's max.message.bytes %s, nothing acked", err, m.tr.Acked(), v)
					}
					return
				}
				if err != nil || m.tr.Acked() != 100 {
					t.Errorf("Run: %v, acked %d; want the event published", err, m.tr.Acked())
				}
			})
		}
	}
}

// TestMissingTopicLooksBackOff: without OUTBOX_TOPIC_CREATE, a missing
// topic, or one whose lookup fails, is looked for again after 1 s, then
// 2 s (growing to 30 s), each time said aloud; not in a loop. Nothing is
// acked meanwhile, and the session's end does not unsay it (the topic is
// still missing; the next session looks again).
func TestMissingTopicLooksBackOff(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		fault      *kerr.Error
	}{
		{"missing", "does not exist", nil},
		{"lookup fails", "cannot tell whether topic", kerr.UnknownServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := uniq()
			aggType, dlq := "look"+s, "dlq"+s
			c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
			if tc.fault != nil {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: "outbox.event." + aggType, Err: tc.fault, Count: -1})
			}
			var looks atomic.Int64
			var last atomic.Pointer[string]
			cfg := Config{DLQTopic: dlq, TopicCreate: false, Blocked: func(reason string) {
				if reason != "" {
					looks.Add(1)
				}
				last.Store(&reason)
			}}
			m := newSession(t, brokers, cfg, sessionOpts{}).start()
			m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
			// Looks at 0 and 1 s; the next at 3 s.
			time.Sleep(1700 * time.Millisecond)
			m.cancel()
			if err := m.wait(5 * time.Second); !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v; want the context's end", err)
			}
			if n := looks.Load(); n != 2 {
				t.Errorf("%d looks for the topic in 1.7 s; want 2 (at 0 and after 1 s)", n)
			}
			if m.tr.Acked() != 0 {
				t.Errorf("acked %d while the topic is missing", m.tr.Acked())
			}
			if r := last.Load(); r == nil || !strings.Contains(*r, tc.says) {
				t.Errorf("the Blocked hook was last told %v after the session ended; want it still saying the topic %s", r, tc.says)
			}
		})
	}
}

// TestTopicWatch: a topic deleted after the producer saw it is looked for
// only while records wait with no answer, every topicWatch: an idle
// session looks up nothing and says nothing of a topic deleted meanwhile;
// with records waiting, the deleted topic is said missing within a few
// looks, and (OUTBOX_TOPIC_CREATE) created again, its creation retried at
// the next look when Kafka's answer lacks it; the records then end up
// published, or the session ends with an error that is not fatal.
func TestTopicWatch(t *testing.T) {
	del := func(t *testing.T, cl *kgo.Client, topic string) {
		t.Helper()
		resp, err := kadm.NewClient(cl).DeleteTopic(context.Background(), topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Run("idle", func(t *testing.T) {
		t.Parallel()
		s := uniq()
		aggType, dlq := "idle"+s, "dlq"+s
		topic := "outbox.event." + aggType
		c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
		var lookups atomic.Int64
		c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			for _, rt := range req.(*kmsg.MetadataRequest).Topics {
				if rt.Topic != nil && *rt.Topic == topic {
					lookups.Add(1)
				}
			}
			return nil, nil, false
		})
		var said atomic.Int64
		m := newSession(t, brokers, Config{DLQTopic: dlq, Blocked: func(r string) {
			if r != "" {
				said.Add(1)
			}
		}}, sessionOpts{})
		m.p.topicWatch = 50 * time.Millisecond
		m.start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		if !m.waitAcked(100, 5*time.Second) {
			t.Fatal("e1 not acked")
		}
		time.Sleep(100 * time.Millisecond)
		before := lookups.Load()
		del(t, m.cl, topic)
		time.Sleep(500 * time.Millisecond)
		if n := lookups.Load() - before; n != 0 {
			t.Errorf("%d lookups of the topic in 500 ms of an idle session; want none", n)
		}
		if said.Load() != 0 || metricValue(t, m.m.Registry, "outbox_connector_topic_missing", map[string]string{"topic": topic}) == 1 {
			t.Errorf("an idle session said the deleted topic missing; nothing waits for it")
		}
		if err := m.close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("deleted, created again", func(t *testing.T) {
		t.Parallel()
		s := uniq()
		aggType, dlq := "gone"+s, "dlq"+s
		topic := "outbox.event." + aggType
		c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
		var deleted atomic.Bool
		var creates atomic.Int64
		c.ControlKey(int16(kmsg.CreateTopics), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			r := req.(*kmsg.CreateTopicsRequest)
			if !deleted.Load() || len(r.Topics) != 1 || r.Topics[0].Topic != topic {
				return nil, nil, false
			}
			if creates.Add(1) == 1 {
				return r.ResponseKind(), nil, true // an answer without the topic
			}
			return nil, nil, false
		})
		var reason atomic.Pointer[string]
		m := newSession(t, brokers, Config{DLQTopic: dlq, TopicCreate: true, Blocked: func(r string) { reason.Store(&r) }}, sessionOpts{})
		m.p.topicWatch = 100 * time.Millisecond
		m.start()
		m.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
		if !m.waitAcked(100, 5*time.Second) {
			t.Fatal("e1 not acked")
		}
		deleted.Store(true)
		del(t, m.cl, topic)
		m.send(200, eventRow("id", "e2", aggType, "a", `{}`, 190, 200))
		deadline := time.After(5 * time.Second)
		for m.tr.Acked() != 200 {
			select {
			case err := <-m.done:
				if err == nil || fatal.Is(err) {
					t.Fatalf("the session ended with %v; want e2 published or an error that is not fatal", err)
				}
				m.done <- err
			case <-deadline:
				t.Fatalf("e2 neither published nor the session ended within 5 s of the topic's deletion (%d creates tried); log:\n%s", creates.Load(), m.log.String())
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		if n := creates.Load(); n < 2 {
			t.Errorf("%d creates of the deleted topic; want the failed one tried again", n)
		}
		m.cancel()
		m.wait(5 * time.Second)
		if r := reason.Load(); r == nil || *r != "" {
			t.Errorf("the Blocked hook was last told %v; want \"\" once the session ended", r)
		}
	})
}

// TestEscapeText: a value PostgreSQL text cannot hold (a NUL byte,
// wherever it is, or bytes that are not UTF-8) is not storable as it is;
// a dead letter's text columns show such bytes as \xNN and keep the
// rest, valid multi-byte characters (U+FFFD itself among them) included.
func TestEscapeText(t *testing.T) {
	for in, want := range map[string]bool{"ok \u20ac": true, "": true, "\x00first": false, "last\x00": false, "\xff": false} {
		if got := storable([]byte(in)); got != want {
			t.Errorf("storable(%q) = %v; want %v", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"plain":                  "plain",
		"a\xffb":                 `a\xFFb`,
		"nul\x00":                `nul\x00`,
		"cut \xe2\x82":           `cut \xE2\x82`,
		"euro \u20ac, \ufffd ok": "euro \u20ac, \ufffd ok",
	} {
		if got := escapeText([]byte(in)); got != want {
			t.Errorf("escapeText(%q) = %q; want %q", in, got, want)
		}
	}
}

// TestWatchTopicsDefaultInterval: a producer whose look interval is not set
// (the connector's: only tests set topicWatch) falls back to a positive
// interval, not a ticker of zero (which panics). That the interval is
// topicWatchEvery is not checked.
func TestWatchTopicsDefaultInterval(t *testing.T) {
	if topicWatchEvery <= 0 {
		t.Fatalf("topicWatchEvery = %s; want a positive interval", topicWatchEvery)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		(&Producer{}).watchTopics(ctx)
	}()
	select {
	case r := <-done:
		if r != nil {
			t.Fatalf("watchTopics with the default interval panicked: %v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watchTopics did not return within 10 s of its context's end")
	}
}
