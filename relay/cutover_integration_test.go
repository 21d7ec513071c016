package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestDebeziumCutover follows the README's cutover procedure on a slot and
// publication left as Debezium's PostgreSQL connector leaves them (slot
// "debezium", pgoutput; publication "dbz_publication" FOR ALL TABLES, which
// also carries updates, deletes and other tables). Debezium published and
// flushed events A, then stopped after reading (but not flushing) B. The
// connector adopts the slot as it is (no snapshot): B and the events written
// after the switch (C) are delivered, A is not repeated, and the changes
// Debezium's publication carries beyond outbox inserts are ignored and
// counted.
func TestDebeziumCutover(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	for _, q := range []string{
		"CREATE TABLE orders (id bigserial PRIMARY KEY, note text)",
		"CREATE PUBLICATION dbz_publication FOR ALL TABLES",
		"SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	aggType := uniqueType("dbz")
	a := testenv.NewWriter()
	a.Write(t, ctx, conn, aggType, 100, 10, 10)
	// Debezium flushed everything up to here.
	if _, err := conn.Exec(ctx, `SELECT count(*) FROM pg_logical_slot_get_binary_changes('debezium', NULL, NULL,
		'proto_version', '1', 'publication_names', 'dbz_publication')`); err != nil {
		t.Fatal(err)
	}
	bc := testenv.NewWriter()
	bc.Write(t, ctx, conn, aggType, 100, 10, 10)
	for _, q := range []string{
		"INSERT INTO orders (note) VALUES ('not an outbox row')",
		"UPDATE outbox SET type = 'Changed' WHERE id = (SELECT id FROM outbox LIMIT 1)",
		"DELETE FROM outbox WHERE id = (SELECT id FROM outbox LIMIT 1)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.Slot, cfg.Publication = "debezium", "dbz_publication"
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	bc.Write(t, ctx, conn, aggType, 100, 10, 10)
	want := bc.Snapshot()
	c.WaitFor(t, want, time.Minute)
	time.Sleep(500 * time.Millisecond)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if dups := c.Verify(t, want); dups != 0 {
		t.Errorf("%d duplicates", dups)
	}
	repeated := 0
	inA := map[string]bool{}
	for _, e := range a.Events {
		inA[e.ID] = true
	}
	for _, r := range c.Records() {
		if inA[testenv.Header(r, "id")] {
			repeated++
		}
	}
	if repeated != 0 {
		t.Errorf("%d events Debezium had flushed were published again", repeated)
	}
	ignored := metricValue(t, run, "outbox_connector_changes_ignored_total")
	t.Logf("cutover: %d events after Debezium's flushed position delivered, %d before it not repeated; ignored changes: %s", len(want), len(a.Events), ignored)
	for _, kind := range []string{"update", "delete", "other-table"} {
		if !strings.Contains(ignored, "kind="+kind+":") {
			t.Errorf("ignored changes %q do not count %s", ignored, kind)
		}
	}
	var snapshotDone bool
	if err := conn.QueryRow(ctx, "SELECT snapshot_done FROM outbox_connector_state WHERE slot_name = 'debezium'").Scan(&snapshotDone); err != nil || !snapshotDone {
		t.Errorf("adopted slot: snapshot_done = %v, %v; want true (adopted as it is, no snapshot)", snapshotDone, err)
	}
}
