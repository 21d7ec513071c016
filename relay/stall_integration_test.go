package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestStallReconnectLoop: a broker that refuses every Kafka transaction
// commit (kfake answers EndTxn commits INVALID_TXN_STATE) makes each
// session read the events, fail and end, and the next read them again,
// with a reconnect backoff between; no session lasts as long as the stall
// timeout and between sessions nothing is in flight. That is a stall: it is
// reported within OUTBOX_STALL_TIMEOUT + 5 s and for as long as the loop
// lasts (several sessions), with outbox_connector_stalled 1. Once commits
// pass, everything is delivered in order and the stall clears.
func TestStallReconnectLoop(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := strings.Join(kc.ListenAddrs(), ",")
	aggType := uniqueType("sloop")
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	cfg.StallTimeout = 3 * time.Second
	run := startRelay(t, cfg)
	run.waitStreaming(t)
	if st, why := run.relay.Stalled(); st {
		t.Fatalf("stalled before anything was written: %s", why)
	}

	refuse := kc.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.InvalidTxnState, Count: -1,
		When: func(r kmsg.Request) bool { return r.(*kmsg.EndTxnRequest).Commit },
	})
	conn := pg.Conn(t, "outbox")
	w := testenv.NewWriter()
	w.Write(t, context.Background(), conn, aggType, 50, 5, 10)
	began := time.Now()
	waitStalled(t, run, true, cfg.StallTimeout+5*time.Second)
	t.Logf("stalled %s after the events were written (%d commits refused so far)", time.Since(began).Round(100*time.Millisecond), refuse.Hits())
	if v := metricValue(t, run, "outbox_connector_stalled"); v != ":1" {
		t.Errorf("outbox_connector_stalled %q while stalled, want 1", v)
	}
	// Stays stalled while the loop goes on, across several sessions.
	hits := refuse.Hits()
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if st, _ := run.relay.Stalled(); !st {
			t.Fatalf("the stall cleared while every commit is still refused (%d refused)", refuse.Hits())
		}
	}
	if refuse.Hits() <= hits {
		t.Fatalf("no session tried to commit in 6 s (%d refused): not a reconnect loop", refuse.Hits())
	}
	_, why := run.relay.Stalled()
	t.Logf("still stalled after %d refused commits: %s", refuse.Hits(), why)

	refuse.Remove()
	waitStalled(t, run, false, time.Minute)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	want := w.Snapshot()
	c.WaitFor(t, want, time.Minute)
	if v := metricValue(t, run, "outbox_connector_stalled"); v != ":0" {
		t.Errorf("outbox_connector_stalled %q after delivery, want 0", v)
	}
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events delivered in order after the loop; %d duplicates", len(want), dups)
}

func waitStalled(t *testing.T, run *running, want bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, _ := run.relay.Stalled()
		if st == want {
			return
		}
		select {
		case err := <-run.done:
			t.Fatalf("relay exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stalled() stayed %v for %s (%s in flight)", st, timeout, metricValue(t, run, "outbox_connector_events_in_flight"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
