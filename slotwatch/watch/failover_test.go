package watch

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
)

// TestFailoverReadiness: a failover slot of a primary is ready on a standby
// of it (a server in recovery with its system identifier) only when the
// standby's copy is synchronized, persistent and valid, the primary's
// synchronized_standby_slots names the standby's primary_slot_name, and
// the standby runs with hot_standby_feedback (issue 35, item 17: a copy
// was ready without the last two); servers down, of another cluster, or
// primaries are not its standbys; slots that are not failover slots, and
// standbys' own reports, get no readiness.
func TestFailoverReadiness(t *testing.T) {
	yes, no := true, false
	str := func(s string) *string { return &s }
	slot := func(name string, failover, synced *bool, temporary bool, confirmed collect.LSN, walStatus string) SlotReport {
		return SlotReport{Slot: collect.Slot{Name: name, Type: "logical", Failover: failover, Synced: synced, Temporary: temporary, ConfirmedFlushLSN: confirmed, WALStatus: walStatus}}
	}
	primary := Report{Server: "p", Up: true, SystemID: "42", Slots: []SlotReport{
		slot("outbox_slot", &yes, &no, false, 5000, "reserved"),
		slot("plain", &no, &no, false, 5000, "reserved"),
	}, Settings: collect.Settings{SynchronizedStandbySlots: []string{"other", "standby1"}}}
	standby := func(name, sys string, up bool, slots ...SlotReport) Report {
		return Report{Server: name, Up: up, Collected: true, InRecovery: true, SystemID: sys, Slots: slots,
			Settings: collect.Settings{PrimarySlotName: str("standby1"), HotStandbyFeedback: &yes}}
	}
	// with changes a standby's settings.
	with := func(r Report, set func(*collect.Settings)) Report {
		set(&r.Settings)
		return r
	}
	synced := slot("outbox_slot", &yes, &yes, false, 4000, "reserved")
	cases := []struct {
		name    string
		sb      Report
		want    []FailoverReport
		wantNil bool
	}{
		{name: "ready", sb: standby("s", "42", true, slot("outbox_slot", &yes, &yes, false, 4000, "reserved")),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Ready: true, LagBytes: 1000, LagOK: true}}},
		{name: "copy ahead (read later)", sb: standby("s", "42", true, slot("outbox_slot", &yes, &yes, false, 6000, "reserved")),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Ready: true, LagBytes: 0, LagOK: true}}},
		{name: "missing", sb: standby("s", "42", true),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverMissing}}},
		{name: "temporary", sb: standby("s", "42", true, slot("outbox_slot", &yes, &yes, true, 0, "reserved")),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverTemporary}}},
		{name: "the standby's own", sb: standby("s", "42", true, slot("outbox_slot", &no, &no, false, 4000, "reserved")),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverNotSynced, LagBytes: 1000, LagOK: true}}},
		{name: "invalidated", sb: standby("s", "42", true, slot("outbox_slot", &yes, &yes, false, 4000, "lost")),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverInvalidated, LagBytes: 1000, LagOK: true}}},
		{name: "standby's slot not in synchronized_standby_slots", sb: with(standby("s", "42", true, synced), func(s *collect.Settings) { s.PrimarySlotName = str("standby2") }),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverUnlisted, LagBytes: 1000, LagOK: true}}},
		{name: "standby without primary_slot_name", sb: with(standby("s", "42", true, synced), func(s *collect.Settings) { s.PrimarySlotName = str("") }),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverUnlisted, LagBytes: 1000, LagOK: true}}},
		{name: "standby's primary_slot_name unknown", sb: with(standby("s", "42", true, synced), func(s *collect.Settings) { s.PrimarySlotName = nil }),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverUnlisted, LagBytes: 1000, LagOK: true}}},
		{name: "hot_standby_feedback off", sb: with(standby("s", "42", true, synced), func(s *collect.Settings) { s.HotStandbyFeedback = &no }),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverNoFeedback, LagBytes: 1000, LagOK: true}}},
		{name: "hot_standby_feedback unknown", sb: with(standby("s", "42", true, synced), func(s *collect.Settings) { s.HotStandbyFeedback = nil }),
			want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverNoFeedback, LagBytes: 1000, LagOK: true}}},
		{name: "the copy's state first", sb: with(standby("s", "42", true, slot("outbox_slot", &yes, &yes, false, 4000, "lost")), func(s *collect.Settings) {
			s.PrimarySlotName, s.HotStandbyFeedback = str("standby2"), &no
		}), want: []FailoverReport{{Slot: "outbox_slot", Standby: "s", Reason: FailoverInvalidated, LagBytes: 1000, LagOK: true}}},
		{name: "another cluster", sb: standby("s", "7", true), wantNil: true},
		{name: "standby down", sb: standby("s", "42", false), wantNil: true},
		{name: "identifier unknown", sb: standby("s", "", true), wantNil: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := failoverReadiness(&primary, []Report{primary, c.sb})
			if c.wantNil {
				if len(got) != 0 {
					t.Fatalf("got %+v, want none", got)
				}
				return
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("got %+v, want %+v", got[i], c.want[i])
				}
			}
		})
	}
	sb := standby("s", "42", true)
	if got := failoverReadiness(&sb, []Report{primary, sb}); got != nil {
		t.Errorf("a standby's own report: %+v, want none", got)
	}
}
