package collect

import "fmt"

// pg_replication_slots, by version. The view only gained columns from 13 to
// 18; each query names exactly the columns its version has, so a missing
// column is never an error at run time:
//
//	13: wal_status, safe_wal_size (the first version slotwatch supports)
//	14: two_phase
//	16: conflicting
//	17: inactive_since, invalidation_reason, failover, synced
//	18: two_phase_at (and invalidation_reason 'idle_timeout')
//
// Ages and durations are computed by the server, so that the clocks of
// slotwatch's host and the database's never mix.
const (
	slotsQuery13 = `SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       xmin, age(xmin) AS xmin_age, catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size
FROM pg_replication_slots
ORDER BY slot_name`

	slotsQuery14 = `SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       xmin, age(xmin) AS xmin_age, catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, two_phase
FROM pg_replication_slots
ORDER BY slot_name`

	slotsQuery16 = `SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       xmin, age(xmin) AS xmin_age, catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, two_phase, conflicting
FROM pg_replication_slots
ORDER BY slot_name`

	slotsQuery17 = `SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       xmin, age(xmin) AS xmin_age, catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, two_phase, conflicting,
       extract(epoch FROM inactive_since) AS inactive_since,
       extract(epoch FROM clock_timestamp() - inactive_since) AS inactive_seconds,
       invalidation_reason, failover, synced
FROM pg_replication_slots
ORDER BY slot_name`

	slotsQuery18 = `SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       xmin, age(xmin) AS xmin_age, catalog_xmin, age(catalog_xmin) AS catalog_xmin_age,
       restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, two_phase, two_phase_at, conflicting,
       extract(epoch FROM inactive_since) AS inactive_since,
       extract(epoch FROM clock_timestamp() - inactive_since) AS inactive_seconds,
       invalidation_reason, failover, synced
FROM pg_replication_slots
ORDER BY slot_name`
)

func slotsQuery(version int) string {
	switch {
	case version >= 180000:
		return slotsQuery18
	case version >= 170000:
		return slotsQuery17
	case version >= 160000:
		return slotsQuery16
	case version >= 140000:
		return slotsQuery14
	default:
		return slotsQuery13
	}
}

// Slot is one row of pg_replication_slots. Columns the server's version does
// not have are left at their zero value or nil.
type Slot struct {
	Name      string `json:"slot_name"`
	Plugin    string `json:"plugin,omitempty"`
	Type      string `json:"slot_type"` // physical or logical
	Database  string `json:"database,omitempty"`
	Temporary bool   `json:"temporary"`
	Active    bool   `json:"active"`
	ActivePID int64  `json:"active_pid,omitempty"`

	Xmin           string `json:"xmin,omitempty"`
	XminAge        *int64 `json:"xmin_age,omitempty"`
	CatalogXmin    string `json:"catalog_xmin,omitempty"`
	CatalogXminAge *int64 `json:"catalog_xmin_age,omitempty"`

	RestartLSN        LSN `json:"restart_lsn"`
	ConfirmedFlushLSN LSN `json:"confirmed_flush_lsn"`
	// WALStatus is reserved, extended, unreserved or lost; empty for NULL
	// (a slot that never reserved WAL).
	WALStatus string `json:"wal_status,omitempty"`
	// SafeWALSize is how many more bytes of WAL can be written before the
	// slot is in danger of "lost"; negative once it is unreserved; nil when
	// max_slot_wal_keep_size is -1 or the slot is lost.
	SafeWALSize *int64 `json:"safe_wal_size,omitempty"`

	TwoPhase   *bool `json:"two_phase,omitempty"`    // 14+
	TwoPhaseAt LSN   `json:"two_phase_at,omitempty"` // 18+
	// Conflicting (16+): on 17 and later, true when a logical slot was
	// invalidated by a conflict with recovery; on 16, true when it was
	// invalidated at all (wal_removed too, as a real 16.15 shows).
	Conflicting *bool `json:"conflicting,omitempty"`
	// InactiveSince (17+) is when the slot became inactive, Unix seconds.
	InactiveSince *float64 `json:"inactive_since,omitempty"`
	// InactiveSeconds (17+) is the server's now() - inactive_since.
	InactiveSeconds *float64 `json:"inactive_seconds,omitempty"`
	// InvalidationReason (17+): wal_removed, rows_removed,
	// wal_level_insufficient, idle_timeout (18).
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	Failover           *bool  `json:"failover,omitempty"` // 17+
	Synced             *bool  `json:"synced,omitempty"`   // 17+
}

func parseSlots(rows []row) ([]Slot, error) {
	out := make([]Slot, 0, len(rows))
	for _, r := range rows {
		p := parser{r: r}
		s := Slot{
			Name:               p.str("slot_name"),
			Plugin:             p.str("plugin"),
			Type:               p.str("slot_type"),
			Database:           p.str("database"),
			Temporary:          p.boolean("temporary"),
			Active:             p.boolean("active"),
			Xmin:               p.str("xmin"),
			XminAge:            p.int64("xmin_age"),
			CatalogXmin:        p.str("catalog_xmin"),
			CatalogXminAge:     p.int64("catalog_xmin_age"),
			RestartLSN:         p.lsn("restart_lsn"),
			ConfirmedFlushLSN:  p.lsn("confirmed_flush_lsn"),
			WALStatus:          p.str("wal_status"),
			SafeWALSize:        p.int64("safe_wal_size"),
			TwoPhase:           p.optBool("two_phase"),
			TwoPhaseAt:         p.lsn("two_phase_at"),
			Conflicting:        p.optBool("conflicting"),
			InactiveSince:      p.float("inactive_since"),
			InactiveSeconds:    p.float("inactive_seconds"),
			InvalidationReason: p.str("invalidation_reason"),
			Failover:           p.optBool("failover"),
			Synced:             p.optBool("synced"),
		}
		if pid := p.int64("active_pid"); pid != nil {
			s.ActivePID = *pid
		}
		if err := p.err(); err != nil {
			return nil, fmt.Errorf("pg_replication_slots row %q: %w", s.Name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// Invalidated says whether the slot can no longer be used, and why: the
// server's invalidation_reason (17+), else what wal_status and conflicting
// imply on older versions.
func (s *Slot) Invalidated() (bool, string) {
	switch {
	case s.InvalidationReason != "":
		return true, s.InvalidationReason
	case s.Conflicting != nil && *s.Conflicting && (s.WALStatus != "lost" || s.RestartLSN != 0):
		// 16 shows every invalidated slot as lost and every invalidated
		// logical slot as conflicting; only the removal of its WAL clears
		// the restart_lsn. Nor does 16 say which conflict it was.
		return true, "rows_removed_or_wal_level_insufficient"
	case s.WALStatus == "lost":
		return true, "wal_removed"
	}
	return false, ""
}
