package relay

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// debeziumCutoverProps runs Debezium Server's PostgreSQL connector with the
// Outbox Event Router on the outbox table, into the same Kafka.
const debeziumCutoverProps = `debezium.sink.type=kafka
debezium.sink.kafka.producer.bootstrap.servers={{brokers}}
debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer
debezium.sink.kafka.producer.value.serializer=org.apache.kafka.common.serialization.StringSerializer
debezium.sink.kafka.producer.acks=all
debezium.sink.kafka.producer.enable.idempotence=true
debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
debezium.source.offset.storage.file.filename={{dir}}/data/offsets.dat
debezium.source.offset.flush.interval.ms=0
debezium.source.database.hostname=127.0.0.1
debezium.source.database.port={{port}}
debezium.source.database.user=postgres
debezium.source.database.password=postgres
debezium.source.database.dbname=outbox
debezium.source.topic.prefix=dbz
debezium.source.plugin.name=pgoutput
debezium.source.slot.name=debezium
debezium.source.publication.name=dbz_publication
debezium.source.publication.autocreate.mode=filtered
debezium.source.table.include.list=public.outbox
debezium.source.snapshot.mode=no_data
debezium.source.tombstones.on.delete=false
debezium.transforms=outbox
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.format.key=json
debezium.format.value=json
debezium.format.key.schemas.enable=false
debezium.format.value.schemas.enable=false
quarkus.http.port={{http}}
quarkus.log.level=INFO
`

// TestDebeziumServerCutover (make soak) runs the README's cutover against a
// real Debezium Server 3.6.1 from Maven Central: Debezium publishes events,
// is stopped, the connector takes its slot and publication as they are.
// Nothing is lost, and nothing Debezium had published before its last
// flushed position is published again.
func TestDebeziumServerCutover(t *testing.T) {
	if os.Getenv("OUTBOX_SOAK") != "1" {
		t.Skip("make soak only (OUTBOX_SOAK=1): downloads Debezium Server once (~780 MB)")
	}
	dbz := testenv.InstallDebeziumServer(t)
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("dbzsrv")
	// The test broker does not auto-create topics; Debezium's producer would
	// wait for the topic forever.
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 3, 1, nil, "outbox.event."+aggType); err != nil {
		t.Fatal(err)
	}
	adm.Close()
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)

	dbzRun := dbz.Start(t, debeziumCutoverProps, "{{brokers}}", brokers, "{{port}}", strconv.Itoa(pg.Port))
	cmd, exited := dbzRun.Cmd, dbzRun.Exited
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var n int
		_ = conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'debezium' AND active").Scan(&n)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(dbzRun.LogPath)
			t.Fatalf("Debezium Server did not start streaming within 3 minutes:\n%s", tailBytes(log))
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)

	// A: published by Debezium. Written in chunks, with the WAL position
	// after each, so that every event's commit LSN is bounded.
	a := testenv.NewWriter()
	var bounds []uint64 // WAL position after chunk k
	for k := 0; k < 20; k++ {
		a.Write(t, ctx, conn, aggType, 100, 50, 20)
		var lsn string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		bounds = append(bounds, parseLSN(lsn))
	}
	waitIDs(t, c, a.Events, 2*time.Minute)
	// A2: written while Debezium runs, right before it is stopped.
	a2 := testenv.NewWriter()
	a2.Write(t, ctx, conn, aggType, 500, 50, 20)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("Debezium Server did not stop within a minute of SIGTERM")
	}
	var flushed string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'debezium'").Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	// B: written while nothing relays.
	b := testenv.NewWriter()
	b.Write(t, ctx, conn, aggType, 500, 50, 20)

	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.Slot, cfg.Publication = "debezium", "dbz_publication"
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	// C: after the switch.
	cw := testenv.NewWriter()
	cw.Write(t, ctx, conn, aggType, 500, 50, 20)
	all := append(append(append(a.Snapshot(), a2.Snapshot()...), b.Snapshot()...), cw.Snapshot()...)
	waitIDs(t, c, all, 2*time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, r := range c.Records() {
		counts[eventID(r)]++
	}
	// An event repeated by the connector must have committed after
	// Debezium's flushed position: its chunk's bound is beyond it.
	repeatedA, dups := 0, 0
	for i, e := range a.Events {
		if counts[e.ID] > 1 && bounds[i/100] <= parseLSN(flushed) {
			repeatedA++
		}
	}
	for _, e := range all {
		if counts[e.ID] == 0 {
			t.Errorf("event %s was never published", e.ID)
		}
		if counts[e.ID] > 1 {
			dups += counts[e.ID] - 1
		}
	}
	t.Logf("Debezium Server 3.6.1 published %d events and stopped with the slot confirmed at %s; the connector took over its slot: %d events in all, none lost, %d duplicates, %d of them before Debezium's flushed position",
		len(a.Events)+len(a2.Events), flushed, len(all), dups, repeatedA)
	if repeatedA != 0 {
		t.Errorf("%d events that committed before Debezium's flushed position were published again", repeatedA)
	}
}

// eventID reads the id header as Debezium Server (JSON, possibly with a
// schema) or the connector (text) writes it.
func eventID(r *kgo.Record) string {
	h := testenv.Header(r, "id")
	switch {
	case strings.HasPrefix(h, "{"):
		var v struct {
			Payload string `json:"payload"`
		}
		if json.Unmarshal([]byte(h), &v) == nil {
			return v.Payload
		}
	case strings.HasPrefix(h, `"`):
		if s, err := strconv.Unquote(h); err == nil {
			return s
		}
	}
	return h
}

func waitIDs(t *testing.T, c *testenv.Consumer, want []testenv.Event, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		seen := map[string]bool{}
		for _, r := range c.Records() {
			seen[eventID(r)] = true
		}
		missing := 0
		for _, e := range want {
			if !seen[e.ID] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events not in Kafka after %s", missing, len(want), timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func parseLSN(s string) uint64 {
	hi, lo, _ := strings.Cut(s, "/")
	h, _ := strconv.ParseUint(hi, 16, 32)
	l, _ := strconv.ParseUint(lo, 16, 32)
	return h<<32 | l
}

func tailBytes(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
