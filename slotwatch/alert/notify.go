package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Alert is one notification of one alert instance.
type Alert struct {
	Status       string            `json:"status"` // firing or resolved
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt"`
	GeneratorURL string            `json:"generatorURL"`
	Fingerprint  string            `json:"fingerprint"`

	// validUntil is the endsAt a firing alert gets at Alertmanager.
	validUntil time.Time
}

// sink delivers one batch of alerts.
type sink interface {
	send(ctx context.Context, alerts []Alert) error
}

// deliveryError says whether retrying can help. It is decided in one place,
// httpError, from what the receiver said.
type deliveryError struct {
	err       error
	retryable bool
}

func (e *deliveryError) Error() string { return e.err.Error() }
func (e *deliveryError) Unwrap() error { return e.err }

func retryable(err error) bool {
	var de *deliveryError
	if errors.As(err, &de) {
		return de.retryable
	}
	// Network errors, timeouts, refused connections: the receiver may be
	// restarting; try again.
	return true
}

// postJSON posts body and classifies the answer: 2xx is delivered; 5xx,
// 429 and 408 are the receiver's passing trouble, so retry; any other 4xx
// means the receiver rejects this request as it is, and sending the same
// bytes again would only fail again.
func postJSON(ctx context.Context, c *http.Client, target string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return &deliveryError{err: fmt.Errorf("encode notification: %w", err)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b))
	if err != nil {
		return &deliveryError{err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "slotwatch")
	resp, err := c.Do(req)
	if err != nil {
		// url.Error prints the whole URL, which may carry a token.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post to %s: %w", hostOf(target), err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return &deliveryError{
		err:       fmt.Errorf("post to %s: %s: %s", hostOf(target), resp.Status, bytes.TrimSpace(msg)),
		retryable: resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout,
	}
}

func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(receiver)"
	}
	return u.Host
}

// queue delivers batches to one sink in order, retrying the head with
// exponential backoff until it is delivered, rejected for good, or the
// engine stops. Order matters: a resolved notification must not overtake
// the firing one.
type queue struct {
	name   string
	sink   sink
	e      *Engine
	mu     sync.Mutex
	items  [][]Alert
	wake   chan struct{}
	limit  int
	closed bool
}

func (e *Engine) newQueue(name string, s sink) *queue {
	return &queue{name: name, sink: s, e: e, wake: make(chan struct{}, 1), limit: e.opts.QueueLimit}
}

func (q *queue) push(batch []Alert) {
	q.mu.Lock()
	if len(q.items) >= q.limit {
		q.items = q.items[1:]
		q.e.metrics.inc(q.name, "dropped")
		q.e.opts.Log.Error("notification queue full; dropped the oldest notification", "sink", q.name, "limit", q.limit)
	}
	q.items = append(q.items, batch)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *queue) head() ([]Alert, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, false
	}
	return q.items[0], true
}

func (q *queue) pop() {
	q.mu.Lock()
	q.items = q.items[1:]
	q.mu.Unlock()
}

func (q *queue) run(ctx context.Context, flushTimeout time.Duration) {
	for {
		batch, ok := q.head()
		if !ok {
			select {
			case <-ctx.Done():
				q.flush(flushTimeout)
				return
			case <-q.wake:
				continue
			}
		}
		if !q.deliver(ctx, batch) {
			q.flush(flushTimeout)
			return
		}
		q.pop()
	}
}

// deliver retries batch until it is sent or rejected (true) or ctx ends
// (false).
func (q *queue) deliver(ctx context.Context, batch []Alert) bool {
	delay := q.e.opts.BackoffMin
	for attempt := 1; ; attempt++ {
		err := q.sink.send(ctx, batch)
		if err == nil {
			q.e.metrics.inc(q.name, "sent")
			if attempt > 1 {
				q.e.opts.Log.Info("notification delivered after retries", "sink", q.name, "attempts", attempt)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !retryable(err) {
			q.e.metrics.inc(q.name, "failed")
			q.e.opts.Log.Error("notification rejected by the receiver; not retrying", "sink", q.name, "err", err)
			return true
		}
		q.e.metrics.inc(q.name, "retried")
		q.e.opts.Log.Warn("notification not delivered; retrying", "sink", q.name, "attempt", attempt, "retry_in", delay.String(), "err", err)
		// Full jitter keeps several slotwatch replicas from retrying in step.
		wait := delay/2 + rand.N(delay/2+1)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		delay = min(2*delay, q.e.opts.BackoffMax)
	}
}

// flush tries once more, for at most timeout, to deliver what is queued
// when the engine stops.
func (q *queue) flush(timeout time.Duration) {
	if q.len() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		batch, ok := q.head()
		if !ok {
			return
		}
		if err := q.sink.send(ctx, batch); err != nil {
			q.e.metrics.inc(q.name, "failed")
			q.e.opts.Log.Error("notifications not delivered before shutdown", "sink", q.name, "pending", q.len(), "err", err)
			return
		}
		q.e.metrics.inc(q.name, "sent")
		q.pop()
	}
}

// deliveryMetrics count notifications by sink and result.
type deliveryMetrics struct {
	total    *prometheus.CounterVec
	queueLen func() map[string]int
}

func newDeliveryMetrics(reg prometheus.Registerer) *deliveryMetrics {
	m := &deliveryMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "slotwatch_notifications_total",
			Help: "Alert notifications by sink and result: sent, retried (an attempt failed and will be retried), failed (rejected by the receiver or undelivered at shutdown), dropped (queue full).",
		}, []string{"sink", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.total, &queueCollector{m: m})
	}
	return m
}

func (m *deliveryMetrics) inc(sink, result string) {
	if m != nil {
		m.total.WithLabelValues(sink, result).Inc()
	}
}

var queueDesc = prometheus.NewDesc("slotwatch_notification_queue_length",
	"Alert notifications waiting for delivery, by sink.", []string{"sink"}, nil)

type queueCollector struct{ m *deliveryMetrics }

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- queueDesc }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m.queueLen == nil {
		return
	}
	for name, n := range c.m.queueLen() {
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(n), name)
	}
}
