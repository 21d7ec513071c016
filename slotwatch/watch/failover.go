package watch

import "github.com/pgoutbox/pgoutbox/slotwatch/collect"

// FailoverReport is whether one failover slot of a primary is ready on one
// standby of it: would a promotion of that standby now keep the slot, and
// how far behind the primary's slot is the standby's copy. PostgreSQL 17+
// synchronizes failover slots (created with failover = true, as the
// connector does with OUTBOX_SLOT_FAILOVER=true) to standbys that run
// sync_replication_slots; a promotion keeps only the copies that are
// synchronized and persistent.
type FailoverReport struct {
	// Slot is the primary's slot; Standby names the standby's target.
	Slot    string `json:"slot"`
	Standby string `json:"standby"`
	// Ready: the copy is there, synchronized, persistent and not
	// invalidated; a promotion now keeps it.
	Ready bool `json:"ready"`
	// Reason says why not: missing (no copy: sync_replication_slots off,
	// or the standby has not synchronized it yet), temporary (a copy still
	// being synchronized: its position was ahead of what the standby
	// could keep; a promotion drops it), not-synced (a slot of the
	// standby's own with that name), invalidated.
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
