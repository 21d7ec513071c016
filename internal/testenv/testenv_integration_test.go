package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPostgresLogicalSlot checks the throwaway cluster: sql/ applies (twice,
// harmlessly) and a logical replication slot can be created with pgoutput.
func TestPostgresLogicalSlot(t *testing.T) {
	pg := StartPostgres(t, PGOptions{})
	t.Logf("PostgreSQL server version: %s", pg.Version)
	if err := pg.ApplySchema("outbox"); err != nil {
		t.Fatalf("applying sql/ a second time: %v", err)
	}
	ctx := context.Background()
	c := pg.Conn(t, "outbox")
	var walLevel string
	if err := c.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil || walLevel != "logical" {
		t.Fatalf("wal_level = %q, %v; want logical", walLevel, err)
	}
	var slot, lsn string
	err := c.QueryRow(ctx, "SELECT slot_name, lsn::text FROM pg_create_logical_replication_slot('testenv_slot', 'pgoutput')").Scan(&slot, &lsn)
	if err != nil {
		t.Fatalf("create logical slot: %v", err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'OrderPlaced', '{"a":1}')`); err != nil {
		t.Fatal(err)
	}
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('testenv_slot', NULL, NULL,
		'proto_version', '1', 'publication_names', 'outbox_pub')`).Scan(&n)
	if err != nil {
		t.Fatalf("peek slot: %v", err)
	}
	if n != 4 {
		t.Fatalf("peeked %d pgoutput messages for one insert; want 4 (begin, relation, insert, commit)", n)
	}
	// The replication role may create slots; pgconn replication connections work.
	rc, err := pgconn.Connect(ctx, pg.DSN("outbox")+"&replication=database")
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	defer rc.Close(ctx)
	res := rc.Exec(ctx, "IDENTIFY_SYSTEM")
	if _, err := res.ReadAll(); err != nil {
		t.Fatalf("IDENTIFY_SYSTEM: %v", err)
	}
}

// TestKafkaProduceConsume produces to and consumes from the real broker.
func TestKafkaProduceConsume(t *testing.T) {
	brokers := SharedKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v, err := KafkaVersion(ctx, brokers)
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	t.Logf("Kafka broker at %s answers as %s", brokers, v)
	topic := fmt.Sprintf("testenv.%d", time.Now().UnixNano())
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	const n = 100
	for i := 0; i < n; i++ {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprint(i))}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("fetch after %d records: %v", got, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Value) != fmt.Sprint(got) {
				t.Errorf("record %d has value %q", got, r.Value)
			}
			got++
		})
	}
}
