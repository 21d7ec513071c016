package relay

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestStreamSilentPath (issue 35, item 8): the replication connection's
// path goes silent (no FIN, no RST: a proxy that stops forwarding both ways
// and closes nothing), while the lease, the state row and Kafka go on
// directly. Before, reads timed out and looped, status updates asked for no
// reply, the lease stayed healthy and nothing was owed: nothing noticed for
// the ~15 minutes TCP takes to give up. Now the stream asks for a reply a
// quarter of OUTBOX_STREAM_SILENCE_TIMEOUT in and, hearing nothing by the
// end of it, ends the session with an error that names the cause, counted
// in outbox_connector_stream_silent_total; the session ends without waiting
// on the frozen socket and the next reconnects. Once the path is back,
// every event, those written after the freeze included, arrives in order.
// The timeout is set, or by default the replication connection's
// wal_sender_timeout, here the lease TTL's.
func TestStreamSilentPath(t *testing.T) {
	const bound = 2 * time.Second
	t.Run("setting", func(t *testing.T) {
		testSilentPath(t, bound, func(cfg *config.Config) { cfg.StreamSilenceTimeout = bound })
	})
	t.Run("default", func(t *testing.T) {
		testSilentPath(t, bound, func(cfg *config.Config) { cfg.LeaseTTL = bound })
	})
}

func testSilentPath(t *testing.T, bound time.Duration, set func(*config.Config)) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	aggType := uniqueType("silent")

	proxy := testenv.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", pg.Port))
	u, err := url.Parse(pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.Addr
	cfg := testConfig(t, pg.DSN("outbox"), brokers)
	set(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelayPrepared(t, cfg, route.DefaultConfig(), func(r *Relay) { r.replicationDSN = u.String() })
	run.waitStreaming(t)

	w := testenv.NewWriter()
	w.Write(t, ctx, conn, aggType, 20, 4, 5)
	c.WaitFor(t, w.Snapshot(), time.Minute)
	// Idle for longer than the bound: a quiet stream on a live path is
	// not taken for a silent one (the server answers when asked).
	time.Sleep(2 * bound)
	if v := metricValue(t, run, "outbox_connector_stream_silent_total"); v != ":0" {
		t.Fatalf("outbox_connector_stream_silent_total %q on a live, idle path; want 0 (last error %q)", v, run.relay.LastError())
	}

	proxy.Freeze()
	frozen := time.Now()
	w.Write(t, ctx, conn, aggType, 20, 4, 5)
	// The stream heard its last message before the freeze: it ends at most
	// the bound after the freeze, plus a loop wake-up. The session then
	// joins the producer and the state writer (direct connections, nothing
	// in flight: the new events never reached it) and closes its
	// connections without waiting on the frozen one before recording the
	// error: a second covers that, with room for -race on shared cores.
	const margin = time.Second
	var detected time.Time
	for deadline := frozen.Add(bound + margin + 5*time.Second); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(run.relay.LastError(), "no message from the server for") {
			detected = time.Now()
			break
		}
		select {
		case err := <-run.done:
			t.Fatalf("relay exited on a silent path: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no silence noticed %s after the freeze (bound %s); last error %q, outbox_connector_stream_silent_total %q",
				time.Since(frozen), bound, run.relay.LastError(), metricValue(t, run, "outbox_connector_stream_silent_total"))
		}
	}
	took := detected.Sub(frozen)
	last := run.relay.LastError()
	t.Logf("silence noticed and the session ended %s after the freeze (bound %s): %s", took.Round(10*time.Millisecond), bound, last)
	for _, want := range []string{"on slot \"" + cfg.Slot + "\"", "the network path may be silent; reconnecting", "not even an answer"} {
		if !strings.Contains(last, want) {
			t.Errorf("last error %q does not say %q", last, want)
		}
	}
	if took > bound+margin {
		t.Errorf("the silence was noticed %s after the freeze; want within the bound %s plus %s", took, bound, margin)
	}
	if v := metricValue(t, run, "outbox_connector_stream_silent_total"); v != ":1" {
		t.Errorf("outbox_connector_stream_silent_total %q; want 1", v)
	}
	if v := metricValue(t, run, "outbox_connector_reconnects_total"); !strings.Contains(v, "target=postgres:") {
		t.Errorf("outbox_connector_reconnects_total %q; want a postgres reconnect", v)
	}

	// The next session's replication connection hangs in the frozen proxy
	// until the path is back.
	time.Sleep(bound)
	proxy.Thaw()
	want := w.Snapshot()
	c.WaitFor(t, want, time.Minute)
	if err := run.stop(t); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	dups := c.Verify(t, want)
	t.Logf("%d events delivered in order, those written after the freeze included; %d duplicates; outbox_connector_stream_silent_total %s",
		len(want), dups, metricValue(t, run, "outbox_connector_stream_silent_total"))
}
