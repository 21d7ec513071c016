package pipeline

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the end-to-end watch's Prometheus metrics.
type Metrics struct {
	canaryLatency  prometheus.Histogram
	canaryAge      prometheus.GaugeFunc
	canaryTimeout  prometheus.Gauge
	canarySent     prometheus.Counter
	canaryReceived prometheus.Counter
	canaryErrors   *prometheus.CounterVec

	audited       prometheus.Counter
	missing       prometheus.Gauge
	duplicated    prometheus.Gauge
	deadLettered  prometheus.Gauge
	runs          *prometheus.CounterVec
	lastSuccess   prometheus.Gauge
	duration      prometheus.Gauge
	auditAge      prometheus.GaugeFunc
	auditInterval prometheus.Gauge
	skipped       prometheus.Counter
}

// NewMetrics registers the metrics on reg; canaryAge reports the canary's
// age in seconds (slotwatch_canary_age_seconds), auditAge the time since
// an audit round last succeeded (slotwatch_audit_age_seconds).
func NewMetrics(reg prometheus.Registerer, canaryAge, auditAge func() float64) *Metrics {
	m := &Metrics{
		canaryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "slotwatch_canary_latency_seconds",
			Help:    "Time from a canary event's commit returning to its record arriving from Kafka (read_committed).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		canaryAge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "slotwatch_canary_age_seconds",
			Help: "Time since the commit of the newest canary event read back from Kafka (since the canary started, before the first).",
		}, canaryAge),
		canaryTimeout: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_canary_timeout_seconds",
			Help: "SLOTWATCH_CANARY_TIMEOUT: PipelineStalled fires when slotwatch_canary_age_seconds exceeds it.",
		}),
		canarySent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "slotwatch_canary_sent_total", Help: "Canary events committed.",
		}),
		canaryReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "slotwatch_canary_received_total", Help: "Canary events of this slotwatch read back from Kafka (each once; replays and canaries overdue by twice the timeout are not counted).",
		}),
		canaryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slotwatch_canary_errors_total", Help: "Canary failures, by operation (write, read).",
		}, []string{"op"}),
		audited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "slotwatch_audit_events_total", Help: "Events judged by audit rounds (an event is judged in every round whose window holds it).",
		}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_missing_events", Help: "Events the last audit round found in the table but not in Kafka past the grace period, and after rounds catching up a resumed stretch back to back, what all of them found, until the round after the last of them.",
		}),
		duplicated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_duplicated_events", Help: "Events the last audit round found more than once on their topic.",
		}),
		deadLettered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_dead_lettered_events", Help: "Events the last audit round found dead-lettered only: on the dead-letter topic or in the outbox_dead_letter table.",
		}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slotwatch_audit_runs_total", Help: "Audit rounds, by result (ok, error).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_last_success_timestamp_seconds", Help: "When the last audit round finished.",
		}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_duration_seconds", Help: "How long the last audit round took.",
		}),
		// slotwatch_audit_last_success_timestamp_seconds is 0 before the
		// first success, so time() minus it would fire AuditFailing at
		// every start, and the error counter cannot tell an audit that is
		// off from one whose round hangs: the age says both.
		auditAge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "slotwatch_audit_age_seconds",
			Help: "Time since an audit round last succeeded (since the continuous audit started, before the first; 0 when it is off).",
		}, auditAge),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "slotwatch_audit_skipped_seconds_total",
			Help: "Stretches of the outbox table's time that no round audited: a round resumed after failures would have reached back further than SLOTWATCH_AUDIT_CATCH_UP (AuditSkipped; slotwatch's log has the command that audits them).",
		}),
		auditInterval: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "slotwatch_audit_interval_seconds",
			Help: "SLOTWATCH_AUDIT_INTERVAL (0: the continuous audit is off): AuditFailing fires when slotwatch_audit_age_seconds exceeds three of it.",
		}),
	}
	m.canaryErrors.WithLabelValues("write")
	m.canaryErrors.WithLabelValues("read")
	m.runs.WithLabelValues("ok")
	m.runs.WithLabelValues("error")
	if reg != nil {
		reg.MustRegister(m.canaryLatency, m.canaryAge, m.canaryTimeout, m.canarySent, m.canaryReceived, m.canaryErrors,
			m.audited, m.missing, m.duplicated, m.deadLettered, m.runs, m.lastSuccess, m.duration, m.auditAge, m.auditInterval, m.skipped)
	}
	return m
}

// Names lists the metric names, for the documentation check.
func Names() []string {
	reg := prometheus.NewRegistry()
	NewMetrics(reg, func() float64 { return 0 }, func() float64 { return 0 })
	fams, _ := reg.Gather()
	var out []string
	for _, f := range fams {
		out = append(out, f.GetName())
	}
	sort.Strings(out)
	return out
}
