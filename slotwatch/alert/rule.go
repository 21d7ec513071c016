package alert

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// Alert names: the alertname label, part of slotwatch's interface. The
// shipped Prometheus rules (slotwatch/rules) use the same names.
const (
	SlotLagHigh               = "SlotLagHigh"
	SlotLagCritical           = "SlotLagCritical"
	SlotLagSecondsHigh        = "SlotLagSecondsHigh"
	SlotInactive              = "SlotInactive"
	SlotWALUnreserved         = "SlotWALUnreserved"
	SlotInvalidated           = "SlotInvalidated"
	SlotTimeToInvalidationLow = "SlotTimeToInvalidationLow"
	SlotCatalogXminAgeHigh    = "SlotCatalogXminAgeHigh"
	RiskyConfiguration        = "RiskyConfiguration"
	DatabaseUnreachable       = "DatabaseUnreachable"
	SlotNotFailoverReady      = "SlotNotFailoverReady"
	PipelineStalled           = "PipelineStalled"
	EventsMissing             = "EventsMissing"
	AuditFailing              = "AuditFailing"
	AuditSkipped              = "AuditSkipped"
)

// Severities (the severity label).
const (
	Warning  = "warning"
	Critical = "critical"
)

// Thresholds are the levels the slot alerts compare against.
type Thresholds struct {
	LagWarnBytes         int64
	LagCritBytes         int64
	LagWarnTime          time.Duration
	InactiveWarnTime     time.Duration
	InvalidationCritTime time.Duration
	XminAgeWarn          int64
	FailoverLagBytes     int64
}

// Rule is one alert slotwatch evaluates on every report.
type Rule struct {
	Name     string
	Severity string
	// For is how long the condition must hold before the alert fires (its
	// default; SLOTWATCH_ALERT_FOR replaces it).
	For time.Duration
	// Condition says, for the documentation, when the alert fires.
	Condition string
	eval      func(r *watch.Report, th Thresholds) []finding
}

// finding is one instance of a rule's condition holding.
type finding struct {
	slot        *watch.SlotReport // nil for a server-wide alert
	labels      map[string]string // beyond alertname, severity and the slot's
	value       float64
	summary     string
	description string
	recovery    string
}

// Rules lists every alert with its default for-duration, in the order the
// documentation gives them.
func Rules() []Rule {
	return []Rule{
		{Name: SlotLagHigh, Severity: Warning, For: 5 * time.Minute,
			Condition: "slotwatch_slot_lag_bytes > SLOTWATCH_LAG_WARN_BYTES", eval: evalLagBytes(false)},
		{Name: SlotLagCritical, Severity: Critical, For: 5 * time.Minute,
			Condition: "slotwatch_slot_lag_bytes > SLOTWATCH_LAG_CRIT_BYTES", eval: evalLagBytes(true)},
		{Name: SlotLagSecondsHigh, Severity: Warning, For: 5 * time.Minute,
			Condition: "slotwatch_slot_lag_seconds > SLOTWATCH_LAG_WARN_TIME", eval: evalLagSeconds},
		{Name: SlotInactive, Severity: Warning, For: time.Minute,
			Condition: "slotwatch_slot_inactive_seconds > SLOTWATCH_INACTIVE_WARN_TIME", eval: evalInactive},
		{Name: SlotWALUnreserved, Severity: Critical, For: 0,
			Condition: `wal_status = 'unreserved': the next checkpoint removes WAL the slot needs`, eval: evalUnreserved},
		{Name: SlotInvalidated, Severity: Critical, For: 0,
			Condition: "wal_status = 'lost', invalidation_reason set (17+) or conflicting (16+)", eval: evalInvalidated},
		{Name: SlotTimeToInvalidationLow, Severity: Critical, For: 5 * time.Minute,
			Condition: "slotwatch_slot_time_to_invalidation_seconds < SLOTWATCH_INVALIDATION_CRIT_TIME", eval: evalTimeToInvalidation},
		{Name: SlotCatalogXminAgeHigh, Severity: Warning, For: 15 * time.Minute,
			Condition: "slotwatch_slot_catalog_xmin_age > SLOTWATCH_XMIN_AGE_WARN", eval: evalXminAge},
		{Name: RiskyConfiguration, Severity: Warning, For: 10 * time.Minute,
			Condition: "max_slot_wal_keep_size = -1: a stuck slot may fill the primary's disk", eval: evalRisky},
		{Name: DatabaseUnreachable, Severity: Critical, For: time.Minute,
			Condition: "slotwatch_up == 0: slotwatch cannot query the server", eval: evalUnreachable},
		{Name: SlotNotFailoverReady, Severity: Warning, For: 2 * time.Minute,
			Condition: "slotwatch_slot_failover_ready == 0, or slotwatch_slot_failover_lag_bytes > SLOTWATCH_FAILOVER_LAG_BYTES: a promotion of that standby now would lose the failover slot, leave Kafka with events the standby never received (its physical slot not in the primary's synchronized_standby_slots), run without slot synchronization (hot_standby_feedback off), or publish again that much", eval: evalFailover},
		{Name: PipelineStalled, Severity: Critical, For: 0,
			Condition: "slotwatch_canary_age_seconds > SLOTWATCH_CANARY_TIMEOUT: no canary event committed in that time has reached Kafka", eval: evalStalled},
		{Name: EventsMissing, Severity: Critical, For: 0,
			Condition: "slotwatch_audit_missing_events > 0: committed events older than SLOTWATCH_AUDIT_GRACE are not in Kafka", eval: evalMissing},
		{Name: AuditFailing, Severity: Warning, For: 0,
			Condition: "slotwatch_audit_age_seconds > 3 × SLOTWATCH_AUDIT_INTERVAL: no audit round succeeded in that time (since the start, before the first), so EventsMissing cannot fire", eval: evalAuditFailing},
		{Name: AuditSkipped, Severity: Warning, For: 0,
			Condition: "slotwatch_audit_skipped_seconds_total rose in the last day: a round resumed after failures would have reached back further than SLOTWATCH_AUDIT_CATCH_UP, and the events of the stretch before were audited by no round", eval: evalAuditSkipped},
	}
}

// Names lists the alert names.
func Names() []string {
	var out []string
	for _, r := range Rules() {
		out = append(out, r.Name)
	}
	return out
}

// slotWhere names a slot at the start of a sentence.
func slotWhere(r *watch.Report, s *watch.SlotReport) string {
	if s.Database != "" {
		return fmt.Sprintf("Slot %q (%s, database %s) on %s", s.Name, s.Type, s.Database, r.Server)
	}
	return fmt.Sprintf("Slot %q (%s) on %s", s.Name, s.Type, r.Server)
}

// consumer names who should be reading the slot.
func consumer(s *watch.SlotReport) string {
	if s.Type == "physical" {
		return "its standby (or pg_receivewal)"
	}
	return "its consumer (the outbox connector, for the relay's slot)"
}

func eachSlot(r *watch.Report, f func(s *watch.SlotReport) *finding) []finding {
	var out []finding
	for i := range r.Slots {
		if fd := f(&r.Slots[i]); fd != nil {
			fd.slot = &r.Slots[i]
			out = append(out, *fd)
		}
	}
	return out
}

func evalLagBytes(crit bool) func(*watch.Report, Thresholds) []finding {
	return func(r *watch.Report, th Thresholds) []finding {
		limit, level := th.LagWarnBytes, "SLOTWATCH_LAG_WARN_BYTES"
		if crit {
			limit, level = th.LagCritBytes, "SLOTWATCH_LAG_CRIT_BYTES"
		}
		return eachSlot(r, func(s *watch.SlotReport) *finding {
			if !s.LagBytesOK || s.LagBytes <= limit {
				return nil
			}
			return &finding{
				value:   float64(s.LagBytes),
				summary: fmt.Sprintf("Replication slot %s is %s behind", s.Name, Bytes(s.LagBytes)),
				description: fmt.Sprintf("%s is %s behind the current WAL position (%s: %s); PostgreSQL keeps %s of WAL for it. "+
					"Check that %s is running and confirming: its logs, its downstream (Kafka), and pg_stat_replication.",
					slotWhere(r, s), Bytes(s.LagBytes), level, Bytes(limit), Bytes(s.RetainedBytes), consumer(s)),
			}
		})
	}
}

func evalLagSeconds(r *watch.Report, th Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		if !s.LagSecondsOK || s.LagSeconds <= th.LagWarnTime.Seconds() {
			return nil
		}
		atLeast := ""
		if s.LagSecondsLowerBound {
			atLeast = "at least "
		}
		return &finding{
			value:   s.LagSeconds,
			summary: fmt.Sprintf("Replication slot %s is %s%s behind", s.Name, atLeast, Duration(s.LagSeconds)),
			description: fmt.Sprintf("%s has not confirmed WAL written %s%s ago (SLOTWATCH_LAG_WARN_TIME: %s): changes reach its consumer that late. "+
				"Check the throughput of %s and whether its downstream (Kafka) is slow or unavailable.",
				slotWhere(r, s), atLeast, Duration(s.LagSeconds), th.LagWarnTime, consumer(s)),
		}
	})
}

func evalInactive(r *watch.Report, th Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		if s.Active || s.InactiveSeconds <= th.InactiveWarnTime.Seconds() {
			return nil
		}
		return &finding{
			value:   s.InactiveSeconds,
			summary: fmt.Sprintf("Replication slot %s has had no consumer for %s", s.Name, Duration(s.InactiveSeconds)),
			description: fmt.Sprintf("%s has not been streamed for %s (SLOTWATCH_INACTIVE_WARN_TIME: %s) and holds %s of WAL. "+
				"Start %s or, if the slot is abandoned, drop it with pg_drop_replication_slot('%s') — "+
				"dropping it loses the events it has not delivered.",
				slotWhere(r, s), Duration(s.InactiveSeconds), th.InactiveWarnTime, Bytes(s.RetainedBytes), consumer(s), s.Name),
		}
	})
}

func evalUnreserved(r *watch.Report, _ Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		if s.WALStatus != "unreserved" {
			return nil
		}
		return &finding{
			value:   1,
			summary: fmt.Sprintf("Replication slot %s is about to lose its WAL", s.Name),
			description: fmt.Sprintf("%s retains %s, more than max_slot_wal_keep_size allows (wal_status unreserved): the next checkpoint removes WAL it needs "+
				"and invalidates it, skipping every event it has not delivered. Now: get %s to catch up, or raise max_slot_wal_keep_size "+
				"(ALTER SYSTEM SET max_slot_wal_keep_size = '…'; SELECT pg_reload_conf()) if the disk allows.",
				slotWhere(r, s), Bytes(s.RetainedBytes), consumer(s)),
		}
	})
}

// Recovery says what an operator does about an invalidated slot, by reason.
func Recovery(slot, reason string) string {
	common := fmt.Sprintf("The slot cannot be used again: events after its confirmed position are gone from it. "+
		"For the outbox connector's slot, run connector recover (or set OUTBOX_ON_SLOT_LOSS=recover): it drops the slot, creates it anew and re-publishes "+
		"from the outbox table every event that may not have been delivered (consumers deduplicate by event id); it refuses, saying why, when the table cannot hold them. "+
		"Another consumer's slot: drop it (SELECT pg_drop_replication_slot('%s')) and re-publish what it had not confirmed.", slot)
	switch reason {
	case "wal_removed":
		return common + " Then prevent a repeat: find why the consumer fell behind, and size max_slot_wal_keep_size for the longest outage to survive."
	case "rows_removed":
		return common + " The primary's VACUUM removed catalog rows the slot needed (on a standby): use a physical slot with hot_standby_feedback = on between primary and standby."
	case "wal_level_insufficient":
		return common + " The primary's wal_level is below logical: set wal_level = logical on the primary (restart needed) before recreating the slot."
	case "idle_timeout":
		return common + " It was inactive longer than idle_replication_slot_timeout: raise or disable that setting if the consumer may be down that long."
	case "rows_removed_or_wal_level_insufficient":
		return common + " It conflicted with recovery (the primary removed catalog rows it needed, or wal_level fell below logical): use hot_standby_feedback with a physical slot, and keep wal_level = logical on the primary."
	}
	return common
}

func evalInvalidated(r *watch.Report, _ Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		bad, reason := s.Invalidated()
		if !bad {
			return nil
		}
		return &finding{
			value:   1,
			labels:  map[string]string{"reason": reason},
			summary: fmt.Sprintf("Replication slot %s is invalidated (%s)", s.Name, reason),
			description: fmt.Sprintf("%s was invalidated, reason %s (wal_status %s): WAL or catalog rows it needed were removed and the events "+
				"after its confirmed position %s cannot be decoded from it.", slotWhere(r, s), reason, orNull(s.WALStatus), s.ConfirmedFlushLSN),
			recovery: Recovery(s.Name, reason),
		}
	})
}

func evalTimeToInvalidation(r *watch.Report, th Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		if bad, _ := s.Invalidated(); bad || !s.TimeToInvalidationOK || math.IsInf(s.TimeToInvalidation, 1) ||
			s.TimeToInvalidation >= th.InvalidationCritTime.Seconds() {
			return nil
		}
		safe := int64(0)
		if s.SafeWALSize != nil {
			safe = max(0, *s.SafeWALSize)
		}
		return &finding{
			value:   s.TimeToInvalidation,
			summary: fmt.Sprintf("Replication slot %s may be invalidated in %s", s.Name, Duration(s.TimeToInvalidation)),
			description: fmt.Sprintf("%s reaches max_slot_wal_keep_size in %s at the current WAL rate of %s/s (safe_wal_size %s, SLOTWATCH_INVALIDATION_CRIT_TIME %s); "+
				"then it is invalidated and its undelivered events skipped. Get %s to catch up, or raise max_slot_wal_keep_size.",
				slotWhere(r, s), Duration(s.TimeToInvalidation), Bytes(int64(r.WALRate)), Bytes(safe), th.InvalidationCritTime, consumer(s)),
		}
	})
}

func evalXminAge(r *watch.Report, th Thresholds) []finding {
	return eachSlot(r, func(s *watch.SlotReport) *finding {
		if s.CatalogXminAge == nil || *s.CatalogXminAge <= th.XminAgeWarn {
			return nil
		}
		return &finding{
			value:   float64(*s.CatalogXminAge),
			summary: fmt.Sprintf("Replication slot %s holds back catalog vacuum by %d transactions", s.Name, *s.CatalogXminAge),
			description: fmt.Sprintf("%s has catalog_xmin %s, %d transactions old (SLOTWATCH_XMIN_AGE_WARN: %d): VACUUM cannot remove dead catalog rows "+
				"newer than it, so catalogs bloat and, in the end, freezing is blocked. Get %s to catch up, or drop the slot if abandoned.",
				slotWhere(r, s), s.CatalogXmin, *s.CatalogXminAge, th.XminAgeWarn, consumer(s)),
		}
	})
}

func evalRisky(r *watch.Report, _ Thresholds) []finding {
	if r.Settings.MaxSlotWALKeepSize == nil || *r.Settings.MaxSlotWALKeepSize != -1 {
		return nil
	}
	return []finding{{
		labels:  map[string]string{"setting": "max_slot_wal_keep_size"},
		value:   -1,
		summary: fmt.Sprintf("%s lets replication slots retain unlimited WAL", r.Server),
		description: fmt.Sprintf("max_slot_wal_keep_size is -1 on %s (%d slots): a stuck consumer makes the primary keep WAL until its disk is full and it stops. "+
			"Set a limit the disk can hold (ALTER SYSTEM SET max_slot_wal_keep_size = '…'; SELECT pg_reload_conf()); past it the slot is invalidated "+
			"instead, which slotwatch alerts on well before.", r.Server, len(r.Slots)),
	}}
}

func evalUnreachable(r *watch.Report, _ Thresholds) []finding {
	if r.Up {
		return nil
	}
	return []finding{{
		value:   1,
		summary: fmt.Sprintf("slotwatch cannot reach %s", r.Server),
		description: fmt.Sprintf("slotwatch cannot query %s since %s: %s. Slot lag and WAL retention are unknown while it lasts; "+
			"check that the server is up and reachable and that slotwatch's role may connect.", r.Server, r.DownSince.UTC().Format(time.RFC3339), r.Err),
	}}
}

// evalFailover: a failover slot of a primary that a standby slotwatch
// watches would lose at a promotion now, or keeps too far behind.
func evalFailover(r *watch.Report, th Thresholds) []finding {
	var out []finding
	for _, f := range r.Failover {
		var s *watch.SlotReport
		for i := range r.Slots {
			if r.Slots[i].Name == f.Slot {
				s = &r.Slots[i]
			}
		}
		if s == nil || f.Ready && (!f.LagOK || f.LagBytes <= th.FailoverLagBytes) {
			continue
		}
		// The reason is not a label: a copy that passes from missing to
		// temporary to invalidated is one alert, its wait not restarted.
		fd := finding{slot: s, labels: map[string]string{"standby": f.Standby}, value: float64(f.LagBytes)}
		if f.Ready {
			fd.summary = fmt.Sprintf("Standby %s's copy of failover slot %s is %s behind", f.Standby, f.Slot, Bytes(f.LagBytes))
			fd.description = fmt.Sprintf("%s is synchronized to standby %s, but its copy there is %s behind the primary's (SLOTWATCH_FAILOVER_LAG_BYTES %s): "+
				"a promotion now continues from the copy and publishes that much WAL's events again (duplicates, which consumers deduplicate by id). "+
				"Check the standby's replay lag and its slot sync worker (sync_replication_slots, hot_standby_feedback, primary_slot_name).",
				slotWhere(r, s), f.Standby, Bytes(f.LagBytes), Bytes(th.FailoverLagBytes))
			out = append(out, fd)
			continue
		}
		fd.value = 0
		switch f.Reason {
		case watch.FailoverUnlisted:
			// The copy is there and valid, but the primary does not wait for
			// the standby: a promotion keeps the slot, not the events.
			fd.summary = fmt.Sprintf("A promotion of %s now could leave Kafka with events of failover slot %s that %s never received (%s)", f.Standby, f.Slot, f.Standby, f.Reason)
			fd.description = fmt.Sprintf("%s is synchronized to standby %s, but the primary's synchronized_standby_slots does not name the physical slot the standby streams through "+
				"(its primary_slot_name): logical decoding hands the connector changes the standby has not received yet, and after a promotion Kafka holds events whose "+
				"transactions the new primary never had. Set primary_slot_name on the standby and name that slot in synchronized_standby_slots on the primary "+
				"(ALTER SYSTEM SET synchronized_standby_slots = '<slot>'; SELECT pg_reload_conf()).", slotWhere(r, s), f.Standby)
		case watch.FailoverNoFeedback:
			fd.summary = fmt.Sprintf("Standby %s does not synchronize failover slot %s: hot_standby_feedback is off (%s)", f.Standby, f.Slot, f.Reason)
			fd.description = fmt.Sprintf("%s has a copy on standby %s, but the standby runs with hot_standby_feedback off, so it synchronizes no slot: the copy stays where it was "+
				"(a promotion continues from there and publishes everything since again), and the primary may remove catalog rows the copy needs, which invalidates it. "+
				"Set hot_standby_feedback = on on the standby.", slotWhere(r, s), f.Standby)
		default:
			why := map[string]string{
				watch.FailoverMissing: "has no copy of it: set sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name (a physical slot), and dbname in primary_conninfo on the standby, " +
					"and name that physical slot in synchronized_standby_slots on the primary; the slot must be a failover slot (OUTBOX_SLOT_FAILOVER=true)",
				watch.FailoverTemporary: "has a copy still being synchronized (temporary): the standby has not yet caught up with the slot's position, and a promotion drops such a copy",
				watch.FailoverNotSynced: "has a slot of that name of its own, not synchronized from this primary: a promotion keeps that slot, not this one; drop it on the standby",
				watch.FailoverInvalidated: "has an invalidated copy of it: the standby removed WAL or catalog rows it needed (check hot_standby_feedback and that the standby streams through " +
					"its physical slot, which synchronized_standby_slots on the primary should name)",
			}[f.Reason]
			fd.summary = fmt.Sprintf("A promotion of %s now would lose failover slot %s (%s)", f.Standby, f.Slot, f.Reason)
			fd.description = fmt.Sprintf("%s is a failover slot, but standby %s %s. The connector then recovers the slot from the outbox table "+
				"(OUTBOX_ON_SLOT_LOSS=recover) or stops (fail).", slotWhere(r, s), f.Standby, why)
		}
		out = append(out, fd)
	}
	return out
}

func orNull(s string) string {
	if s == "" {
		return "NULL"
	}
	return s
}

// Bytes formats a size for people: 1.5 GiB.
func Bytes(n int64) string {
	f := float64(n)
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for math.Abs(f) >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	s := fmt.Sprintf("%.1f", f)
	return strings.TrimSuffix(s, ".0") + " " + units[i]
}

// Duration formats seconds for people: 3h12m, 45s.
func Duration(sec float64) string {
	if math.IsInf(sec, 1) {
		return "∞"
	}
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	return fmt.Sprintf("%.1fd", d.Hours()/24)
}

// evalStalled: no canary committed within the timeout has reached Kafka
// (the age counts from the newest received canary's commit, so replays of
// old canaries and canaries behind a backlog keep it growing).
func evalStalled(r *watch.Report, _ Thresholds) []finding {
	p := r.Pipeline
	if p == nil || !p.Canary || p.CanaryAge <= p.CanaryTimeout {
		return nil
	}
	cause := ""
	if p.CanaryErr != "" {
		cause = " The canary's last error: " + p.CanaryErr + "."
	}
	return []finding{{
		value:   p.CanaryAge.Seconds(),
		summary: fmt.Sprintf("No canary event committed in the last %s has reached Kafka", p.CanaryAge.Round(time.Second)),
		description: fmt.Sprintf("slotwatch commits a canary outbox event every SLOTWATCH_CANARY_INTERVAL and reads it back from Kafka; the newest one read back was committed %s ago (timeout %s). "+
			"Events written now are not being delivered, or only behind a backlog: check that the connector runs and is the leader (its /readyz and logs), that its slot is active, "+
			"that the publication includes the outbox table, and that Kafka accepts its writes.%s", p.CanaryAge.Round(time.Second), p.CanaryTimeout, cause),
	}}
}

// evalMissing: the audit found committed events that are not in Kafka.
func evalMissing(r *watch.Report, _ Thresholds) []finding {
	p := r.Pipeline
	if p == nil || !p.Audited || p.Missing == 0 {
		return nil
	}
	return []finding{{
		value:   float64(p.Missing),
		summary: fmt.Sprintf("%d committed events are not in Kafka", p.Missing),
		description: fmt.Sprintf("The audit of %s found %d events in the outbox table that are on no routed topic and not dead-lettered, past the grace period (first: %s). "+
			"List them with `slotwatch audit -since … -until …`; publish them again with `connector backfill -from … -to …` once the cause is fixed "+
			"(a slot advanced or recreated by hand, OUTBOX_ACCEPT_SLOT_RESET, a deleted topic).", p.Window, p.Missing, strings.Join(p.Sample, ", ")),
	}}
}

// auditFailingIntervals: AuditFailing fires when no round succeeded for
// this many SLOTWATCH_AUDIT_INTERVALs; one failed round (a broker
// restarting) is not worth a page.
const auditFailingIntervals = 3

// evalAuditFailing: the continuous audit has not finished a round for
// three intervals. slotwatch_audit_missing_events keeps the last good
// round's figure meanwhile, so EventsMissing cannot fire however many
// events go missing.
func evalAuditFailing(r *watch.Report, _ Thresholds) []finding {
	p := r.Pipeline
	if p == nil {
		return nil
	}
	age := p.AuditAge(r.Time)
	if age <= auditFailingIntervals*p.AuditInterval {
		return nil
	}
	last := "since slotwatch started, before any round succeeded"
	if !p.AuditOKAt.IsZero() {
		last = "since " + p.AuditOKAt.UTC().Format(time.RFC3339) + ", the last round that succeeded"
	}
	why := "No round failed: one has been running all this time (a slow database or Kafka read)."
	if p.AuditFailures > 0 {
		why = fmt.Sprintf("%d rounds failed in a row, the last with: %s.", p.AuditFailures, p.AuditErr)
	}
	return []finding{{
		value:   age.Seconds(),
		summary: fmt.Sprintf("No audit round succeeded for %s", age.Round(time.Second)),
		description: fmt.Sprintf("slotwatch's continuous audit (every SLOTWATCH_AUDIT_INTERVAL, %s) has not finished a round for %s, %s. %s "+
			"Until one does, slotwatch_audit_missing_events and EventsMissing show that last round and say nothing of events committed since. "+
			"Check outbox_watch's grants (sql/006_watch.sql), the database and Kafka; `slotwatch audit -since …` runs the same audit and prints its error.",
			p.AuditInterval, age.Round(time.Second), last, why),
	}}
}

// auditSkippedFor is how long AuditSkipped fires after a round skipped a
// stretch: nobody can acknowledge it to slotwatch, and a day is the
// lookback of the shipped Prometheus rule (increase over 1d).
const auditSkippedFor = 24 * time.Hour

// evalAuditSkipped: a round resumed after failures was bounded by
// SLOTWATCH_AUDIT_CATCH_UP, and the stretch before its start was audited
// by no round. Only a one-shot audit covers it, and only while Kafka
// still holds its records.
func evalAuditSkipped(r *watch.Report, _ Thresholds) []finding {
	p := r.Pipeline
	if p == nil || p.SkippedAt.IsZero() || r.Time.Sub(p.SkippedAt) >= auditSkippedFor {
		return nil
	}
	from, to := p.SkippedFrom.UTC().Format(time.RFC3339Nano), p.SkippedTo.UTC().Format(time.RFC3339Nano)
	return []finding{{
		value:   p.SkippedTo.Sub(p.SkippedFrom).Seconds(),
		summary: fmt.Sprintf("No audit round covered the events created from %s to %s", from, to),
		description: fmt.Sprintf("The continuous audit failed for longer than SLOTWATCH_AUDIT_CATCH_UP; the round that resumed at %s started at that bound, and the %s of the table before it were audited by no round: "+
			"run `slotwatch audit -since %s -until %s` before Kafka's retention drops their records (then every one of them would look missing). "+
			"This alert ends a day after the skip.", p.SkippedAt.UTC().Format(time.RFC3339), p.SkippedTo.Sub(p.SkippedFrom).Round(time.Second), from, to),
	}}
}
