package watch

import (
	"math"
	"time"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
)

// Report is the latest state of one server, with everything derived from
// its snapshot: what metrics, alerts, /slots and the status page show.
type Report struct {
	// Server names the target (label "server"); Database is the database
	// its connection string names.
	Server   string `json:"server"`
	Database string `json:"database"`
	// Time is when the report was made.
	Time time.Time `json:"time"`
	// Up is false when the last collection failed; Err then says why
	// (passwords masked) and DownSince when the failures began.
	Up        bool      `json:"up"`
	Err       string    `json:"error,omitempty"`
	DownSince time.Time `json:"down_since,omitzero"`
	// Collected is false until the first collection finished.
	Collected bool `json:"-"`
	// ScrapeDuration is how long the last collection took.
	ScrapeDuration time.Duration `json:"-"`

	VersionNum  int              `json:"server_version_num,omitempty"`
	Version     string           `json:"server_version,omitempty"`
	InRecovery  bool             `json:"in_recovery"`
	WALPosition collect.LSN      `json:"wal_position"`
	Settings    collect.Settings `json:"settings"`
	WALDir      *collect.WALDir  `json:"wal_dir,omitempty"`
	// WALRate is WAL written per second over the rate window; valid when
	// WALRateOK (two samples are needed).
	WALRate   float64 `json:"wal_bytes_per_second"`
	WALRateOK bool    `json:"-"`

	Slots []SlotReport `json:"slots"`
	// SystemID is the cluster's system identifier (empty when unreadable).
	SystemID string `json:"system_identifier,omitempty"`
	// Failover is, on a primary, the readiness of each failover slot on
	// each standby of it that slotwatch watches (failover.go).
	Failover []FailoverReport `json:"failover,omitempty"`
	// Pipeline is set on the end-to-end watch's own report (server
	// "pipeline"), never on a server's.
	Pipeline *Pipeline `json:"pipeline,omitempty"`
}

// PipelineServer is the server label of the end-to-end watch's report and
// alerts: they are about the pipeline, not one server. No target may take
// the name (config.Targets refuses it).
const PipelineServer = config.PipelineServer

// Pipeline is the end-to-end watch's state: the canary and the audit.
type Pipeline struct {
	// Canary is true when the canary runs. CanaryAge is the time since the
	// commit of the newest canary read back from Kafka (since the canary
	// started, before the first); CanaryTimeout is SLOTWATCH_CANARY_TIMEOUT; CanaryErr is
	// the last error writing or reading one, if any.
	Canary        bool          `json:"canary"`
	CanaryAge     time.Duration `json:"canary_age"`
	CanaryTimeout time.Duration `json:"canary_timeout"`
	CanaryErr     string        `json:"canary_error,omitempty"`
	// Audited is true once an audit round finished; Missing counts the
	// events its last round found missing past the grace period, Sample
	// names the first of them, Window is the round's window.
	Audited bool     `json:"audited"`
	Missing int64    `json:"missing"`
	Sample  []string `json:"missing_sample,omitempty"`
	Window  string   `json:"audit_window,omitempty"`
	// AuditInterval is SLOTWATCH_AUDIT_INTERVAL (0: the continuous audit
	// is off). AuditStarted is when it started, AuditOKAt when a round
	// last succeeded (zero before the first); AuditFailures counts the
	// rounds failed in a row since, AuditErr is the last one's error.
	AuditInterval time.Duration `json:"audit_interval"`
	AuditStarted  time.Time     `json:"audit_started,omitzero"`
	AuditOKAt     time.Time     `json:"audit_last_success,omitzero"`
	AuditFailures int           `json:"audit_failures"`
	AuditErr      string        `json:"audit_error,omitempty"`
	// SkippedFrom to SkippedTo is the last stretch of the table's time
	// that no round audited (SLOTWATCH_AUDIT_CATCH_UP bounded the round
	// resumed after failures); SkippedAt is when that round ran.
	SkippedFrom time.Time `json:"audit_skipped_from,omitzero"`
	SkippedTo   time.Time `json:"audit_skipped_to,omitzero"`
	SkippedAt   time.Time `json:"audit_skipped_at,omitzero"`
}

// AuditAge is how long no audit round has succeeded at now: since the
// last success, else since the audit started; 0 when the audit is off or
// not yet started.
func (p *Pipeline) AuditAge(now time.Time) time.Duration {
	since := p.AuditOKAt
	if since.IsZero() {
		since = p.AuditStarted
	}
	if p.AuditInterval <= 0 || since.IsZero() {
		return 0
	}
	return max(0, now.Sub(since))
}

// SlotReport is one slot with the figures slotwatch derives for it.
type SlotReport struct {
	collect.Slot

	// LagBytes is the current WAL position minus confirmed_flush_lsn for a
	// logical slot, minus restart_lsn for a physical one (never negative);
	// LagBytesOK is false when that LSN is NULL.
	LagBytes   int64 `json:"lag_bytes"`
	LagBytesOK bool  `json:"-"`
	// RetainedBytes is the current WAL position minus restart_lsn: the WAL
	// the slot keeps from being removed. RetainedOK is false when
	// restart_lsn is NULL (a lost slot holds nothing any more).
	RetainedBytes int64 `json:"retained_wal_bytes"`
	RetainedOK    bool  `json:"-"`
	// LagSeconds is how long ago the oldest unconfirmed WAL was written,
	// from the LSN-to-time history; LagSecondsLowerBound is true when that
	// WAL predates the history (the lag is at least LagSeconds).
	LagSeconds           float64 `json:"lag_seconds"`
	LagSecondsOK         bool    `json:"-"`
	LagSecondsLowerBound bool    `json:"lag_seconds_lower_bound,omitempty"`
	// InactiveSeconds is 0 for an active slot; else the server's
	// inactive_since (17+) or, before 17, since slotwatch first saw it
	// inactive (InactiveTracked), a lower bound after a slotwatch restart.
	InactiveSeconds float64 `json:"inactive_seconds"`
	InactiveTracked bool    `json:"inactive_tracked_by_slotwatch,omitempty"`
	// TimeToInvalidation is safe_wal_size over the WAL rate, in seconds:
	// +Inf when no WAL is being written, 0 once unreserved; valid when
	// TimeToInvalidationOK (safe_wal_size known and a rate measured).
	TimeToInvalidation   float64 `json:"-"`
	TimeToInvalidationOK bool    `json:"-"`
	// SentLagBytes is the current WAL position minus what the WAL sender
	// streaming the slot has sent; valid when a sender is attached.
	SentLagBytes int64 `json:"sent_lag_bytes,omitempty"`

	Sender *collect.Sender    `json:"sender,omitempty"`
	Stats  *collect.SlotStats `json:"stats,omitempty"`

	// Spark is the recent lag in bytes, oldest first, for the status page.
	Spark []Point `json:"spark,omitempty"`
}

// Point is one sample of a sparkline.
type Point struct {
	Time  time.Time `json:"t"`
	Value float64   `json:"v"`
}

// derive fills a slot's figures from the server-wide ones.
func derive(s collect.Slot, walPos collect.LSN, rate float64, rateOK bool) SlotReport {
	r := SlotReport{Slot: s}
	from := s.ConfirmedFlushLSN
	if s.Type == "physical" {
		// A physical slot has no confirmed position: its consumer's progress
		// is its restart position.
		from = s.RestartLSN
	}
	if from != 0 && walPos != 0 {
		r.LagBytes, r.LagBytesOK = max(0, collect.Diff(walPos, from)), true
	}
	if s.RestartLSN != 0 && walPos != 0 {
		r.RetainedBytes, r.RetainedOK = max(0, collect.Diff(walPos, s.RestartLSN)), true
	}
	if invalid, _ := s.Invalidated(); invalid {
		r.TimeToInvalidation, r.TimeToInvalidationOK = 0, true
	} else if s.SafeWALSize != nil && rateOK {
		safe := float64(max(0, *s.SafeWALSize))
		switch {
		case safe == 0:
			r.TimeToInvalidation = 0
		case rate <= 0:
			r.TimeToInvalidation = math.Inf(1)
		default:
			r.TimeToInvalidation = safe / rate
		}
		r.TimeToInvalidationOK = true
	}
	return r
}
