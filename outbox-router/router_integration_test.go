package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// changeEvent is a Debezium PostgreSQL change event for an outbox row, as
// the JsonConverter writes it with schemas disabled.
func changeEvent(op, id, aggType, aggID string, lsn int) []byte {
	after := fmt.Sprintf(`{"id":"%s","aggregatetype":"%s","aggregateid":"%s","type":"Created","payload":"{\"n\": %d}"}`, id, aggType, aggID, lsn)
	before := "null"
	if op == "d" {
		before, after = after, "null"
	}
	return []byte(fmt.Sprintf(`{"before":%s,"after":%s,"source":{"version":"3.6.1.Final","connector":"postgresql","name":"dbserver1","ts_ms":1700000000000,"db":"outbox","schema":"public","table":"outbox","lsn":%d},"op":"%s","ts_ms":1700000000123}`,
		before, after, lsn, op))
}

// TestExactlyOnceAcrossKill9 routes a Debezium-format change-event topic
// while the router is killed with SIGKILL three times; a read_committed
// consumer sees every outbox insert exactly once, and deletes are skipped as
// Debezium's router skips them.
func TestExactlyOnceAcrossKill9(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "outbox-router")
	ctx := context.Background()
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	source := "dbserver1.public.outbox" + suffix
	aggType := "cdc" + suffix
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(source))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, source); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	want := map[string]bool{}
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		id := uuid.NewString()
		op := "c"
		if i%10 == 9 {
			op = "d"
		} else {
			want[id] = true
		}
		recs = append(recs, &kgo.Record{Key: []byte(id), Value: changeEvent(op, id, aggType, fmt.Sprint(i%50), i)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	env := map[string]string{
		"OUTBOX_KAFKA_BROKERS":           brokers,
		"OUTBOX_ROUTER_SOURCE_TOPIC":     source,
		"OUTBOX_ROUTER_GROUP":            "router-" + suffix,
		"OUTBOX_ROUTER_TRANSACTIONAL_ID": "router-" + suffix,
	}
	for i := 0; i < 3; i++ {
		p := testenv.StartProc(t, bin, env)
		before := c.Count()
		deadline := time.Now().Add(60 * time.Second)
		for c.Count() < before+500 && c.Count() < len(want) {
			if time.Now().After(deadline) || p.Exited() {
				t.Fatalf("router made no progress; output:\n%s", p.Output())
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.Signal(syscall.SIGKILL)
		p.Wait(t, 10*time.Second)
	}
	p := testenv.StartProc(t, bin, env)
	deadline := time.Now().Add(2 * time.Minute)
	for c.Count() < len(want) {
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("read %d of %d routed records; output:\n%s", c.Count(), len(want), p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // anything extra would show up by now
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 90*time.Second)
	seen := map[string]int{}
	for _, r := range c.Records() {
		seen[testenv.Header(r, "id")]++
	}
	dups, missing := 0, 0
	for id, k := range seen {
		if k > 1 {
			dups += k - 1
		}
		if !want[id] {
			t.Errorf("record for id %s, which was not an insert", id)
		}
	}
	for id := range want {
		if seen[id] == 0 {
			missing++
		}
	}
	t.Logf("%d change events (%d inserts) routed across 3 kills: %d records read_committed, %d duplicates, %d missing", n, len(want), c.Count(), dups, missing)
	if dups != 0 || missing != 0 {
		t.Fatalf("exactly-once broken: %d duplicates, %d missing", dups, missing)
	}
}
