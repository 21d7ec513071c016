package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
)

// hook is a webhook receiver that records Alertmanager-format messages.
type hook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	msgs []alert.WebhookMessage
	raw  []string
	// down makes the receiver answer 503, as one restarting would.
	down bool
}

func newHook(t testing.TB) *hook {
	t.Helper()
	h := &hook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.down {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		var m alert.WebhookMessage
		if err := json.Unmarshal(body, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.msgs = append(h.msgs, m)
		h.raw = append(h.raw, string(body))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) messages() []alert.WebhookMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]alert.WebhookMessage(nil), h.msgs...)
}

func (h *hook) rawText() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.raw, "\n")
}

// find returns the index of the first message about alertname (and slot,
// when not empty) with the given status, or -1.
func (h *hook) find(alertname, slot, status string) (int, alert.WebhookMessage) {
	for i, m := range h.messages() {
		if len(m.Alerts) == 0 {
			continue
		}
		l := m.Alerts[0].Labels
		if l["alertname"] == alertname && (slot == "" || l["slot"] == slot) && m.Status == status {
			return i, m
		}
	}
	return -1, alert.WebhookMessage{}
}

func (h *hook) count(alertname, slot, status string) int {
	n := 0
	for _, m := range h.messages() {
		if len(m.Alerts) > 0 && m.Alerts[0].Labels["alertname"] == alertname && (slot == "" || m.Alerts[0].Labels["slot"] == slot) && m.Status == status {
			n++
		}
	}
	return n
}

func (h *hook) waitFor(t testing.TB, alertname, slot, status string, timeout time.Duration) alert.WebhookMessage {
	t.Helper()
	var m alert.WebhookMessage
	eventually(t, timeout, func() (bool, string) {
		var i int
		i, m = h.find(alertname, slot, status)
		return i >= 0, fmt.Sprintf("no %s %s notification for slot %q; got %s", status, alertname, slot, h.summary())
	})
	return m
}

func (h *hook) summary() string {
	var parts []string
	for _, m := range h.messages() {
		if len(m.Alerts) > 0 {
			parts = append(parts, fmt.Sprintf("%s/%s/%s", m.Alerts[0].Labels["alertname"], m.Alerts[0].Labels["slot"], m.Status))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// instance is a slotwatch started through run, as main would.
type instance struct {
	base string
	log  *testenv.SyncBuffer
}

// startSlotwatch runs slotwatch with env (SLOTWATCH_LISTEN is chosen here)
// until the test ends, and waits until it serves.
func startSlotwatch(t *testing.T, env map[string]string) *instance {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env["SLOTWATCH_LISTEN"] = fmt.Sprintf("127.0.0.1:%d", port)
	if _, ok := env["SLOTWATCH_LOG_LEVEL"]; !ok {
		env["SLOTWATCH_LOG_LEVEL"] = "debug"
	}
	in := &instance{base: "http://" + env["SLOTWATCH_LISTEN"], log: &testenv.SyncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, func(k string) string { return env[k] }, io.Discard, in.log)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("run did not return within 15s of cancellation")
		}
		if t.Failed() {
			t.Logf("slotwatch log:\n%s", tailString(in.log.String(), 6000))
		}
	})
	eventually(t, 10*time.Second, func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("slotwatch exited: %v\n%s", err, in.log.String())
		default:
		}
		resp, err := http.Get(in.base + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	return in
}

func (in *instance) get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(in.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape reads /metrics.
func (in *instance) scrape(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := in.get(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metric returns the value of name for the series whose labels include want.
func (in *instance) metric(t testing.TB, name string, want map[string]string) (float64, bool) {
	t.Helper()
	return value(in.scrape(t), name, want)
}

func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if have[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// exec runs statements on conn, failing the test on error.
func execAll(t testing.TB, pg *testenv.Postgres, db string, stmts ...string) {
	t.Helper()
	c := pg.Conn(t, db)
	for _, s := range stmts {
		if _, err := c.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// checkWebhookFormat checks a message has Alertmanager's webhook shape.
func checkWebhookFormat(t testing.TB, m alert.WebhookMessage, severity string) {
	t.Helper()
	if m.Version != "4" || m.Receiver == "" || !strings.HasPrefix(m.GroupKey, "{}:{") || len(m.Alerts) != 1 {
		t.Errorf("not Alertmanager's webhook shape: %+v", m)
		return
	}
	a := m.Alerts[0]
	if a.Status != m.Status {
		t.Errorf("alert status %q, message status %q", a.Status, m.Status)
	}
	for _, l := range []string{"alertname", "severity", "server"} {
		if a.Labels[l] == "" {
			t.Errorf("label %s missing: %v", l, a.Labels)
		}
	}
	if a.Labels["severity"] != severity {
		t.Errorf("severity %q, want %q", a.Labels["severity"], severity)
	}
	if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
		t.Errorf("annotations missing: %v", a.Annotations)
	}
	if a.StartsAt.IsZero() || a.Fingerprint == "" || a.GeneratorURL == "" {
		t.Errorf("startsAt, fingerprint or generatorURL missing: %+v", a)
	}
	switch m.Status {
	case "firing":
		if !a.EndsAt.IsZero() {
			t.Errorf("firing alert with endsAt %s", a.EndsAt)
		}
	case "resolved":
		if !a.EndsAt.After(a.StartsAt) {
			t.Errorf("resolved alert ends %s, not after its start %s", a.EndsAt, a.StartsAt)
		}
	default:
		t.Errorf("status %q", m.Status)
	}
}
