package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestProducerCanceledErrorReconnects (issue 13, review finding 6): the
// producer fails a session with an error that wraps context.Canceled while
// the connector is not stopping (in idempotent mode, records of another
// partition failed with the session's halted context before the refused
// batch's promise ran; here a Kafka commit fails so, three times). The
// session ended with nil for it: the next one started at once, with no
// backoff, no warning, no reconnect counted and the reason lost. It is a
// failure like any other: counted, kept as the last error, and retried
// after the backoff; every event arrives in order.
func TestProducerCanceledErrorReconnects(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("pcancel")

	const failures = 3
	var mu sync.Mutex
	var at []time.Time
	hook := func(s fault.Step) error {
		if s != fault.BeforeKafkaCommit {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if len(at) == failures {
			return nil
		}
		at = append(at, time.Now())
		return fmt.Errorf("records failed with the halted session: %w", context.Canceled)
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelayFaults(t, testConfig(t, pg.DSN("outbox"), brokers), route.DefaultConfig(), hook)
	run.waitStreaming(t)
	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 40, 4, 5)
	c.WaitFor(t, w.Events, time.Minute)

	mu.Lock()
	times := append([]time.Time(nil), at...)
	mu.Unlock()
	if len(times) != failures {
		t.Fatalf("%d commits failed, want %d", len(times), failures)
	}
	var gaps []string
	short := false
	for i := 1; i < len(times); i++ {
		d := times[i].Sub(times[i-1])
		gaps = append(gaps, d.Round(10*time.Millisecond).String())
		short = short || d < 400*time.Millisecond
	}
	reconnects := metricValue(t, run, "outbox_connector_reconnects_total")
	last := run.relay.LastError()
	t.Logf("sessions failed %v apart; reconnects %q; last error %q", gaps, reconnects, last)
	if short || reconnects != "target=kafka:3" || !strings.Contains(last, "halted session") {
		t.Errorf("a producer error wrapping context.Canceled, the connector not stopping: failures %v apart (want the backoff, 0.5 s and more), reconnects %q (want target=kafka:3), last error %q (want the cause)", gaps, reconnects, last)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, w.Events)
	t.Logf("%d events delivered in order, %d duplicates", len(w.Events), dups)
}
