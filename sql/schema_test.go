package schema

import (
	"strings"
	"testing"
)

// TestStatements: the connector's two tables come out of the file whole,
// each column there, the lease table's later column added to old ones too.
func TestStatements(t *testing.T) {
	state := Statements("public.outbox_connector_state")
	if len(state) != 11 || !strings.HasPrefix(state[0], "CREATE TABLE IF NOT EXISTS public.outbox_connector_state (") ||
		state[1] != "ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS offsets_epoch bigint" ||
		state[2] != "ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS offsets_lsn pg_lsn" ||
		state[3] != "ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_xmin bigint" ||
		state[6] != "ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recovering boolean NOT NULL DEFAULT false" ||
		state[9] != "ALTER TABLE public.outbox_connector_state ADD COLUMN IF NOT EXISTS recover_floor_xmin bigint" {
		t.Fatalf("state table: %q", state)
	}
	for _, col := range []string{"slot_name", "system_identifier", "confirmed_lsn", "snapshot_done", "updated_at", "offsets_epoch", "offsets_lsn", "recover_xmin", "recover_lsn", "recover_at", "recovering", "messages_seen", "timeline", "recover_floor_xmin", "recover_floor_at"} {
		if !strings.Contains(state[0], col) {
			t.Errorf("state table lacks %s: %s", col, state[0])
		}
	}
	if bf := Statements("public.outbox_backfill"); len(bf) != 1 || !strings.Contains(bf[0], "last_key") {
		t.Fatalf("backfill table: %q", bf)
	}
	lease := Statements("public.outbox_lease")
	if len(lease) != 2 || !strings.HasPrefix(lease[0], "CREATE TABLE IF NOT EXISTS public.outbox_lease (") ||
		lease[1] != "ALTER TABLE public.outbox_lease ADD COLUMN IF NOT EXISTS holder_pid integer" {
		t.Fatalf("lease table: %q", lease)
	}
	defer func() {
		if recover() == nil {
			t.Error("a table the file does not define: no panic")
		}
	}()
	Statements("public.nothing")
}
