package publish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/pgoutbox/pgoutbox/route"
)

// refusingRegistry is an Avro router over a fake registry that, once
// refuse is set, answers status to every request about a subject naming
// late (the first topic's schema is known by then), and sets refused.
func refusingRegistry(t testing.TB, late string, status int) (router *route.Router, refuse, refused *atomic.Bool) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	refuse, refused = new(atomic.Bool), new(atomic.Bool)
	reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if !refuse.Load() || !strings.Contains(r.URL.Path, late) {
			return false
		}
		refused.Store(true)
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error_code":` + map[int]string{503: "50003", 409: "409"}[status] + `,"message":"injected"}`))
		return true
	})
	rcfg := route.DefaultConfig()
	rcfg.ValueFormat = route.FormatAvro
	rcfg.RegistryURLs = []string{reg.URL()}
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	return router, refuse, refused
}

// TestRegistryWaitCommitsFirst: an event whose schema the registry cannot
// take now (down: 503; or refusing it: 409 incompatible) waits, retried,
// never a dead letter; the events routed before it in the open Kafka
// transaction are committed before the wait, so that read_committed
// consumers have them at once and no transaction stays open through the
// outage (the broker would abort it at its timeout). When the registry
// answers again, the waiting event and those after it follow, in order.
func TestRegistryWaitCommitsFirst(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		pipeline bool
		logged   string
		class    route.ErrorClass
	}{
		{"registry down", http.StatusServiceUnavailable, false, "routing needs the schema registry, which failed; retrying", route.ClassRegistry},
		{"registry down, pipelined", http.StatusServiceUnavailable, true, "routing needs the schema registry, which failed; retrying", route.ClassRegistry},
		{"schema refused as incompatible", http.StatusConflict, false, "the schema registry refused the event's schema", route.ClassSchemaRejected},
		{"schema refused as incompatible, pipelined", http.StatusConflict, true, "the schema registry refused the event's schema", route.ClassSchemaRejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// franz-go's race (endCommit) may end the session as designed
			// when a lane's first record goes to a topic that lane's client
			// never produced to: a relay starts another session from the
			// confirmed position, this test has only one, so it runs the
			// case again (seen once in CI, 0 in 60 runs alone).
			for attempt := 1; ; attempt++ {
				if !registryWaitCase(t, tc.status, tc.pipeline, tc.logged, tc.class) {
					return
				}
				if attempt == 3 {
					t.Fatal("franz-go ended the commit as an abort in three runs in a row")
				}
				t.Logf("run %d: franz-go ended the commit as an abort (the session ended, as designed); running the case again", attempt)
			}
		})
	}
}

// registryWaitCase is one run of a TestRegistryWaitCommitsFirst case; it
// reports whether franz-go's commit race ended the session.
func registryWaitCase(t *testing.T, status int, pipeline bool, logged string, class route.ErrorClass) (raced bool) {
	t.Helper()
	tc := struct {
		status   int
		pipeline bool
		logged   string
		class    route.ErrorClass
	}{status, pipeline, logged, class}
	aggType := "reg" + uniq()
	late := aggType + "Late"
	// The topics exist before the first transaction: one created
	// within it was once counted by no partition added, and the
	// session ended (a relay starts another; this test has one).
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event."+aggType, "outbox.event."+late, "dlq."+aggType))
	router, refuse, refused := refusingRegistry(t, late, tc.status)
	db := newFakeDeadLetters()
	var reasons []string
	var rmu sync.Mutex
	blockedHook := func(reason string) { rmu.Lock(); reasons = append(reasons, reason); rmu.Unlock() }
	s := newSession(t, brokers, Config{Transactional: true, TxnInterval: time.Hour, TxnMaxRecords: 1000, TopicCreate: true, DLQTopic: "dlq." + aggType, Blocked: blockedHook},
		sessionOpts{router: router, db: db, pipeline: tc.pipeline}).start()

	// The first topic's schema is registered (auto.register.schemas)
	// and its records committed.
	s.send(100, eventRow("id", "e1", aggType, "a", `{"n":1}`, 90, 100))
	s.send(200, eventRow("id", "e2", aggType, "a", `{"n":2}`, 190, 200))
	refuse.Store(true)
	// One PostgreSQL transaction: an event that routes (its
	// schema known), then one whose subject the registry refuses,
	// then one more.
	s.send(300,
		eventRow("id", "e3", aggType, "a", `{"n":3}`, 210, 300),
		eventRow("id", "e4", late, "b", `{"n":4}`, 220, 300),
		eventRow("id", "e5", aggType, "a", `{"n":5}`, 230, 300))
	deadline := time.Now().Add(10 * time.Second)
	for !refused.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !refused.Load() {
		if s.raced() {
			return true
		}
		t.Fatal("the registry was never asked for the second topic's schema")
	}
	// e3 is in Kafka for read_committed consumers while e4 waits:
	// committed (a transaction left open fails committed()).
	got := ids(committed(t, brokers, "outbox.event."+aggType))
	if want := []string{"e1", "e2", "e3"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("committed while the registry refuses: %v, want %v", got, want)
	}
	if s.tr.Acked() >= 300 {
		t.Fatalf("transaction 300 acked (%d) while one of its events waits for the registry", s.tr.Acked())
	}
	time.Sleep(500 * time.Millisecond) // a few retries
	refuse.Store(false)
	if !s.waitAcked(300, 20*time.Second) {
		if s.raced() {
			return true
		}
		t.Fatalf("transaction 300 not acked after the registry answered: acked %d", s.tr.Acked())
	}
	if err := s.close(); err != nil {
		t.Fatalf("producer: %v", err)
	}
	if got := ids(committed(t, brokers, "outbox.event."+aggType)); strings.Join(got, ",") != "e1,e2,e3,e5" {
		t.Fatalf("first topic: %v, want e1,e2,e3,e5", got)
	}
	if got := ids(committed(t, brokers, "outbox.event."+late)); strings.Join(got, ",") != "e4" {
		t.Fatalf("second topic: %v, want e4", got)
	}
	if n := db.count(); n != 0 {
		t.Fatalf("%d dead letters in the table; want none", n)
	}
	var m dto.Metric
	if err := s.m.RouteRetries.WithLabelValues(string(tc.class)).Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n < 2 {
		t.Fatalf("outbox_connector_route_retries_total{class=%q} %v after half a second of retries; want at least 2", tc.class, n)
	}
	// /healthz said why the line waited, and stopped saying it.
	rmu.Lock()
	said := append([]string(nil), reasons...)
	rmu.Unlock()
	if len(said) < 2 || !strings.Contains(said[0], "schema registry") || said[len(said)-1] != "" {
		t.Fatalf("Blocked hook told %q; want the wait's reason, then \"\" once it passed", said)
	}
	if !strings.Contains(s.log.String(), tc.logged) {
		t.Fatalf("log lacks %q:\n%s", tc.logged, s.log.String())
	}
	return false
}

// TestRegistryWaitSettlesCommitInFlight: pipelined, a commit in flight when
// an event starts waiting for the registry is settled before the wait, so
// its records, committed in Kafka, are acked (and confirmed to PostgreSQL)
// and a failure of it is seen at once, not after the outage. Found by the
// review of the wait; it failed before (transaction 200 not acked).
func TestRegistryWaitSettlesCommitInFlight(t *testing.T) {
	aggType := "reg" + uniq()
	late := aggType + "Late"
	_, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event."+aggType, "outbox.event."+late, "dlq."+aggType))
	router, refuse, refused := refusingRegistry(t, late, http.StatusServiceUnavailable)
	s := newSession(t, brokers, Config{Transactional: true, TxnInterval: time.Hour, TxnMaxRecords: 1000, TopicCreate: true, DLQTopic: "dlq." + aggType},
		sessionOpts{router: router, db: newFakeDeadLetters(), pipeline: true}).start()
	s.send(100, eventRow("id", "e1", aggType, "a", `{"n":1}`, 90, 100))
	if !s.waitAcked(100, 10*time.Second) {
		t.Fatal("100 not acked")
	}
	refuse.Store(true)
	s.send(200, eventRow("id", "e2", aggType, "a", `{"n":2}`, 190, 200))
	s.send(300, eventRow("id", "e4", late, "b", `{"n":4}`, 290, 300))
	deadline := time.Now().Add(10 * time.Second)
	for !refused.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ids(committed(t, brokers, "outbox.event."+aggType)); strings.Join(got, ",") != "e1,e2" {
		t.Fatalf("committed: %v", got)
	}
	ok := s.waitAcked(200, 3*time.Second)
	refuse.Store(false)
	if !ok {
		t.Errorf("e2 is committed in Kafka but transaction 200 is not acked after 3 s of registry wait (acked %d): the pipelined commit in flight is not settled while an event waits", s.tr.Acked())
	}
	s.waitAcked(300, 20*time.Second)
	if err := s.close(); err != nil {
		t.Fatalf("producer: %v", err)
	}
}

// TestGraverLogsTheOther: of two errors of one failure the session ends
// with the graver, and the other is logged, not dropped (found by the
// review of issue 16); a stop's own cancellation is not worth a line.
func TestGraverLogsTheOther(t *testing.T) {
	lb := newLogBuffer(t)
	p := &Producer{log: lb.logger()}
	fenced := fmt.Errorf("%w: commit", ErrFenced)
	commitFailed := errors.New("the commit in flight failed: NOT_COORDINATOR")
	if got := p.graver(commitFailed, fenced); got != fenced {
		t.Fatalf("graver: %v", got)
	}
	if !strings.Contains(lb.String(), "NOT_COORDINATOR") {
		t.Fatalf("the lesser error was not logged:\n%s", lb.String())
	}
	before := lb.String()
	if got := p.graver(fenced, context.Canceled); got != fenced {
		t.Fatalf("graver: %v", got)
	}
	if lb.String() != before {
		t.Fatalf("a cancellation was logged:\n%s", lb.String())
	}
}
