package watch

import (
	"slices"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
)

// FailoverReport is whether one failover slot of a primary is ready on one
// standby of it: would a promotion of that standby now keep the slot, at a
// position whose changes the standby has, and how far behind the primary's
// slot is the standby's copy. PostgreSQL 17+ synchronizes failover slots
// (created with failover = true, as the connector does with
// OUTBOX_SLOT_FAILOVER=true) to standbys that run sync_replication_slots; a
// promotion keeps only the copies that are synchronized and persistent.
// A copy alone is not enough: unless the primary's synchronized_standby_slots
// names the standby's physical slot, logical decoding hands the connector
// changes the standby has not received, and after a promotion Kafka holds
// events whose transactions the new primary never had; and without
// hot_standby_feedback the standby does not synchronize slots at all (its
// copies stay where they were, and may be invalidated).
type FailoverReport struct {
	// Slot is the primary's slot; Standby names the standby's target.
	Slot    string `json:"slot"`
	Standby string `json:"standby"`
	// Ready: the copy is there, synchronized, persistent and not
	// invalidated, the primary's synchronized_standby_slots names the
	// standby's physical slot (its primary_slot_name), and the standby
	// runs with hot_standby_feedback on; a promotion now keeps the slot,
	// and Kafka holds no event the standby lacks.
	Ready bool `json:"ready"`
	// Reason says why not: missing (no copy: sync_replication_slots off,
	// or the standby has not synchronized it yet), temporary (a copy still
	// being synchronized: its position was ahead of what the standby
	// could keep; a promotion drops it), not-synced (a slot of the
	// standby's own with that name), invalidated, standby-slot-unlisted
	// (the primary's synchronized_standby_slots does not name the
	// standby's primary_slot_name, or the standby has none),
	// no-hot-standby-feedback. The copy's own state comes first.
	Reason string `json:"reason,omitempty"`
	// LagBytes is the primary slot's confirmed_flush_lsn minus the copy's
	// (never negative; the two are read at different moments), LagOK when
	// both are known.
	LagBytes int64 `json:"lag_bytes"`
	LagOK    bool  `json:"-"`
}

// Failover reasons.
const (
	FailoverMissing     = "missing"
	FailoverTemporary   = "temporary"
	FailoverNotSynced   = "not-synced"
	FailoverInvalidated = "invalidated"
	// FailoverUnlisted: the primary does not wait for the standby before
	// decoding hands a change out (synchronized_standby_slots).
	FailoverUnlisted = "standby-slot-unlisted"
	// FailoverNoFeedback: the standby runs without hot_standby_feedback,
	// so it synchronizes no slot.
	FailoverNoFeedback = "no-hot-standby-feedback"
)

// failoverReadiness is the readiness of every failover slot of primary on
// every standby of it among others: a standby is a server in recovery with
// the primary's system identifier (a physical copy of it). Servers down,
// or whose identifier is unknown, are left out: nothing is said of them.
func failoverReadiness(primary *Report, others []Report) []FailoverReport {
	if !primary.Up || primary.InRecovery || primary.SystemID == "" {
		return nil
	}
	var out []FailoverReport
	for i := range primary.Slots {
		s := &primary.Slots[i]
		if s.Type != "logical" || s.Failover == nil || !*s.Failover {
			continue
		}
		for j := range others {
			sb := &others[j]
			if !sb.Collected || !sb.Up || !sb.InRecovery || sb.SystemID != primary.SystemID || sb.Server == primary.Server {
				continue
			}
			f := FailoverReport{Slot: s.Name, Standby: sb.Server}
			var cp *SlotReport
			for k := range sb.Slots {
				if sb.Slots[k].Name == s.Name {
					cp = &sb.Slots[k]
				}
			}
			switch {
			case cp == nil:
				f.Reason = FailoverMissing
			case cp.Synced == nil || !*cp.Synced:
				f.Reason = FailoverNotSynced
			case cp.Temporary:
				f.Reason = FailoverTemporary
			default:
				if bad, _ := cp.Invalidated(); bad {
					f.Reason = FailoverInvalidated
				} else if !waitsFor(primary, sb) {
					f.Reason = FailoverUnlisted
				} else if fb := sb.Settings.HotStandbyFeedback; fb == nil || !*fb {
					f.Reason = FailoverNoFeedback
				} else {
					f.Ready = true
				}
			}
			if cp != nil && cp.ConfirmedFlushLSN != 0 && s.ConfirmedFlushLSN != 0 {
				f.LagBytes, f.LagOK = max(0, collect.Diff(s.ConfirmedFlushLSN, cp.ConfirmedFlushLSN)), true
			}
			out = append(out, f)
		}
	}
	return out
}

// waitsFor says whether primary's synchronized_standby_slots names the
// physical slot standby streams through (its primary_slot_name): only then
// does logical decoding of a failover slot wait until the standby has
// received a change before handing it out. A standby without a
// primary_slot_name is waited for by no setting.
func waitsFor(primary, standby *Report) bool {
	name := standby.Settings.PrimarySlotName
	if name == nil || *name == "" {
		return false
	}
	return slices.Contains(primary.Settings.SynchronizedStandbySlots, *name)
}
