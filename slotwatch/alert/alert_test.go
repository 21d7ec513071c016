package alert

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

var th = Thresholds{
	LagWarnBytes: 100, LagCritBytes: 1000, LagWarnTime: time.Minute, InactiveWarnTime: time.Minute,
	InvalidationCritTime: time.Hour, XminAgeWarn: 50,
}

func i64(v int64) *int64 { return &v }
func bp(v bool) *bool    { return &v }

func slotReport(mod func(*watch.SlotReport)) watch.Report {
	s := watch.SlotReport{
		Slot:       collect.Slot{Name: "s1", Type: "logical", Plugin: "pgoutput", Database: "app", Active: true, WALStatus: "reserved", CatalogXminAge: i64(1)},
		LagBytesOK: true, LagSecondsOK: true,
	}
	if mod != nil {
		mod(&s)
	}
	minus1 := int64(-1)
	return watch.Report{Server: "db", Database: "app", Up: true, Collected: true, Slots: []watch.SlotReport{s},
		Settings: collect.Settings{MaxSlotWALKeepSize: &minus1}}
}

// TestRules checks each rule fires on its condition and only then.
func TestRules(t *testing.T) {
	tests := []struct {
		rule   string
		fire   watch.Report
		quiet  watch.Report
		labels map[string]string
	}{
		{SlotLagHigh, slotReport(func(s *watch.SlotReport) { s.LagBytes = 101 }), slotReport(func(s *watch.SlotReport) { s.LagBytes = 100 }), nil},
		{SlotLagCritical, slotReport(func(s *watch.SlotReport) { s.LagBytes = 1001 }), slotReport(func(s *watch.SlotReport) { s.LagBytes = 999 }), nil},
		{SlotLagSecondsHigh, slotReport(func(s *watch.SlotReport) { s.LagSeconds = 61 }), slotReport(func(s *watch.SlotReport) { s.LagSeconds = 59 }), nil},
		{SlotInactive, slotReport(func(s *watch.SlotReport) { s.Active = false; s.InactiveSeconds = 61 }),
			slotReport(func(s *watch.SlotReport) { s.Active = false; s.InactiveSeconds = 59 }), nil},
		{SlotWALUnreserved, slotReport(func(s *watch.SlotReport) { s.WALStatus = "unreserved" }), slotReport(func(s *watch.SlotReport) { s.WALStatus = "extended" }), nil},
		{SlotInvalidated, slotReport(func(s *watch.SlotReport) { s.WALStatus = "lost" }), slotReport(nil), map[string]string{"reason": "wal_removed"}},
		{SlotInvalidated, slotReport(func(s *watch.SlotReport) { s.InvalidationReason = "idle_timeout"; s.WALStatus = "lost" }), slotReport(nil), map[string]string{"reason": "idle_timeout"}},
		{SlotInvalidated, slotReport(func(s *watch.SlotReport) { s.Conflicting = bp(true) }), slotReport(func(s *watch.SlotReport) { s.Conflicting = bp(false) }),
			map[string]string{"reason": "rows_removed_or_wal_level_insufficient"}},
		{SlotTimeToInvalidationLow, slotReport(func(s *watch.SlotReport) {
			s.TimeToInvalidationOK = true
			s.TimeToInvalidation = 100
			s.SafeWALSize = i64(10)
		}),
			slotReport(func(s *watch.SlotReport) { s.TimeToInvalidationOK = true; s.TimeToInvalidation = 3600 }), nil},
		{SlotCatalogXminAgeHigh, slotReport(func(s *watch.SlotReport) { s.CatalogXminAge = i64(51) }), slotReport(func(s *watch.SlotReport) { s.CatalogXminAge = i64(50) }), nil},
		{RiskyConfiguration, slotReport(func(*watch.SlotReport) {}), func() watch.Report {
			r := slotReport(nil)
			r.Settings.MaxSlotWALKeepSize = i64(64 << 30)
			return r
		}(), map[string]string{"setting": "max_slot_wal_keep_size"}},
		{DatabaseUnreachable, watch.Report{Server: "db", Database: "app", Collected: true, Err: "refused"}, slotReport(nil), nil},
	}
	rules := map[string]Rule{}
	for _, r := range Rules() {
		rules[r.Name] = r
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			rule := rules[tt.rule]
			// RiskyConfiguration's fire report is the default (-1).
			if tt.rule == RiskyConfiguration {
				tt.fire.Settings.MaxSlotWALKeepSize = i64(-1)
			}
			got := rule.eval(&tt.fire, th)
			if len(got) != 1 {
				t.Fatalf("fired %d times, want once", len(got))
			}
			if got[0].summary == "" || got[0].description == "" {
				t.Errorf("no summary or description: %+v", got[0])
			}
			labels := instanceLabels(&rule, &tt.fire, &got[0])
			if labels["alertname"] != tt.rule || labels["severity"] != rule.Severity || labels["server"] != "db" || labels["database"] != "app" {
				t.Errorf("labels %v", labels)
			}
			if got[0].slot != nil && labels["slot"] != "s1" {
				t.Errorf("slot label %v", labels)
			}
			for k, v := range tt.labels {
				if labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, labels[k], v)
				}
			}
			if n := len(rule.eval(&tt.quiet, th)); n != 0 {
				t.Errorf("fired %d times below its threshold", n)
			}
		})
	}
}

func TestRecoveryNamesTheWayOut(t *testing.T) {
	for _, reason := range []string{"wal_removed", "rows_removed", "wal_level_insufficient", "idle_timeout", "rows_removed_or_wal_level_insufficient", "other"} {
		r := Recovery("outbox_slot", reason)
		if !strings.Contains(r, "pg_drop_replication_slot('outbox_slot')") || !strings.Contains(r, "re-publish") {
			t.Errorf("%s: %s", reason, r)
		}
	}
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// queued returns the alerts queued for the webhook, without delivering.
func queued(e *Engine) []Alert {
	e.webhook.mu.Lock()
	defer e.webhook.mu.Unlock()
	var out []Alert
	for _, b := range e.webhook.items {
		out = append(out, b...)
	}
	return out
}

func describe(as []Alert) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Labels["alertname"]+"/"+a.Status)
	}
	return out
}

func TestEngineForResolveRepeat(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e := New(Options{Thresholds: th, WebhookURL: "http://127.0.0.1:1/", Repeat: time.Hour, Now: c.now, Log: quietLog()}, nil)
	lagging := slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 })
	lagging.Settings.MaxSlotWALKeepSize = i64(1 << 30)
	fine := slotReport(nil)
	fine.Settings.MaxSlotWALKeepSize = i64(1 << 30)

	e.Observe(lagging) // pending
	if q := queued(e); len(q) != 0 {
		t.Fatalf("fired before its for-duration: %v", describe(q))
	}
	if a := e.Active(); len(a) != 1 || a[0].State != "pending" {
		t.Fatalf("active = %+v", a)
	}
	c.add(4 * time.Minute)
	e.Observe(lagging)
	if q := queued(e); len(q) != 0 {
		t.Fatalf("fired at 4m of a 5m for-duration")
	}
	c.add(time.Minute)
	e.Observe(lagging) // 5m: fires
	e.Observe(lagging) // no duplicate
	c.add(30 * time.Minute)
	e.Observe(lagging) // not yet repeated
	c.add(30 * time.Minute)
	e.Observe(lagging) // repeat interval reached
	c.add(time.Minute)
	e.Observe(fine) // resolves
	e.Observe(fine)
	got := describe(queued(e))
	want := []string{"SlotLagHigh/firing", "SlotLagHigh/firing", "SlotLagHigh/resolved"}
	if !slices.Equal(got, want) {
		t.Fatalf("notifications %v, want %v", got, want)
	}
	q := queued(e)
	start := c.t.Add(-66 * time.Minute)
	if !q[0].StartsAt.Equal(start) || !q[2].EndsAt.Equal(c.t) || q[0].Fingerprint != q[2].Fingerprint {
		t.Errorf("firing %+v, resolved %+v", q[0], q[2])
	}
	if len(e.Active()) != 0 {
		t.Errorf("resolved alert still active")
	}
}

func TestEngineFreezesSlotAlertsWhileDown(t *testing.T) {
	c := &clock{t: time.Now()}
	zero := time.Duration(0)
	e := New(Options{Thresholds: th, WebhookURL: "http://127.0.0.1:1/", ForOverride: &zero, Now: c.now, Log: quietLog()}, nil)
	lagging := slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 })
	e.Observe(lagging)
	down := watch.Report{Server: "db", Database: "app", Collected: true, Err: "refused", DownSince: c.t}
	c.add(time.Second)
	e.Observe(down)
	c.add(time.Second)
	e.Observe(lagging)
	got := describe(queued(e))
	want := []string{"RiskyConfiguration/firing", "SlotLagHigh/firing", "DatabaseUnreachable/firing", "DatabaseUnreachable/resolved"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("notifications %v, want %v (slot alerts neither resolve nor repeat while the server is down)", got, want)
	}
}

// receiver is a webhook or Alertmanager that can be made to fail.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	fail   int // answer the next fail requests with status
	status int
	bodies []string
	paths  []string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{status: http.StatusServiceUnavailable}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.fail > 0 {
			r.fail--
			w.WriteHeader(r.status)
			return
		}
		r.bodies = append(r.bodies, string(b))
		r.paths = append(r.paths, req.URL.Path)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runEngine(t *testing.T, e *Engine) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel
}

// A receiver briefly down loses no notification, and order is kept.
func TestWebhookRetriesUntilDelivered(t *testing.T) {
	rcv := newReceiver(t)
	rcv.fail = 4
	reg := prometheus.NewRegistry()
	zero := time.Duration(0)
	e := New(Options{Thresholds: th, WebhookURL: rcv.srv.URL + "/hook", ForOverride: &zero, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Log: quietLog()}, reg)
	runEngine(t, e)
	lagging := slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 })
	lagging.Settings.MaxSlotWALKeepSize = i64(1)
	fine := slotReport(nil)
	fine.Settings.MaxSlotWALKeepSize = i64(1)
	e.Observe(lagging)
	e.Observe(fine)
	// The receiver keeps a body before its answer reaches the engine, which
	// counts the send after: wait for both.
	waitUntil(t, 5*time.Second, func() bool { return len(rcv.got()) == 2 && counterValue(e, "webhook", "sent") == 2 })
	var msgs []WebhookMessage
	for _, b := range rcv.got() {
		var m WebhookMessage
		if err := json.Unmarshal([]byte(b), &m); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if msgs[0].Status != "firing" || msgs[1].Status != "resolved" {
		t.Fatalf("order: %s then %s", msgs[0].Status, msgs[1].Status)
	}
	m := msgs[0]
	if m.Version != "4" || m.Alerts[0].Labels["alertname"] != SlotLagHigh || !m.Alerts[0].EndsAt.IsZero() || m.GroupLabels["slot"] != "s1" {
		t.Errorf("message %+v", m)
	}
	if v := counterValue(e, "webhook", "retried"); v != 4 {
		t.Errorf("retried = %v, want 4", v)
	}
	if v := counterValue(e, "webhook", "sent"); v != 2 {
		t.Errorf("sent = %v, want 2", v)
	}
}

func TestWebhookRejectedIsNotRetried(t *testing.T) {
	rcv := newReceiver(t)
	rcv.fail, rcv.status = 1, http.StatusBadRequest
	zero := time.Duration(0)
	e := New(Options{Thresholds: th, WebhookURL: rcv.srv.URL, ForOverride: &zero, BackoffMin: time.Millisecond, Log: quietLog()}, prometheus.NewRegistry())
	runEngine(t, e)
	e.Observe(slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 }))
	waitUntil(t, 5*time.Second, func() bool { return counterValue(e, "webhook", "failed") == 1 })
	waitUntil(t, 5*time.Second, func() bool { return len(rcv.got()) == 1 }) // the next one goes through
	if v := counterValue(e, "webhook", "retried"); v != 0 {
		t.Errorf("a 400 was retried %v times", v)
	}
}

func TestFlushOnShutdown(t *testing.T) {
	rcv := newReceiver(t)
	rcv.fail = 1 << 30
	zero := time.Duration(0)
	e := New(Options{Thresholds: th, WebhookURL: rcv.srv.URL, ForOverride: &zero, BackoffMin: time.Hour, FlushTimeout: 2 * time.Second, Log: quietLog()}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	e.Observe(slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 }))
	waitUntil(t, 5*time.Second, func() bool { rcv.mu.Lock(); defer rcv.mu.Unlock(); return rcv.fail < 1<<30 })
	rcv.mu.Lock()
	rcv.fail = 0 // the receiver is back, but the engine waits an hour to retry
	rcv.mu.Unlock()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	if n := len(rcv.got()); n != 2 { // SlotLagHigh and RiskyConfiguration
		t.Fatalf("delivered %d at shutdown, want 2", n)
	}
}

func TestAlertmanagerAPI(t *testing.T) {
	rcv := newReceiver(t)
	rcv.fail = 1
	zero := time.Duration(0)
	e := New(Options{Thresholds: th, AlertmanagerURLs: []string{rcv.srv.URL}, ForOverride: &zero, Resend: 50 * time.Millisecond,
		Interval: 10 * time.Millisecond, BackoffMin: 5 * time.Millisecond, GeneratorURL: "http://slotwatch/", Log: quietLog()}, nil)
	runEngine(t, e)
	r := slotReport(func(s *watch.SlotReport) { s.LagBytes = 500 })
	r.Settings.MaxSlotWALKeepSize = i64(1)
	sent := time.Now()
	e.Observe(r)
	// The firing alert, then at least one resend.
	waitUntil(t, 5*time.Second, func() bool { return len(rcv.got()) >= 2 })
	fine := slotReport(nil)
	fine.Settings.MaxSlotWALKeepSize = i64(1)
	e.Observe(fine)
	waitUntil(t, 5*time.Second, func() bool {
		for _, b := range rcv.got() {
			if strings.Contains(b, SlotLagHigh) && !strings.Contains(b, "0001-01-01") {
				var as []postableAlert
				_ = json.Unmarshal([]byte(b), &as)
				if len(as) == 1 && !as[0].EndsAt.After(time.Now()) {
					return true // the resolved one: endsAt not in the future
				}
			}
		}
		return false
	})
	var first []postableAlert
	if err := json.Unmarshal([]byte(rcv.got()[0]), &first); err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || first[0].Labels["alertname"] != SlotLagHigh || first[0].GeneratorURL != "http://slotwatch/" ||
		!first[0].EndsAt.After(sent) || first[0].StartsAt.IsZero() {
		t.Errorf("first post %+v", first)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, p := range rcv.paths {
		if p != "/api/v2/alerts" {
			t.Errorf("posted to %s", p)
		}
	}
}

func counterValue(e *Engine, sink, result string) float64 {
	var m dto.Metric
	if err := e.metrics.total.WithLabelValues(sink, result).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestAuditFailing: the continuous audit that has not succeeded for three
// intervals (or since its start, before the first) fires AuditFailing with
// the last error; a round that succeeds resolves it.
func TestAuditFailing(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	c := &clock{t: t0}
	e := New(Options{Thresholds: th, WebhookURL: "http://127.0.0.1:1/", Now: c.now, Log: quietLog()}, nil)
	p := watch.Pipeline{AuditInterval: time.Minute, AuditStarted: t0}
	report := func() watch.Report {
		pp := p
		return watch.Report{Server: watch.PipelineServer, Time: c.now(), Up: true, Collected: true, Pipeline: &pp}
	}
	fired := func() []Alert {
		var out []Alert
		for _, a := range queued(e) {
			if a.Labels["alertname"] == AuditFailing {
				out = append(out, a)
			}
		}
		return out
	}

	// Failing from the start: quiet for three intervals, then firing.
	p.AuditFailures, p.AuditErr = 3, "read the ids of \"public\".\"outbox\": permission denied for table outbox"
	c.add(3 * time.Minute)
	e.Observe(report())
	if n := len(fired()); n != 0 {
		t.Fatalf("fired at three intervals from the start; want only past them")
	}
	c.add(time.Second)
	p.AuditFailures = 4
	e.Observe(report())
	got := fired()
	if len(got) != 1 || got[0].Status != "firing" {
		t.Fatalf("AuditFailing notifications %v; want one firing", describe(got))
	}
	a := got[0]
	if a.Labels["severity"] != Warning || a.Labels["server"] != watch.PipelineServer {
		t.Errorf("labels %v", a.Labels)
	}
	if d := a.Annotations["description"]; !strings.Contains(d, "permission denied for table outbox") || !strings.Contains(d, "4 rounds") {
		t.Errorf("description names neither the last error nor the failures: %s", d)
	}

	// A round succeeds: resolved.
	c.add(time.Minute)
	p.AuditOKAt, p.AuditFailures, p.AuditErr = c.now(), 0, ""
	e.Observe(report())
	if got := describe(fired()); !slices.Equal(got, []string{"AuditFailing/firing", "AuditFailing/resolved"}) {
		t.Fatalf("notifications %v; want firing then resolved", got)
	}

	// Failing after a success: three intervals from that success.
	p.AuditFailures, p.AuditErr = 2, "Kafka: dial tcp: connection refused"
	c.add(2 * time.Minute)
	e.Observe(report())
	c.add(time.Minute)
	e.Observe(report())
	if n := len(fired()); n != 2 {
		t.Fatalf("fired at three intervals after a success; want only past them")
	}
	c.add(time.Second)
	e.Observe(report())
	if n := len(fired()); n != 3 {
		t.Fatalf("not fired past three intervals after the last success")
	}

	// The audit off: never.
	off := watch.Pipeline{Canary: true, CanaryTimeout: time.Minute, AuditStarted: t0}
	r := watch.Report{Server: watch.PipelineServer, Time: t0.Add(time.Hour), Up: true, Pipeline: &off}
	for _, rule := range Rules() {
		if rule.Name == AuditFailing && len(rule.eval(&r, th)) != 0 {
			t.Errorf("fired with the audit off")
		}
	}
}

// TestAuditSkipped: a round that CatchUp bounded fires AuditSkipped with
// the stretch and the command that audits it, for a day.
func TestAuditSkipped(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	c := &clock{t: t0}
	e := New(Options{Thresholds: th, WebhookURL: "http://127.0.0.1:1/", Now: c.now, Log: quietLog()}, nil)
	p := watch.Pipeline{AuditInterval: time.Minute, AuditStarted: t0.Add(-time.Hour), AuditOKAt: t0}
	report := func() watch.Report {
		pp := p
		return watch.Report{Server: watch.PipelineServer, Time: c.now(), Up: true, Collected: true, Pipeline: &pp}
	}
	fired := func() []string {
		var out []string
		for _, a := range queued(e) {
			if a.Labels["alertname"] == AuditSkipped {
				out = append(out, a.Status+": "+a.Annotations["description"])
			}
		}
		return out
	}
	e.Observe(report())
	if got := fired(); len(got) != 0 {
		t.Fatalf("fired with nothing skipped: %v", got)
	}
	p.SkippedFrom, p.SkippedTo, p.SkippedAt = t0.Add(-8*time.Hour), t0.Add(-6*time.Hour), t0
	e.Observe(report())
	got := fired()
	if len(got) != 1 || !strings.HasPrefix(got[0], "firing") ||
		!strings.Contains(got[0], "slotwatch audit -since 2026-12-05T02:00:00Z -until 2026-12-05T04:00:00Z") {
		t.Fatalf("AuditSkipped %v; want one firing with the command", got)
	}
	c.add(23 * time.Hour)
	e.Observe(report())
	if got := fired(); !strings.HasPrefix(got[len(got)-1], "firing") { // repeated
		t.Fatalf("23 h after: %v; want still firing", got)
	}
	c.add(time.Hour)
	e.Observe(report())
	if got := fired(); !strings.HasPrefix(got[len(got)-1], "resolved") {
		t.Fatalf("a day after: %v; want resolved", got)
	}
}
