package relay

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestStallSessionsKeepFailing (issue 13, review finding 1): every session
// gets past setup, starts streaming and fails before it reads anything (as
// a server error while decoding before any Begin does), so nothing is ever
// in flight and the slot stands still, while the lease is renewed and no
// standby takes over. A health check lands inside each session. It is a
// stall: /healthz's Stalled() says so within OUTBOX_STALL_TIMEOUT + 3 s of
// the start, naming the error, and stays so while sessions keep failing
// (the reconnect backoff, 0.5 s doubling, has gaps shorter and longer than
// the timeout). Once sessions stop failing, events written are delivered in
// order and the stall clears.
func TestStallSessionsKeepFailing(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("sfail")

	var failing atomic.Bool
	var failures atomic.Int64
	var relay atomic.Pointer[Relay]
	failing.Store(true)
	hook := func(s fault.Step) error {
		if s != fault.BeforeStatus || !failing.Load() {
			return nil
		}
		// A health check while the session streams: the old watch took a
		// session past setup for a healthy one.
		if r := relay.Load(); r != nil {
			r.Stalled()
		}
		failures.Add(1)
		return errors.New("the server cannot decode the next change")
	}
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
	relay.Store(run.relay)
	began := time.Now()
	waitStalled(t, run, true, cfg.StallTimeout+3*time.Second)
	_, why := run.relay.Stalled()
	t.Logf("stalled %s after the start, after %d failed sessions: %s", time.Since(began).Round(100*time.Millisecond), failures.Load(), why)
	if !strings.Contains(why, "cannot decode the next change") {
		t.Errorf("the stall's reason %q does not name the last error", why)
	}
	if ok, _ := run.relay.Ready(); ok {
		t.Error("Ready() while stalled")
	}
	if v := metricValue(t, run, "outbox_connector_stalled"); v != ":1" {
		t.Errorf("outbox_connector_stalled %q while stalled, want 1", v)
	}
	// Stays stalled while two more sessions fail.
	n := failures.Load()
	for deadline := time.Now().Add(30 * time.Second); failures.Load() < n+2; time.Sleep(20 * time.Millisecond) {
		if st, _ := run.relay.Stalled(); !st {
			t.Fatalf("the stall cleared while sessions still fail (%d failed)", failures.Load())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions failed in 30 s after the stall: not a loop", failures.Load()-n)
		}
	}

	failing.Store(false)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	w := testenv.NewWriter()
	w.Write(t, context.Background(), conn, aggType, 30, 3, 10)
	c.WaitFor(t, w.Events, time.Minute)
	waitStalled(t, run, false, 10*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, w.Events)
	t.Logf("%d events delivered in order after %d failed sessions; %d duplicates", len(w.Events), failures.Load(), dups)
}
