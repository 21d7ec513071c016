// Package alert evaluates slotwatch's alerts on every report, with each
// alert's for-duration, and delivers firing, repeated and resolved
// notifications to a webhook (Alertmanager's webhook JSON) and to
// Alertmanager's API v2, retrying with backoff so that a receiver that is
// briefly down loses nothing.
package alert

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// Options configure an Engine.
type Options struct {
	Thresholds Thresholds
	// ForOverride, when set, replaces every rule's for-duration.
	ForOverride *time.Duration
	// Repeat is how often a still-firing alert is sent again to the webhook
	// (default 4h).
	Repeat time.Duration
	// WebhookURL receives Alertmanager-webhook-format JSON; empty disables.
	WebhookURL string
	// AlertmanagerURLs are base URLs; alerts go to <url>/api/v2/alerts.
	AlertmanagerURLs []string
	// Resend is how often firing alerts are re-sent to Alertmanager
	// (default 1m), which resolves alerts not re-sent before their endsAt.
	Resend time.Duration
	// Interval is the evaluation interval; with Resend it sets the endsAt
	// of alerts sent to Alertmanager, as Prometheus does.
	Interval time.Duration
	// GeneratorURL links alerts back to slotwatch.
	GeneratorURL string
	// Client sends notifications (default: 10s timeout).
	Client *http.Client
	// Backoff bounds the retry delay (default 250ms doubling to 30s).
	BackoffMin, BackoffMax time.Duration
	// QueueLimit bounds each sink's undelivered notifications (default
	// 10000); past it the oldest is dropped, logged and counted.
	QueueLimit int
	// FlushTimeout bounds the delivery of what is queued at shutdown
	// (default 5s).
	FlushTimeout time.Duration
	Log          *slog.Logger
	// Now is the clock (default time.Now), for tests.
	Now func() time.Time
}

// Engine evaluates rules and owns the notification queues.
type Engine struct {
	opts  Options
	rules []Rule

	mu     sync.Mutex
	states map[string]*state

	webhook *queue
	ams     []*queue
	metrics *deliveryMetrics
}

// state is one alert instance, pending or firing.
type state struct {
	rule        *Rule
	fingerprint string
	labels      map[string]string
	annotations map[string]string
	value       float64
	activeAt    time.Time
	firing      bool
	lastSent    time.Time
}

// Status is an alert instance as the metrics and pages show it.
type Status struct {
	Name        string            `json:"alertname"`
	State       string            `json:"state"` // pending or firing
	Severity    string            `json:"severity"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       float64           `json:"value"`
}

// New builds an engine; its queues run in Run. Delivery metrics are
// registered on reg when it is not nil.
func New(opts Options, reg prometheus.Registerer) *Engine {
	if opts.Repeat <= 0 {
		opts.Repeat = 4 * time.Hour
	}
	if opts.Resend <= 0 {
		opts.Resend = time.Minute
	}
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = 250 * time.Millisecond
	}
	if opts.BackoffMax < opts.BackoffMin {
		opts.BackoffMax = max(30*time.Second, opts.BackoffMin)
	}
	if opts.QueueLimit <= 0 {
		opts.QueueLimit = 10000
	}
	if opts.FlushTimeout <= 0 {
		opts.FlushTimeout = 5 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e := &Engine{opts: opts, states: map[string]*state{}, metrics: newDeliveryMetrics(reg)}
	for _, r := range Rules() {
		if opts.ForOverride != nil {
			r.For = *opts.ForOverride
		}
		e.rules = append(e.rules, r)
	}
	if opts.WebhookURL != "" {
		e.webhook = e.newQueue("webhook", &webhookSink{url: opts.WebhookURL, client: opts.Client, externalURL: opts.GeneratorURL})
	}
	for _, u := range opts.AlertmanagerURLs {
		e.ams = append(e.ams, e.newQueue("alertmanager "+hostOf(u), &alertmanagerSink{url: u + "/api/v2/alerts", client: opts.Client}))
	}
	if e.metrics != nil {
		e.metrics.queueLen = func() map[string]int {
			out := map[string]int{}
			for _, q := range e.queues() {
				out[q.name] = q.len()
			}
			return out
		}
	}
	return e
}

// Rules returns the rules in force, for-durations as configured.
func (e *Engine) Rules() []Rule { return append([]Rule(nil), e.rules...) }

func (e *Engine) queues() []*queue {
	var qs []*queue
	if e.webhook != nil {
		qs = append(qs, e.webhook)
	}
	return append(qs, e.ams...)
}

// Run delivers notifications until ctx is done, then tries for at most
// FlushTimeout to deliver what is still queued, and returns after every
// goroutine it started has.
func (e *Engine) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, q := range e.queues() {
		g.Go(func() error {
			q.run(gctx, e.opts.FlushTimeout)
			return nil
		})
	}
	if len(e.ams) > 0 {
		g.Go(func() error {
			t := time.NewTicker(e.opts.Resend)
			defer t.Stop()
			for {
				select {
				case <-gctx.Done():
					return nil
				case <-t.C:
					e.resendToAlertmanager()
				}
			}
		})
	}
	return g.Wait()
}

// Observe evaluates every rule on a server's new report and queues the
// notifications that result. While the server is unreachable only
// DatabaseUnreachable is evaluated: the slot alerts of that server keep
// their state (neither resolve nor fire) until it answers again.
func (e *Engine) Observe(r watch.Report) {
	now := e.opts.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	present := map[string]bool{}
	for i := range e.rules {
		rule := &e.rules[i]
		if !r.Up && rule.Name != DatabaseUnreachable {
			continue
		}
		for _, f := range rule.eval(&r, e.opts.Thresholds) {
			labels := instanceLabels(rule, &r, &f)
			fp := fingerprint(labels)
			present[fp] = true
			st := e.states[fp]
			if st == nil {
				st = &state{rule: rule, fingerprint: fp, labels: labels, activeAt: now}
				e.states[fp] = st
			}
			st.value = f.value
			st.annotations = map[string]string{"summary": f.summary, "description": f.description}
			if f.recovery != "" {
				st.annotations["recovery"] = f.recovery
			}
			switch {
			case !st.firing && now.Sub(st.activeAt) >= rule.For:
				st.firing = true
				e.notify(st, now, false)
			case st.firing && now.Sub(st.lastSent) >= e.opts.Repeat:
				e.notifyWebhook(st, now, false)
			}
		}
	}
	for fp, st := range e.states {
		if st.labels["server"] != r.Server || present[fp] {
			continue
		}
		if !r.Up && st.rule.Name != DatabaseUnreachable {
			continue
		}
		if st.firing {
			e.notify(st, now, true)
		}
		delete(e.states, fp)
	}
}

// Active lists pending and firing alerts: firing first, critical first,
// then by name and labels.
func (e *Engine) Active() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Status, 0, len(e.states))
	for _, st := range e.states {
		s := Status{
			Name: st.rule.Name, Severity: st.rule.Severity, State: "pending",
			Labels: copyMap(st.labels), Annotations: copyMap(st.annotations),
			ActiveAt: st.activeAt, Value: st.value,
		}
		if st.firing {
			s.State = "firing"
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].State != out[j].State {
			return out[i].State == "firing"
		}
		if out[i].Severity != out[j].Severity {
			return out[i].Severity == Critical
		}
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return fingerprint(out[i].Labels) < fingerprint(out[j].Labels)
	})
	return out
}

// notify queues st to every sink; resolved marks its end.
func (e *Engine) notify(st *state, now time.Time, resolved bool) {
	e.notifyWebhook(st, now, resolved)
	if len(e.ams) > 0 {
		a := e.alertOf(st, now, resolved)
		for _, q := range e.ams {
			q.push([]Alert{a})
		}
	}
	what := "firing"
	if resolved {
		what = "resolved"
	}
	e.opts.Log.Info("alert "+what, "alertname", st.rule.Name, "server", st.labels["server"], "slot", st.labels["slot"], "severity", st.rule.Severity)
}

func (e *Engine) notifyWebhook(st *state, now time.Time, resolved bool) {
	st.lastSent = now
	if e.webhook != nil {
		e.webhook.push([]Alert{e.alertOf(st, now, resolved)})
	}
}

// resendToAlertmanager re-sends every firing alert, so that Alertmanager
// does not resolve them on its own once their endsAt passes.
func (e *Engine) resendToAlertmanager() {
	now := e.opts.Now()
	e.mu.Lock()
	var batch []Alert
	for _, st := range e.states {
		if st.firing {
			batch = append(batch, e.alertOf(st, now, false))
		}
	}
	e.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	for _, q := range e.ams {
		q.push(batch)
	}
}

// alertOf renders st at now. A firing alert's EndsAt is when it expires if
// not re-sent (what Alertmanager needs; webhooks show it as zero, as
// Alertmanager does); a resolved one's is now.
func (e *Engine) alertOf(st *state, now time.Time, resolved bool) Alert {
	a := Alert{
		Status:       "firing",
		Labels:       copyMap(st.labels),
		Annotations:  copyMap(st.annotations),
		StartsAt:     st.activeAt,
		GeneratorURL: e.opts.GeneratorURL,
		Fingerprint:  st.fingerprint,
	}
	if resolved {
		a.Status = "resolved"
		a.EndsAt = now
	} else {
		a.validUntil = now.Add(4 * max(e.opts.Interval, e.opts.Resend))
	}
	return a
}

// instanceLabels are an alert's identity: alertname, severity, server,
// and for slot alerts the slot's labels (the same as its metrics').
func instanceLabels(rule *Rule, r *watch.Report, f *finding) map[string]string {
	l := map[string]string{
		"alertname": rule.Name,
		"severity":  rule.Severity,
		"server":    r.Server,
	}
	if f.slot != nil {
		l["slot"] = f.slot.Name
		l["slot_type"] = f.slot.Type
		if f.slot.Database != "" {
			l["database"] = f.slot.Database
		}
		if f.slot.Plugin != "" {
			l["plugin"] = f.slot.Plugin
		}
	} else if r.Database != "" {
		l["database"] = r.Database
	}
	for k, v := range f.labels {
		l[k] = v
	}
	return l
}

// fingerprint identifies a label set (FNV-64a of the sorted pairs), in the
// 16-hex-digit form Alertmanager shows.
func fingerprint(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := fnv.New64a()
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0xff})
		h.Write([]byte(labels[k]))
		h.Write([]byte{0xff})
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
