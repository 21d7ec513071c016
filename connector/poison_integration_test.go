package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestPoisonDeadLetteredAndRedriven: an event whose routed topic Kafka would
// reject goes whole to the DLQ topic, and one larger than the broker's
// message size limit (1 MiB by default, which OUTBOX_KAFKA_MAX_MESSAGE_BYTES
// mirrors) whole to the outbox_dead_letter table, each with its reason,
// while the events around them flow on; after the fix (a router setting; a
// larger limit on the topic and in the connector) `connector redrive`
// publishes them and removes them.
func TestPoisonDeadLetteredAndRedriven(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "poison"+suffix, "dlq"+suffix
	env := connectorEnv(pg, brokers, "OUTBOX_DLQ_TOPIC", dlq)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	dc := testenv.StartConsumer(t, brokers, dlq)
	p := testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=streaming", 60*time.Second)

	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 50, 5, 5)
	badID, bigID := uuid.NewString(), uuid.NewString()
	bigPayload := `{"pad": "` + strings.Repeat("z", 1200000) + `"}`
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
		($1, $2, 'a1', 'Bad', '{"bad": true}'), ($3, $4, 'a2', 'Big', $5)`, badID, "bad type!"+suffix, bigID, aggType, bigPayload); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 50, 5, 5)
	c.WaitFor(t, w.Events, time.Minute)
	dc.WaitFor(t, []testenv.Event{{ID: badID}}, time.Minute)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(p.Output()))
	}
	if dups := c.Verify(t, w.Events); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	// The DLQ record keeps the row whole, with its reason.
	var found bool
	for _, r := range dc.Records() {
		if testenv.Header(r, "id") != badID {
			continue
		}
		found = true
		if got := testenv.Header(r, "error.class"); got != "invalid-topic" {
			t.Errorf("DLQ error.class = %q, want invalid-topic", got)
		}
		if got := testenv.Header(r, "topic"); !strings.Contains(got, "bad type!") && got != "" {
			t.Errorf("DLQ topic header = %q", got)
		}
		if !strings.Contains(string(r.Value), `"aggregatetype":"bad type!`+suffix+`"`) || !strings.Contains(string(r.Value), `{\"bad\": true}`) {
			t.Errorf("DLQ value does not hold the row whole: %s", r.Value)
		}
		t.Logf("DLQ record: error=%q value=%s", testenv.Header(r, "error"), r.Value)
	}
	if !found {
		t.Fatal("the unroutable event is not in the DLQ topic")
	}
	var class, payload string
	if err := conn.QueryRow(ctx, "SELECT error_class, payload FROM outbox_dead_letter WHERE id = $1", bigID).Scan(&class, &payload); err != nil {
		t.Fatalf("the oversized event is not in outbox_dead_letter: %v", err)
	}
	if class != "record-too-large" || payload != bigPayload {
		t.Errorf("dead-letter row: class %q, payload of %d bytes; want record-too-large and the %d-byte payload whole", class, len(payload), len(bigPayload))
	}

	// The fixes: a larger record limit; a router setting that maps the bad
	// aggregate type to a legal topic.
	redrive := func(extra ...string) {
		t.Helper()
		from := extra[len(extra)-1]
		extra = extra[:len(extra)-2]
		e := connectorEnv(pg, brokers, append([]string{"OUTBOX_DLQ_TOPIC", dlq}, extra...)...)
		args := []string{"redrive", "-from", from}
		rp := testenv.StartProc(t, bin, e, args...)
		if code := rp.Wait(t, 60*time.Second); code != 0 {
			t.Fatalf("redrive %v: exit %d\n%s", args, code, rp.Output())
		}
		t.Logf("redrive %v: %s", args, strings.TrimSpace(lastLine(rp.Output())))
	}
	// The fix for the oversized event: the topic accepts 4 MiB records now,
	// and so does the connector.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	four := "4194304"
	if _, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &four}}, "outbox.event."+aggType); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	redrive("OUTBOX_KAFKA_MAX_MESSAGE_BYTES", four, "FROM", "table")
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox_dead_letter").Scan(&left); err != nil || left != 0 {
		t.Errorf("outbox_dead_letter holds %d rows after redrive (%v); want 0", left, err)
	}
	c.WaitFor(t, []testenv.Event{{ID: bigID}}, 30*time.Second)
	fixed := testenv.StartConsumer(t, brokers, "outbox.event.fixed"+suffix)
	redrive("OUTBOX_ROUTE_TOPIC_REGEX", `bad type!(?<routedByValue>.*)`, "OUTBOX_ROUTE_TOPIC_REPLACEMENT", "outbox.event.fixed${routedByValue}", "FROM", "topic")
	fixed.WaitFor(t, []testenv.Event{{ID: badID}}, 30*time.Second)
	// A second run finds nothing left to redrive.
	redrive("OUTBOX_ROUTE_TOPIC_REGEX", `bad type!(?<routedByValue>.*)`, "OUTBOX_ROUTE_TOPIC_REPLACEMENT", "outbox.event.fixed${routedByValue}", "FROM", "topic")
	time.Sleep(time.Second)
	if n := fixed.Count(); n != 1 {
		t.Errorf("the redriven event reached its topic %d times; want once", n)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// TestBrokerRefusedRecord: through the whole connector, in both modes, an
// event the broker refuses for its own account, whatever the batch around
// it (here a timestamp, table.field.event.timestamp = created_at, older
// than the topic's message.timestamp.before.max.ms), goes whole to the DLQ
// topic with the broker's error, and every other event arrives, in order
// per aggregate. Before issue 13 the Kafka transaction holding it aborted,
// the event was read again, aborted again: the line stopped (and without
// transactions it was produced again in a loop, never dead-lettered).
func TestBrokerRefusedRecord(t *testing.T) {
	for _, mode := range []string{"transactional", "idempotent"} {
		t.Run(mode, func(t *testing.T) { brokerRefusedRecord(t, mode == "transactional") })
	}
}

func brokerRefusedRecord(t *testing.T, transactional bool) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "refused"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	hour := "3600000"
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 3, -1, map[string]*string{"message.timestamp.before.max.ms": &hour}, topic)
	if err == nil {
		err = resp.Err
	}
	cl.Close()
	if err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
	env := connectorEnv(pg, brokers, "OUTBOX_DLQ_TOPIC", dlq, "OUTBOX_ROUTE_FIELD_EVENT_TIMESTAMP", "created_at",
		"OUTBOX_KAFKA_TRANSACTIONAL", fmt.Sprint(transactional))
	c := testenv.StartConsumer(t, brokers, topic)
	dc := testenv.StartConsumer(t, brokers, dlq)
	p := testenv.StartProc(t, bin, env)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("connector output:\n%s", tail(p.Output()))
		}
	})
	waitOutput(t, p, "msg=streaming", 60*time.Second)

	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 40, 4, 5)
	badID := uuid.NewString()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		VALUES ($1, $2, 'agg-1', 'Old', '{"old": true}', now() - interval '2 days')`, badID, aggType); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Write(t, ctx, conn, aggType, 40, 4, 5)
	c.WaitFor(t, w.Events, 90*time.Second)
	dc.WaitFor(t, []testenv.Event{{ID: badID}}, 30*time.Second)
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(p.Output()))
	}
	dups := c.Verify(t, w.Events)
	for _, r := range dc.Records() {
		if testenv.Header(r, "id") != badID {
			continue
		}
		if msg := testenv.Header(r, "error"); !strings.Contains(msg, "INVALID_TIMESTAMP") {
			t.Errorf("DLQ error = %q; want the broker's INVALID_TIMESTAMP", msg)
		}
		if !strings.Contains(string(r.Value), `{\"old\": true}`) || !strings.Contains(string(r.Value), `"aggregatetype":"`+aggType+`"`) {
			t.Errorf("DLQ value does not hold the row whole: %s", r.Value)
		}
		t.Logf("DLQ record: error.class=%s error=%q", testenv.Header(r, "error.class"), testenv.Header(r, "error"))
	}
	for _, r := range c.Records() {
		if testenv.Header(r, "id") == badID {
			t.Errorf("the refused event reached %s", topic)
		}
	}
	t.Logf("%d duplicates", dups)
}
