package inbox

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports a Consumer's counters (the same ones Stats returns) as
// Prometheus metrics with the constant label group:
//
//	inbox_processed_total       records whose handler committed
//	inbox_duplicates_total      records skipped: id already processed with this payload
//	inbox_dead_lettered_total   records sent to the DLQ topic
//	inbox_id_reused_total       records whose id was processed with another payload (dead-lettered)
//	inbox_retries_total{fault}  failed attempts retried: fault="record" (counts towards
//	                            MaxAttempts), "database", "deployment" (a table, column,
//	                            function or privilege missing) or "dependency" (the
//	                            handler's Transient), the last three retried without limit
//	inbox_redriven_total        dead-lettered ids taken back by a redrive
//	inbox_cleaned_total         expired ids deleted
type collector struct {
	c                                                  *Consumer
	processed, duplicates, deadLettered, reused, clean *prometheus.Desc
	retries, redriven                                  *prometheus.Desc
}

func newCollector(c *Consumer) *collector {
	l := prometheus.Labels{"group": c.cfg.Group}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, l)
	}
	return &collector{c: c,
		processed:    d("inbox_processed_total", "Records whose handler's transaction committed."),
		duplicates:   d("inbox_duplicates_total", "Records skipped because their id was already processed with the same payload."),
		deadLettered: d("inbox_dead_lettered_total", "Records sent to the DLQ topic."),
		reused:       d("inbox_id_reused_total", "Records whose id was already processed with a different payload; each is dead-lettered, never skipped."),
		retries:      d("inbox_retries_total", "Failed attempts retried, by whose fault: record (counts towards MaxAttempts); database, deployment (a table, column, function or privilege missing) or dependency (inbox.Transient), retried without limit.", "fault"),
		clean:        d("inbox_cleaned_total", "Expired processed ids deleted."),
		redriven:     d("inbox_redriven_total", "Dead-lettered ids taken back by a record carrying the inbox.redrive header."),
	}
}

func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.processed, m.duplicates, m.deadLettered, m.reused, m.retries, m.clean, m.redriven} {
		ch <- d
	}
}

func (m *collector) Collect(ch chan<- prometheus.Metric) {
	s := m.c.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(m.processed, s.Processed)
	counter(m.duplicates, s.Duplicates)
	counter(m.deadLettered, s.DeadLettered)
	counter(m.reused, s.IDReused)
	counter(m.retries, s.Retries, faultRecord.String())
	counter(m.retries, m.c.transient.Load(), faultDB.String())
	counter(m.retries, m.c.deployment.Load(), faultDeployment.String())
	counter(m.retries, m.c.dependency.Load(), faultDependency.String())
	counter(m.clean, s.Cleaned)
	counter(m.redriven, s.Redriven)
}

// register adds the Consumer's metrics to r (nothing when r is nil).
func (c *Consumer) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	if err := r.Register(newCollector(c)); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return fmt.Errorf("inbox: Config.Registerer: a consumer of group %q is already registered there; give each its own registry or group", c.cfg.Group)
		}
		return fmt.Errorf("inbox: register metrics: %w", err)
	}
	return nil
}
