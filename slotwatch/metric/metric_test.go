package metric

import (
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

func i64(v int64) *int64 { return &v }

func reports() []watch.Report {
	return []watch.Report{
		{
			Server: "db1", Database: "app", Up: true, Collected: true, ScrapeDuration: 20 * time.Millisecond,
			VersionNum: 150010, WALPosition: 5000, WALRate: 100, WALRateOK: true,
			WALDir:   &collect.WALDir{Bytes: 1 << 24, Files: 1},
			Settings: collect.Settings{MaxSlotWALKeepSize: i64(-1), MaxWALSize: i64(1 << 30)},
			Slots: []watch.SlotReport{
				{
					Slot: collect.Slot{Name: "outbox_slot", Plugin: "pgoutput", Type: "logical", Database: "app",
						WALStatus: "reserved", SafeWALSize: i64(1000), CatalogXminAge: i64(7)},
					LagBytes: 1234, LagBytesOK: true, RetainedBytes: 2000, RetainedOK: true,
					LagSeconds: 3.5, LagSecondsOK: true, InactiveSeconds: 60,
					TimeToInvalidation: math.Inf(1), TimeToInvalidationOK: true,
					Stats: &collect.SlotStats{SpillBytes: 10, TotalTxns: 3},
				},
				{
					Slot:     collect.Slot{Name: "gone", Type: "logical", Plugin: "pgoutput", Database: "app", Active: false, WALStatus: "lost", ConfirmedFlushLSN: 10},
					LagBytes: 4990, LagBytesOK: true, TimeToInvalidationOK: true,
				},
			},
		},
		{Server: "db2", Database: "app", Up: false, Collected: true, Err: "refused"},
	}
}

func gather(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(func() []watch.Report { return reports() }, func() []alert.Status {
		return []alert.Status{
			{Name: "SlotLagHigh", State: "firing", Severity: "warning", Labels: map[string]string{"server": "db1", "slot": "outbox_slot", "database": "app"}},
			{Name: "SlotInvalidated", State: "firing", Severity: "critical", Labels: map[string]string{"server": "db1", "slot": "gone", "database": "app", "reason": "a"}},
			{Name: "SlotInvalidated", State: "firing", Severity: "critical", Labels: map[string]string{"server": "db1", "slot": "gone", "database": "app", "reason": "b"}},
		}
	}))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func get(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, int) {
	n := 0
	v := math.NaN()
	for _, m := range fams[name].GetMetric() {
		ok := true
		for _, l := range m.GetLabel() {
			if want, has := labels[l.GetName()]; has && want != l.GetValue() {
				ok = false
			}
		}
		if !ok {
			continue
		}
		n++
		if m.Gauge != nil {
			v = m.GetGauge().GetValue()
		} else {
			v = m.GetCounter().GetValue()
		}
	}
	return v, n
}

func TestCollect(t *testing.T) {
	f := gather(t)
	slot := map[string]string{"server": "db1", "slot": "outbox_slot", "database": "app", "plugin": "pgoutput", "slot_type": "logical"}
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"slotwatch_up", map[string]string{"server": "db1"}, 1},
		{"slotwatch_up", map[string]string{"server": "db2"}, 0},
		{"slotwatch_slot_lag_bytes", slot, 1234},
		{"slotwatch_slot_retained_wal_bytes", slot, 2000},
		{"slotwatch_slot_lag_seconds", slot, 3.5},
		{"slotwatch_slot_active", slot, 0},
		{"slotwatch_slot_inactive_seconds", slot, 60},
		{"slotwatch_slot_wal_status", merge(slot, "status", "reserved"), 1},
		{"slotwatch_slot_wal_status", merge(slot, "status", "lost"), 0},
		{"slotwatch_slot_safe_wal_size_bytes", slot, 1000},
		{"slotwatch_slot_time_to_invalidation_seconds", slot, math.Inf(1)},
		{"slotwatch_slot_time_to_invalidation_seconds", map[string]string{"slot": "gone"}, 0},
		{"slotwatch_slot_catalog_xmin_age", slot, 7},
		{"slotwatch_slot_invalidated", map[string]string{"slot": "gone", "reason": "wal_removed"}, 1},
		{"slotwatch_slot_invalidated", merge(slot, "reason", ""), 0},
		{"slotwatch_slot_spill_bytes_total", slot, 10},
		{"slotwatch_slot_decoded_txns_total", slot, 3},
		{"slotwatch_wal_bytes_per_second", map[string]string{"server": "db1"}, 100},
		{"slotwatch_wal_dir_bytes", map[string]string{"server": "db1"}, 1 << 24},
		{"slotwatch_setting_max_slot_wal_keep_size_bytes", map[string]string{"server": "db1"}, -1},
		{"slotwatch_scrape_duration_seconds", map[string]string{"server": "db1"}, 0.02},
		{"slotwatch_alerts", map[string]string{"alertname": "SlotLagHigh", "alertstate": "firing", "slot": "outbox_slot"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := get(f, tt.name, tt.labels)
			if n != 1 || got != tt.want {
				t.Fatalf("%s%v = %v (%d series), want %v", tt.name, tt.labels, got, n, tt.want)
			}
		})
	}
	// A server that cannot be reached exports slotwatch_up 0 and nothing stale.
	for name, fam := range f {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "server" && l.GetValue() == "db2" && name != "slotwatch_up" {
					t.Errorf("%s exported for an unreachable server", name)
				}
			}
		}
	}
	// Alerts that differ only in labels slotwatch_alerts does not carry are one series.
	if _, n := get(f, "slotwatch_alerts", map[string]string{"alertname": "SlotInvalidated"}); n != 1 {
		t.Errorf("SlotInvalidated alerts: %d series, want 1", n)
	}
}

func merge(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range m {
		out[a] = b
	}
	return out
}

// TestNamesAndHelp checks every metric has help text and a name that says
// its unit (or is a count, flag or state).
func TestNamesAndHelp(t *testing.T) {
	unit := regexp.MustCompile(`_(bytes|seconds|total|bytes_per_second|age|num|files|length)$|^slotwatch_(up|alerts|slot_active|slot_wal_status|slot_invalidated|slot_conflicting|slot_info|server_in_recovery|slot_failover_ready)$`)
	for _, d := range all {
		name := descName(d)
		if !strings.HasPrefix(name, "slotwatch_") || !unit.MatchString(name) {
			t.Errorf("metric %s: name does not carry a unit", name)
		}
		if !regexp.MustCompile(`help: "[^"]{20,}`).MatchString(d.String()) {
			t.Errorf("metric %s: help text missing or too short", name)
		}
	}
	names := Names()
	for n := range gather(t) {
		if !slices.Contains(names, n) {
			t.Errorf("exported %s is not in Names()", n)
		}
	}
}
