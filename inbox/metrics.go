package inbox

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the counters of a group's Consumers in this process (the
// same ones Stats returns, summed) as Prometheus metrics with the constant
// label group:
//
//	inbox_processed_total         records whose handler committed
//	inbox_duplicates_total        records skipped: id already processed with this payload
//	inbox_dead_lettered_total     records sent to the DLQ topic
//	inbox_id_reused_total         records whose id was processed with another payload (dead-lettered)
//	inbox_retries_total{fault}    failed attempts retried: fault="record" (counts towards
//	                              MaxAttempts), "database", "deployment" (a table, column,
//	                              function or privilege missing) or "dependency" (the
//	                              handler's Transient), the last three retried without limit
//	inbox_redriven_total          dead-lettered ids taken back by a redrive
//	inbox_cleaned_total           expired ids deleted
//	inbox_cleanup_failures_total  cleanup runs that failed (the table stops shrinking)
//
// One collector serves every Consumer of the group registered on one
// Registerer: a member that replaces one whose Run ended (after
// ErrDeadLetterRefused, say) joins its series, which go on counting from
// where they were instead of the new Consumer being refused as "already
// registered", and members of one group run side by side are summed.
type collector struct {
	processed, duplicates, deadLettered, reused, clean, cleanFail *prometheus.Desc
	retries, redriven                                             *prometheus.Desc

	mu   sync.Mutex
	live map[*Consumer]struct{}
	gone counts // of the Consumers whose Run ended
}

// counts is a Consumer's counters at one moment.
type counts struct {
	processed, duplicates, deadLettered, reused, cleaned, cleanFail, redriven int64
	retries, transient, deployment, dependency                                int64
}

func (a counts) add(b counts) counts {
	return counts{
		processed: a.processed + b.processed, duplicates: a.duplicates + b.duplicates,
		deadLettered: a.deadLettered + b.deadLettered, reused: a.reused + b.reused,
		cleaned: a.cleaned + b.cleaned, cleanFail: a.cleanFail + b.cleanFail, redriven: a.redriven + b.redriven,
		retries: a.retries + b.retries, transient: a.transient + b.transient,
		deployment: a.deployment + b.deployment, dependency: a.dependency + b.dependency,
	}
}

func (c *Consumer) counts() counts {
	return counts{
		processed: c.processed.Load(), duplicates: c.duplicates.Load(), deadLettered: c.deadLettered.Load(),
		reused: c.reused.Load(), cleaned: c.cleaned.Load(), cleanFail: c.cleanFail.Load(), redriven: c.redriven.Load(),
		retries: c.retries.Load(), transient: c.transient.Load(), deployment: c.deployment.Load(), dependency: c.dependency.Load(),
	}
}

func newCollector(group string) *collector {
	l := prometheus.Labels{"group": group}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, l)
	}
	return &collector{live: map[*Consumer]struct{}{},
		processed:    d("inbox_processed_total", "Records whose handler's transaction committed."),
		duplicates:   d("inbox_duplicates_total", "Records skipped because their id was already processed with the same payload."),
		deadLettered: d("inbox_dead_lettered_total", "Records sent to the DLQ topic."),
		reused:       d("inbox_id_reused_total", "Records whose id was already processed with a different payload; each is dead-lettered, never skipped."),
		retries:      d("inbox_retries_total", "Failed attempts retried, by whose fault: record (counts towards MaxAttempts); database, deployment (a table, column, function or privilege missing) or dependency (inbox.Transient), retried without limit.", "fault"),
		clean:        d("inbox_cleaned_total", "Expired processed ids deleted."),
		cleanFail:    d("inbox_cleanup_failures_total", "Cleanup runs that failed; while they fail, the processed-ids table grows."),
		redriven:     d("inbox_redriven_total", "Dead-lettered ids taken back by a record carrying the inbox.redrive header."),
	}
}

func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.processed, m.duplicates, m.deadLettered, m.reused, m.retries, m.clean, m.cleanFail, m.redriven} {
		ch <- d
	}
}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	s := m.gone
	for c := range m.live {
		s = s.add(c.counts())
	}
	m.mu.Unlock()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(m.processed, s.processed)
	counter(m.duplicates, s.duplicates)
	counter(m.deadLettered, s.deadLettered)
	counter(m.reused, s.reused)
	counter(m.retries, s.retries, faultRecord.String())
	counter(m.retries, s.transient, faultDB.String())
	counter(m.retries, s.deployment, faultDeployment.String())
	counter(m.retries, s.dependency, faultDependency.String())
	counter(m.clean, s.cleaned)
	counter(m.cleanFail, s.cleanFail)
	counter(m.redriven, s.redriven)
}

// retire folds the counts of c, whose Run has ended (they no longer move),
// into the series, and stops reading c.
func (m *collector) retire(c *Consumer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.live[c]; ok {
		delete(m.live, c)
		m.gone = m.gone.add(c.counts())
	}
}

// register adds the Consumer's metrics to r (nothing when r is nil), joining
// the collector of its group already there, if any.
func (c *Consumer) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	m := newCollector(c.cfg.Group)
	if err := r.Register(m); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return fmt.Errorf("inbox: register metrics: %w", err)
		}
		existing, ok := are.ExistingCollector.(*collector)
		if !ok {
			return fmt.Errorf("inbox: Config.Registerer: metrics of group %q are already registered there by something else: %w", c.cfg.Group, err)
		}
		m = existing
	}
	m.mu.Lock()
	m.live[c] = struct{}{}
	m.mu.Unlock()
	c.metrics = m
	return nil
}
