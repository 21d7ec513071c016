// Package metric exports slotwatch's reports as Prometheus metrics. It is a
// prometheus.Collector that renders the latest report of every server at
// scrape time, so a dropped slot's series vanish with it, and a server that
// cannot be reached exports slotwatch_up 0 and nothing stale.
package metric

import (
	"math"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

var (
	serverLabels = []string{"server", "database"}
	slotLabels   = []string{"server", "slot", "database", "plugin", "slot_type"}
)

// WALStatuses are the values of pg_replication_slots.wal_status, each a
// series of slotwatch_slot_wal_status.
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost"}

func desc(name, help string, labels []string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(append([]string(nil), labels...), extra...), nil)
}

var (
	upDesc             = desc("slotwatch_up", "1 when the last collection from the server succeeded, 0 when it failed (the server is down or unreachable, or slotwatch may not query it).", serverLabels)
	scrapeDurationDesc = desc("slotwatch_scrape_duration_seconds", "How long the last collection from the server took, in seconds.", serverLabels)
	versionDesc        = desc("slotwatch_server_version_num", "The server's server_version_num (150010 is 15.10).", serverLabels)
	inRecoveryDesc     = desc("slotwatch_server_in_recovery", "1 when the server is a standby (in recovery), 0 on a primary.", serverLabels)
	walPositionDesc    = desc("slotwatch_wal_position_bytes", "The current WAL position in bytes: pg_current_wal_lsn() on a primary, the last received (or replayed) position on a standby.", serverLabels)
	walRateDesc        = desc("slotwatch_wal_bytes_per_second", "WAL written per second over SLOTWATCH_RATE_WINDOW, from slotwatch's own samples of the WAL position.", serverLabels)
	walDirDesc         = desc("slotwatch_wal_dir_bytes", "Size of the WAL directory (pg_ls_waldir()); absent when slotwatch's role may not list it (grant pg_monitor).", serverLabels)
	walFilesDesc       = desc("slotwatch_wal_dir_files", "Files in the WAL directory (pg_ls_waldir()); absent when not permitted.", serverLabels)
	maxSlotKeepDesc    = desc("slotwatch_setting_max_slot_wal_keep_size_bytes", "max_slot_wal_keep_size in bytes; -1 means slots may retain unlimited WAL.", serverLabels)
	walKeepDesc        = desc("slotwatch_setting_wal_keep_size_bytes", "wal_keep_size in bytes.", serverLabels)
	maxWALDesc         = desc("slotwatch_setting_max_wal_size_bytes", "max_wal_size in bytes.", serverLabels)
	segSizeDesc        = desc("slotwatch_setting_wal_segment_size_bytes", "wal_segment_size in bytes.", serverLabels)
	idleTimeoutDesc    = desc("slotwatch_setting_idle_replication_slot_timeout_seconds", "idle_replication_slot_timeout in seconds (PostgreSQL 18+); 0 disables it.", serverLabels)

	lagBytesDesc      = desc("slotwatch_slot_lag_bytes", "WAL the slot's consumer has not confirmed: the current WAL position minus confirmed_flush_lsn (logical) or restart_lsn (physical), in bytes.", slotLabels)
	retainedDesc      = desc("slotwatch_slot_retained_wal_bytes", "WAL the slot keeps from removal: the current WAL position minus restart_lsn, in bytes; absent once restart_lsn is NULL (lost).", slotLabels)
	lagSecondsDesc    = desc("slotwatch_slot_lag_seconds", "How long ago the oldest WAL the slot has not confirmed was written, estimated from a sampled LSN-to-time history; a lower bound when older than SLOTWATCH_HISTORY or slotwatch's uptime.", slotLabels)
	activeDesc        = desc("slotwatch_slot_active", "1 when a consumer is streaming from the slot, else 0.", slotLabels)
	inactiveDesc      = desc("slotwatch_slot_inactive_seconds", "Seconds since the slot became inactive, 0 while active: from inactive_since on PostgreSQL 17+, tracked by slotwatch before (since it first saw the slot inactive).", slotLabels)
	walStatusDesc     = desc("slotwatch_slot_wal_status", "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others; no series when wal_status is NULL.", slotLabels, "status")
	safeWALDesc       = desc("slotwatch_slot_safe_wal_size_bytes", "safe_wal_size: bytes of WAL that can still be written before the slot is in danger of being lost; negative once unreserved; absent when max_slot_wal_keep_size = -1 or the slot is lost.", slotLabels)
	ttiDesc           = desc("slotwatch_slot_time_to_invalidation_seconds", "Estimated seconds until the slot is invalidated: safe_wal_size over slotwatch_wal_bytes_per_second; +Inf when no WAL is written, 0 once unreserved or invalidated; absent when max_slot_wal_keep_size = -1.", slotLabels)
	catalogXminDesc   = desc("slotwatch_slot_catalog_xmin_age", "Age in transactions of the slot's catalog_xmin (age(catalog_xmin)): how far it holds back VACUUM of the system catalogs.", slotLabels)
	xminDesc          = desc("slotwatch_slot_xmin_age", "Age in transactions of the slot's xmin (physical slots with hot_standby_feedback): how far it holds back VACUUM.", slotLabels)
	invalidatedDesc   = desc("slotwatch_slot_invalidated", "1 when the slot is invalidated (wal_status lost, invalidation_reason set, or conflicting), with the reason; else 0 with reason \"\".", slotLabels, "reason")
	conflictingDesc   = desc("slotwatch_slot_conflicting", "pg_replication_slots.conflicting (PostgreSQL 16+): 1 when a logical slot was invalidated by a conflict with recovery.", slotLabels)
	infoDesc          = desc("slotwatch_slot_info", "Always 1; labels carry the slot's temporary, two_phase, failover and synced flags (empty where the version lacks them).", slotLabels, "temporary", "two_phase", "failover", "synced")
	sentLagDesc       = desc("slotwatch_slot_sent_lag_bytes", "The current WAL position minus what the WAL sender streaming the slot has sent (pg_stat_replication.sent_lsn); absent without a sender.", slotLabels)
	replyAgeDesc      = desc("slotwatch_slot_reply_age_seconds", "Seconds since the slot's consumer last replied to its WAL sender (pg_stat_replication.reply_time); absent without a sender.", slotLabels)
	spillTxnsDesc     = desc("slotwatch_slot_spill_txns_total", "Transactions spilled to disk by logical decoding (pg_stat_replication_slots.spill_txns, 14+).", slotLabels)
	spillCountDesc    = desc("slotwatch_slot_spill_count_total", "Times transactions were spilled to disk (pg_stat_replication_slots.spill_count, 14+).", slotLabels)
	spillBytesDesc    = desc("slotwatch_slot_spill_bytes_total", "Bytes spilled to disk by logical decoding (pg_stat_replication_slots.spill_bytes, 14+).", slotLabels)
	streamTxnsDesc    = desc("slotwatch_slot_stream_txns_total", "In-progress transactions streamed to the consumer (pg_stat_replication_slots.stream_txns, 14+).", slotLabels)
	streamCountDesc   = desc("slotwatch_slot_stream_count_total", "Times in-progress transactions were streamed (pg_stat_replication_slots.stream_count, 14+).", slotLabels)
	streamBytesDesc   = desc("slotwatch_slot_stream_bytes_total", "Bytes streamed for in-progress transactions (pg_stat_replication_slots.stream_bytes, 14+).", slotLabels)
	decodedTxnsDesc   = desc("slotwatch_slot_decoded_txns_total", "Transactions decoded and sent to the output plugin (pg_stat_replication_slots.total_txns, 14+).", slotLabels)
	decodedBytesDesc  = desc("slotwatch_slot_decoded_bytes_total", "Bytes of transactions decoded (pg_stat_replication_slots.total_bytes, 14+).", slotLabels)
	failoverReadyDesc = desc("slotwatch_slot_failover_ready", "For a failover slot of a primary and each standby of it slotwatch watches (same system identifier): 1 when the standby holds a synchronized, persistent, valid copy, the primary's synchronized_standby_slots names the standby's physical slot (its primary_slot_name) and the standby runs with hot_standby_feedback on, so that a promotion now keeps the slot and Kafka holds no event the standby lacks; 0 otherwise (missing, temporary, not-synced, invalidated, standby-slot-unlisted or no-hot-standby-feedback: SlotNotFailoverReady and /slots say which; not a label, so that a copy passing through several does not start new series) (PostgreSQL 17+).", slotLabels, "standby")
	failoverLagDesc   = desc("slotwatch_slot_failover_lag_bytes", "How far the standby's copy of a failover slot is behind the primary's slot: the difference of their confirmed_flush_lsn, in bytes (never negative).", slotLabels, "standby")
	alertsDesc        = desc("slotwatch_alerts", "Alerts slotwatch evaluates itself, 1 per pending or firing instance (like Prometheus' ALERTS).", []string{"alertname", "alertstate", "severity", "server", "slot", "database"})
)

var all = []*prometheus.Desc{
	upDesc, scrapeDurationDesc, versionDesc, inRecoveryDesc, walPositionDesc, walRateDesc, walDirDesc, walFilesDesc,
	maxSlotKeepDesc, walKeepDesc, maxWALDesc, segSizeDesc, idleTimeoutDesc,
	lagBytesDesc, retainedDesc, lagSecondsDesc, activeDesc, inactiveDesc, walStatusDesc, safeWALDesc, ttiDesc,
	catalogXminDesc, xminDesc, invalidatedDesc, conflictingDesc, infoDesc, sentLagDesc, replyAgeDesc,
	spillTxnsDesc, spillCountDesc, spillBytesDesc, streamTxnsDesc, streamCountDesc, streamBytesDesc,
	decodedTxnsDesc, decodedBytesDesc, failoverReadyDesc, failoverLagDesc, alertsDesc,
}

// Names lists the names of the metrics this package exports (besides
// slotwatch_notifications_total and slotwatch_notification_queue_length,
// which the alert package registers), sorted.
func Names() []string {
	var out []string
	for _, d := range all {
		out = append(out, descName(d))
	}
	out = append(out, "slotwatch_notifications_total", "slotwatch_notification_queue_length")
	sort.Strings(out)
	return out
}

// Collector renders reports and alerts.
type Collector struct {
	reports func() []watch.Report
	alerts  func() []alert.Status
}

// New returns a collector reading the latest reports and, when alerts is
// not nil, the alerts.
func New(reports func() []watch.Report, alerts func() []alert.Status) *Collector {
	return &Collector{reports: reports, alerts: alerts}
}

// Describe sends every descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range all {
		ch <- d
	}
}

// Collect renders the latest reports.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.reports() {
		collectReport(ch, &r)
	}
	if c.alerts == nil {
		return
	}
	// Instances that differ only in labels this metric does not carry
	// (reason, setting) would collide; one series each is enough.
	seen := map[[6]string]bool{}
	for _, a := range c.alerts() {
		key := [6]string{a.Name, a.State, a.Severity, a.Labels["server"], a.Labels["slot"], a.Labels["database"]}
		if seen[key] {
			continue
		}
		seen[key] = true
		ch <- prometheus.MustNewConstMetric(alertsDesc, prometheus.GaugeValue, 1, key[:]...)
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v int64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func optBool(b *bool) string {
	if b == nil {
		return ""
	}
	if *b {
		return "true"
	}
	return "false"
}

func collectReport(ch chan<- prometheus.Metric, r *watch.Report) {
	sl := []string{r.Server, r.Database}
	gauge(ch, upDesc, b2f(r.Up), sl...)
	if !r.Up {
		return
	}
	gauge(ch, scrapeDurationDesc, r.ScrapeDuration.Seconds(), sl...)
	gauge(ch, versionDesc, float64(r.VersionNum), sl...)
	gauge(ch, inRecoveryDesc, b2f(r.InRecovery), sl...)
	gauge(ch, walPositionDesc, float64(r.WALPosition), sl...)
	if r.WALRateOK {
		gauge(ch, walRateDesc, r.WALRate, sl...)
	}
	if r.WALDir != nil {
		gauge(ch, walDirDesc, float64(r.WALDir.Bytes), sl...)
		gauge(ch, walFilesDesc, float64(r.WALDir.Files), sl...)
	}
	settings(ch, r.Settings, sl)
	for i := range r.Slots {
		slot(ch, r, &r.Slots[i])
	}
	for _, f := range r.Failover {
		for i := range r.Slots {
			s := &r.Slots[i]
			if s.Name != f.Slot {
				continue
			}
			l := []string{r.Server, s.Name, s.Database, s.Plugin, s.Type, f.Standby}
			gauge(ch, failoverReadyDesc, b2f(f.Ready), l...)
			if f.LagOK {
				gauge(ch, failoverLagDesc, float64(f.LagBytes), l...)
			}
		}
	}
}

func settings(ch chan<- prometheus.Metric, s collect.Settings, sl []string) {
	for _, x := range []struct {
		d *prometheus.Desc
		v *int64
	}{{maxSlotKeepDesc, s.MaxSlotWALKeepSize}, {walKeepDesc, s.WALKeepSize}, {maxWALDesc, s.MaxWALSize}, {segSizeDesc, s.WALSegmentSize}} {
		if x.v != nil {
			gauge(ch, x.d, float64(*x.v), sl...)
		}
	}
	if s.IdleReplicationSlotTimeout != nil {
		gauge(ch, idleTimeoutDesc, *s.IdleReplicationSlotTimeout, sl...)
	}
}

func slot(ch chan<- prometheus.Metric, r *watch.Report, s *watch.SlotReport) {
	l := []string{r.Server, s.Name, s.Database, s.Plugin, s.Type}
	if s.LagBytesOK {
		gauge(ch, lagBytesDesc, float64(s.LagBytes), l...)
	}
	if s.RetainedOK {
		gauge(ch, retainedDesc, float64(s.RetainedBytes), l...)
	}
	if s.LagSecondsOK {
		gauge(ch, lagSecondsDesc, s.LagSeconds, l...)
	}
	gauge(ch, activeDesc, b2f(s.Active), l...)
	gauge(ch, inactiveDesc, s.InactiveSeconds, l...)
	if s.WALStatus != "" {
		for _, st := range WALStatuses {
			gauge(ch, walStatusDesc, b2f(s.WALStatus == st), append(l, st)...)
		}
	}
	if s.SafeWALSize != nil {
		gauge(ch, safeWALDesc, float64(*s.SafeWALSize), l...)
	}
	if s.TimeToInvalidationOK {
		gauge(ch, ttiDesc, s.TimeToInvalidation, l...)
	}
	if s.CatalogXminAge != nil {
		gauge(ch, catalogXminDesc, float64(*s.CatalogXminAge), l...)
	}
	if s.XminAge != nil {
		gauge(ch, xminDesc, float64(*s.XminAge), l...)
	}
	bad, reason := s.Invalidated()
	gauge(ch, invalidatedDesc, b2f(bad), append(l, reason)...)
	if s.Conflicting != nil {
		gauge(ch, conflictingDesc, b2f(*s.Conflicting), l...)
	}
	gauge(ch, infoDesc, 1, append(l, optBool(&s.Temporary), optBool(s.TwoPhase), optBool(s.Failover), optBool(s.Synced))...)
	if s.Sender != nil {
		if s.Sender.SentLSN != 0 {
			gauge(ch, sentLagDesc, float64(s.SentLagBytes), l...)
		}
		if s.Sender.ReplyAge != nil && !math.IsNaN(*s.Sender.ReplyAge) {
			gauge(ch, replyAgeDesc, *s.Sender.ReplyAge, l...)
		}
	}
	if st := s.Stats; st != nil {
		counter(ch, spillTxnsDesc, st.SpillTxns, l...)
		counter(ch, spillCountDesc, st.SpillCount, l...)
		counter(ch, spillBytesDesc, st.SpillBytes, l...)
		counter(ch, streamTxnsDesc, st.StreamTxns, l...)
		counter(ch, streamCountDesc, st.StreamCount, l...)
		counter(ch, streamBytesDesc, st.StreamBytes, l...)
		counter(ch, decodedTxnsDesc, st.TotalTxns, l...)
		counter(ch, decodedBytesDesc, st.TotalBytes, l...)
	}
}
