package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestStallSnapshotLoop (issue 13, review finding 6): the initial snapshot
// fails at its first row, every session, and each session delivers that row
// again before it ends. Its transaction begins and commits at the slot's
// consistent point, where every session's tracker starts, so the next
// session's acked position is already at what the last dropped, and the
// re-delivered row is nothing new: a stall, reported within
// OUTBOX_STALL_TIMEOUT + 5 s and kept across sessions. Once the snapshot can
// pass, every row is delivered in order and the stall clears.
func TestStallSnapshotLoop(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("ssnap")
	w := testenv.NewWriter()
	w.Write(t, context.Background(), conn, aggType, 40, 4, 10)

	var failing atomic.Bool
	var failures atomic.Int64
	failing.Store(true)
	hook := func(s fault.Step) error {
		if s == fault.SnapshotRow && failing.Load() {
			failures.Add(1)
			return errors.New("a snapshot row that fails every time")
		}
		return nil
	}
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelayFaults(t, cfg, route.DefaultConfig(), hook)
	began := time.Now()
	waitStalled(t, run, true, cfg.StallTimeout+5*time.Second)
	_, why := run.relay.Stalled()
	t.Logf("stalled %s after the start, %d snapshot attempts failed: %s", time.Since(began).Round(100*time.Millisecond), failures.Load(), why)
	if !strings.Contains(why, "snapshot") {
		t.Errorf("the stall's reason %q does not name the last error", why)
	}
	if v := metricValue(t, run, "outbox_connector_stalled"); v != ":1" {
		t.Errorf("outbox_connector_stalled %q while stalled, want 1", v)
	}
	// Stays stalled across sessions (the backoff doubles from 0.5 s: at
	// least one more session in 10 s, each delivering the first row again).
	n := failures.Load()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if st, _ := run.relay.Stalled(); !st {
			t.Fatalf("the stall cleared while every snapshot still fails (%d attempts)", failures.Load())
		}
	}
	if failures.Load() < n+1 {
		t.Fatalf("%d snapshot attempts in 10 s after the stall: not a loop", failures.Load()-n)
	}

	failing.Store(false)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	want := w.Snapshot()
	c.WaitFor(t, want, time.Minute)
	waitStalled(t, run, false, 30*time.Second)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events delivered in order after %d failed snapshots; %d duplicates", len(want), failures.Load(), dups)
}

// TestStallKafkaUnreachableAtSetup (finding 7): in transactional mode a
// session fences the previous leader at the broker before it reads
// anything; with no broker reachable it never gets past that, while the
// lease is renewed (no standby takes over) and the WAL grows. Nothing is
// in flight and no session has a tracker, yet it is a stall: reported
// within OUTBOX_STALL_TIMEOUT + 5 s, naming Kafka.
func TestStallKafkaUnreachableAtSetup(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, pg.DSN("outbox"), fmt.Sprintf("127.0.0.1:%d", port))
	cfg.StallTimeout = 3 * time.Second
	if !cfg.Transactional {
		t.Fatal("the default is transactional mode; this test needs it")
	}
	run := startRelay(t, cfg)
	began := time.Now()
	waitStalled(t, run, true, cfg.StallTimeout+5*time.Second)
	_, why := run.relay.Stalled()
	t.Logf("stalled %s after the start: %s", time.Since(began).Round(100*time.Millisecond), why)
	if !strings.Contains(why, "Kafka") {
		t.Errorf("the stall's reason %q does not mention Kafka", why)
	}
	if ok, _ := run.relay.Ready(); ok {
		t.Error("Ready() while stalled")
	}
	if v := metricValue(t, run, "outbox_connector_stalled"); v != ":1" {
		t.Errorf("outbox_connector_stalled %q while stalled, want 1", v)
	}
}

// TestStallNotIdleOrStandby: with a short stall timeout, neither a healthy
// leader with nothing to do (for twice the timeout) nor a standby is
// stalled.
func TestStallNotIdleOrStandby(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	leader := startRelay(t, cfg)
	leader.waitStreaming(t)
	standby := startRelay(t, cfg)
	for end := time.Now().Add(2 * cfg.StallTimeout); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if st, why := leader.relay.Stalled(); st {
			t.Fatalf("an idle leader is stalled: %s", why)
		}
		if st, why := standby.relay.Stalled(); st {
			t.Fatalf("a standby is stalled: %s", why)
		}
	}
	if !leader.relay.Leading() || standby.relay.Leading() {
		t.Fatalf("leading: %v, %v; want the first instance only", leader.relay.Leading(), standby.relay.Leading())
	}
}
