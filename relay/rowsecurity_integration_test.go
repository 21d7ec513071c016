package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestRowSecurityRefused: row-level security that applies to the
// connector's role (outbox_connector has no BYPASSRLS) would hide rows from
// the initial snapshot and from a recovery's window, which would then be
// recorded complete with their events never published. The connector
// refuses both, as the deployment's to fix, naming BYPASSRLS; the initial
// snapshot's refusal comes before the slot is created (nothing pins WAL).
func TestRowSecurityRefused(t *testing.T) {
	brokers := testenv.SharedKafka(t)
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("rls")
	for _, q := range []string{
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), '` + aggType + `', 'o1', 'Placed', '{}'), (gen_random_uuid(), '` + aggType + `', 'hidden', 'Placed', '{}')`,
		`CREATE POLICY not_hidden ON outbox FOR SELECT USING (aggregateid <> 'hidden')`,
		`ALTER TABLE outbox ENABLE ROW LEVEL SECURITY`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(t, pg.DSNUser("outbox", "outbox_connector"), brokers)
	cfg.OnSlotLoss = "recover"
	refused := func(what string) {
		t.Helper()
		run := startRelay(t, cfg)
		select {
		case err := <-run.done:
			run.cancel = nil
			if err == nil || !fatal.Is(err) || !strings.Contains(err.Error(), "BYPASSRLS") {
				t.Fatalf("%s under row-level security: the connector ended with %v; want a fatal refusal naming BYPASSRLS", what, err)
			}
			t.Logf("%s: %v", what, err)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s under row-level security: the connector neither refused nor stopped within 60s (streaming: %v)", what, run.relay.Streaming())
		}
	}
	refused("the initial snapshot")
	var slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots after the refusal (%v); want none", slots, err)
	}

	// Without row security the snapshot publishes both rows; then a slot
	// lost while it is on again: the recovery is refused too.
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox DISABLE ROW LEVEL SECURITY`); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	waitCount(t, c, 2)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`ALTER TABLE outbox ENABLE ROW LEVEL SECURITY`,
		`SELECT pg_drop_replication_slot('outbox_slot')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	refused("slot recovery")
}
