package wal

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// Unit tests of the decisions in slot.go that need no server: when a slot
// is refused and which errors stop the connector. The state row's checks
// are relay/checkpoint's. The integration tests run the same paths against
// PostgreSQL.

func TestCheckSlot(t *testing.T) {
	ok := SlotInfo{Name: "s", SlotType: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "reserved"}
	tests := []struct {
		name  string
		edit  func(*SlotInfo)
		fatal []string
	}{
		{"usable", func(*SlotInfo) {}, nil},
		{"unreserved WAL is still usable", func(s *SlotInfo) { s.WALStatus = "unreserved" }, nil},
		{"physical", func(s *SlotInfo) { s.SlotType = "physical" }, []string{"physical slot"}},
		{"other plugin", func(s *SlotInfo) { s.Plugin = "wal2json" }, []string{`plugin "wal2json"`, "pg_drop_replication_slot"}},
		{"other database", func(s *SlotInfo) { s.Database = "billing" }, []string{`database "billing"`, `"app"`}},
		{"invalidated", func(s *SlotInfo) { s.WALStatus = "lost" }, []string{"wal_status = lost", "OUTBOX_ON_SLOT_LOSS=recover"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.edit(&s)
			wantFatal(t, CheckSlot(s, "app"), tt.fatal)
		})
	}
}

// wantFatal fails unless err is nil (want nil) or a fatal.Error naming every
// part of want.
func wantFatal(t *testing.T, err error, want []string) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if !fatal.Is(err) {
		t.Fatalf("error %v; want a fatal.Error", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}
