package pipeline

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/route"
)

func testCanary(t testing.TB, f route.Format, started time.Time) *Canary {
	t.Helper()
	c := NewCanary(CanaryOptions{
		Topic: "outbox.event.__canary", Interval: time.Second, Timeout: time.Minute,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 }),
	})
	c.started = started
	return c
}

// canaryRecord is a canary's record as the connector writes it: key and
// id header through the router's converters.
func canaryRecord(key string, id string, f route.Format) *kgo.Record {
	enc := func(s string) []byte {
		switch f {
		case route.FormatJSON:
			return []byte(`"` + s + `"`)
		case route.FormatJSONSchema:
			return []byte(`{"schema":{"type":"string","optional":false},"payload":"` + s + `"}`)
		}
		return []byte(s)
	}
	return &kgo.Record{Key: enc(key), Headers: []kgo.RecordHeader{{Key: "id", Value: enc(id)}}}
}

// TestCanaryAge: the age is the time since the commit of the newest canary
// received; replays, strangers' canaries and late ones pruned from the
// pending set do not make it young again.
func TestCanaryAge(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	c := testCanary(t, route.FormatString, t0)
	age := func(now time.Time) time.Duration { a, _ := c.Status(now); return a }
	send := func(at time.Time) string {
		id := uuid.NewString()
		c.sent[id] = at
		return id
	}

	// Before any canary arrived, the age counts from the start.
	if got := age(t0.Add(30 * time.Second)); got != 30*time.Second {
		t.Errorf("age before the first canary = %s; want 30s", got)
	}
	// A canary committed at 10s, read at 11s: at 20s it is 10s old (its
	// commit), not 9s (its arrival).
	first := send(t0.Add(10 * time.Second))
	c.receive(canaryRecord(c.instance, first, route.FormatString), t0.Add(11*time.Second))
	if got := age(t0.Add(20 * time.Second)); got != 10*time.Second {
		t.Errorf("age after a canary = %s; want 10s from its commit", got)
	}
	// A connector crash-looping in idempotent mode publishes it again: the
	// replay proves nothing about events written now.
	c.receive(canaryRecord(c.instance, first, route.FormatString), t0.Add(100*time.Second))
	if got := age(t0.Add(100 * time.Second)); got != 90*time.Second {
		t.Errorf("age after a replay = %s; want 90s (the replay ignored)", got)
	}
	// A record with this process's key whose id is not pending (pruned,
	// or forged) does not count either.
	c.receive(canaryRecord(c.instance, uuid.NewString(), route.FormatString), t0.Add(101*time.Second))
	if got := age(t0.Add(101 * time.Second)); got != 91*time.Second {
		t.Errorf("age after an unknown id = %s; want 91s", got)
	}
	// A steady 30-minute backlog: canaries still arrive every interval,
	// but each was committed 30 minutes before.
	late := send(t0.Add(200 * time.Second))
	c.receive(canaryRecord(c.instance, late, route.FormatString), t0.Add(200*time.Second+30*time.Minute))
	if got := age(t0.Add(200*time.Second + 30*time.Minute)); got != 30*time.Minute {
		t.Errorf("age behind a 30-minute backlog = %s; want 30m", got)
	}
	// An older canary arriving after a newer one does not age the watch.
	older := send(t0.Add(150 * time.Second))
	c.receive(canaryRecord(c.instance, older, route.FormatString), t0.Add(201*time.Second+30*time.Minute))
	if got := age(t0.Add(201*time.Second + 30*time.Minute)); got != 30*time.Minute+time.Second {
		t.Errorf("age after an older canary arrived late = %s; want 30m1s (the newest commit kept)", got)
	}
	if got := value(t, c.o.Metrics.canaryReceived); got != 3 {
		t.Errorf("slotwatch_canary_received_total = %v; want 3 (replays and unknown ids not counted)", got)
	}
	if n := len(c.sent); n != 0 {
		t.Errorf("%d canaries still pending; want 0", n)
	}
}

// TestCanaryRecognizedByID: a canary is known by the event id in its id
// header, whatever the key holds (OUTBOX_ROUTE_FIELD_EVENT_KEY may name
// another column, the key converter may wrap it) and whatever the header
// converter.
func TestCanaryRecognizedByID(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, f := range []route.Format{route.FormatString, route.FormatJSON, route.FormatJSONSchema} {
		t.Run(string(f), func(t *testing.T) {
			c := testCanary(t, f, t0)
			id := uuid.NewString()
			c.sent[id] = t0.Add(5 * time.Second)
			// The key is the event type here (FIELD_EVENT_KEY=type), not
			// this process's instance.
			c.receive(canaryRecord("Canary", id, f), t0.Add(6*time.Second))
			if got, _ := c.Status(t0.Add(6 * time.Second)); got != time.Second {
				t.Errorf("age = %s; want 1s (the canary recognized by its id)", got)
			}
			// Another process's canary, any key: not ours.
			c.receive(canaryRecord(c.instance, uuid.NewString(), f), t0.Add(7*time.Second))
			if got := value(t, c.o.Metrics.canaryReceived); got != 1 {
				t.Errorf("received %v; want 1", got)
			}
		})
	}
}

// value reads a counter or gauge.
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}
