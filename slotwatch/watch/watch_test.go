package watch

import (
	"errors"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
)

func i64(v int64) *int64     { return &v }
func f64(v float64) *float64 { return &v }

func TestDerive(t *testing.T) {
	const pos = collect.LSN(100 << 20)
	tests := []struct {
		name       string
		slot       collect.Slot
		rate       float64
		rateOK     bool
		lag        int64
		lagOK      bool
		retained   int64
		retainedOK bool
		tti        float64
		ttiOK      bool
	}{
		{
			name: "logical lags by confirmed_flush",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: 90 << 20, RestartLSN: 80 << 20, WALStatus: "reserved", SafeWALSize: i64(40 << 20)},
			rate: 1 << 20, rateOK: true,
			lag: 10 << 20, lagOK: true, retained: 20 << 20, retainedOK: true, tti: 40, ttiOK: true,
		},
		{
			name: "physical lags by restart_lsn",
			slot: collect.Slot{Type: "physical", RestartLSN: 95 << 20, WALStatus: "reserved"},
			lag:  5 << 20, lagOK: true, retained: 5 << 20, retainedOK: true,
		},
		{
			name: "unreserved: no time left",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: 10 << 20, RestartLSN: 10 << 20, WALStatus: "unreserved", SafeWALSize: i64(-8 << 20)},
			rate: 1 << 20, rateOK: true,
			lag: 90 << 20, lagOK: true, retained: 90 << 20, retainedOK: true, tti: 0, ttiOK: true,
		},
		{
			name: "lost: nothing retained, no time left",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: 10 << 20, WALStatus: "lost"},
			lag:  90 << 20, lagOK: true, tti: 0, ttiOK: true,
		},
		{
			name: "no WAL written: infinite time",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: 99 << 20, RestartLSN: 99 << 20, WALStatus: "reserved", SafeWALSize: i64(1 << 30)},
			rate: 0, rateOK: true,
			lag: 1 << 20, lagOK: true, retained: 1 << 20, retainedOK: true, tti: math.Inf(1), ttiOK: true,
		},
		{
			name: "no limit: no time to invalidation",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: 99 << 20, RestartLSN: 99 << 20, WALStatus: "reserved"},
			rate: 1, rateOK: true,
			lag: 1 << 20, lagOK: true, retained: 1 << 20, retainedOK: true,
		},
		{
			name: "confirmed ahead of the position read before it",
			slot: collect.Slot{Type: "logical", ConfirmedFlushLSN: pos + 100, RestartLSN: pos - 10},
			lag:  0, lagOK: true, retained: 10, retainedOK: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := derive(tt.slot, pos, tt.rate, tt.rateOK)
			if r.LagBytes != tt.lag || r.LagBytesOK != tt.lagOK {
				t.Errorf("lag %d (%v), want %d (%v)", r.LagBytes, r.LagBytesOK, tt.lag, tt.lagOK)
			}
			if r.RetainedBytes != tt.retained || r.RetainedOK != tt.retainedOK {
				t.Errorf("retained %d (%v), want %d (%v)", r.RetainedBytes, r.RetainedOK, tt.retained, tt.retainedOK)
			}
			if r.TimeToInvalidationOK != tt.ttiOK || (tt.ttiOK && r.TimeToInvalidation != tt.tti) {
				t.Errorf("time to invalidation %v (%v), want %v (%v)", r.TimeToInvalidation, r.TimeToInvalidationOK, tt.tti, tt.ttiOK)
			}
		})
	}
}

func newTestServer(t *testing.T) (*Watcher, *server) {
	t.Helper()
	tgt, err := config.NewTarget("db", "postgres://u:secret@127.0.0.1:1/app")
	if err != nil {
		t.Fatal(err)
	}
	w, err := New([]config.Target{tgt}, Options{SparkPoints: 3, RateWindow: time.Minute, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return w, w.servers[0]
}

func TestUpTracksInactivityAndJoins(t *testing.T) {
	w, s := newTestServer(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	snap := func(sec int, pos collect.LSN, slots ...collect.Slot) *collect.Snapshot {
		return &collect.Snapshot{
			Time: t0.Add(time.Duration(sec) * time.Second), VersionNum: 150000, WALPosition: pos, Slots: slots,
			Senders:   []collect.Sender{{PID: 42, SentLSN: pos - 100, ApplicationName: "connector"}},
			SlotStats: map[string]collect.SlotStats{"a": {SpillBytes: 7}},
		}
	}
	idle := collect.Slot{Name: "idle", Type: "logical", ConfirmedFlushLSN: 1000}
	active := collect.Slot{Name: "a", Type: "logical", Active: true, ActivePID: 42, ConfirmedFlushLSN: 1000}
	s.up(snap(0, 1000), w.opts)
	r := s.up(snap(10, 11000, idle, active), w.opts)
	r = s.up(snap(20, 21000, idle, active), w.opts)
	byName := map[string]SlotReport{}
	for _, sl := range r.Slots {
		byName[sl.Name] = sl
	}
	if got := byName["idle"]; got.InactiveSeconds != 10 || !got.InactiveTracked {
		t.Errorf("idle: inactive %v tracked %v; want 10s since first seen inactive", got.InactiveSeconds, got.InactiveTracked)
	}
	if got := byName["idle"]; !got.LagSecondsOK || got.LagSeconds != 20 {
		t.Errorf("idle: lag %v s (ok %v), want 20 s", got.LagSeconds, got.LagSecondsOK)
	}
	if got := byName["a"]; got.InactiveSeconds != 0 || got.Sender == nil || got.SentLagBytes != 100 || got.Stats == nil || got.Stats.SpillBytes != 7 {
		t.Errorf("active slot: %+v", got)
	}
	if !r.WALRateOK || r.WALRate != 1000 {
		t.Errorf("WAL rate %v (%v), want 1000", r.WALRate, r.WALRateOK)
	}
	// 17+: the server's inactive_since wins.
	idle17 := idle
	idle17.InactiveSeconds = f64(3600)
	r = s.up(snap(30, 31000, idle17), w.opts)
	if got := r.Slots[0]; got.InactiveSeconds != 3600 || got.InactiveTracked {
		t.Errorf("17+: inactive %v tracked %v", got.InactiveSeconds, got.InactiveTracked)
	}
	// The slot became active, then inactive again: tracking restarts.
	idleAgain := idle
	idleAgain.Active = true
	s.up(snap(40, 41000, idleAgain), w.opts)
	r = s.up(snap(50, 51000, idle), w.opts)
	if got := r.Slots[0]; got.InactiveSeconds != 0 {
		t.Errorf("inactivity not reset by activity: %v", got.InactiveSeconds)
	}
	// Sparkline keeps the last SparkPoints samples.
	if n := len(r.Slots[0].Spark); n != 3 {
		t.Errorf("spark has %d points, want 3", n)
	}
	// A dropped slot forgets its state.
	s.up(snap(60, 61000), w.opts)
	if len(s.spark) != 0 || len(s.inactiveSince) != 0 {
		t.Errorf("state of dropped slots kept: %v %v", s.spark, s.inactiveSince)
	}
}

func TestDownRedactsAndRemembersSince(t *testing.T) {
	_, s := newTestServer(t)
	t0 := time.Now()
	r1 := s.down(t0, errors.New("connect to postgres://u:secret@127.0.0.1:1/app: refused"))
	r2 := s.down(t0.Add(time.Second), errors.New("still refused"))
	if r1.Up || !r1.Collected || strings.Contains(r1.Err, "secret") {
		t.Errorf("down report: %+v", r1)
	}
	if !r2.DownSince.Equal(t0) {
		t.Errorf("DownSince %v, want the first failure %v", r2.DownSince, t0)
	}
	if r1.Database != "app" || r1.Server != "db" {
		t.Errorf("labels %q %q", r1.Server, r1.Database)
	}
}
