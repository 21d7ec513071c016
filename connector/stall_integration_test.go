package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// stallTimeout is OUTBOX_STALL_TIMEOUT in TestStallHealthz: short, so that
// the test waits seconds, not the default minute.
const stallTimeout = 3 * time.Second

// TestStallHealthz: with events in flight and a broker that accepts nothing
// (frozen with SIGSTOP: connections stay open and every request hangs; or
// stopped: every connection is refused), /healthz turns 503 within
// OUTBOX_STALL_TIMEOUT + 5 s and outbox_connector_stalled reads 1; it was
// 200 and 0 throughout the flow before, and turns 200 and 0 again once the
// broker is back. Every event written, before and during the outage,
// arrives, in order per aggregate. Run in both producer modes; /healthz
// must stay 503 for as long as the outage lasts (2 s here; with
// OUTBOX_SOAK=1 a minute, past the Kafka transaction timeout, and the
// broker stopped as well as frozen).
func TestStallHealthz(t *testing.T) {
	bin := testenv.Binary(t, "connector")
	k := testenv.StartKafka(t)
	soak := os.Getenv("OUTBOX_SOAK") == "1"
	hold := 2 * time.Second
	if soak {
		hold = time.Minute
	}
	for _, tc := range []struct {
		name, transactional string
		outage              string // freeze or stop
		soak                bool
	}{
		{"transactional/freeze", "true", "freeze", false},
		{"idempotent/freeze", "false", "freeze", false},
		// A stopped broker costs a JVM start (10-20 s) to bring back.
		{"transactional/stop", "true", "stop", true},
		{"idempotent/stop", "false", "stop", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.soak && !soak {
				t.Skip("set OUTBOX_SOAK=1 (make soak) to stop and restart the broker too")
			}
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := fmt.Sprintf("stall%d", time.Now().UnixNano()%1e9)
			c := testenv.StartConsumer(t, k.Brokers, "outbox.event."+aggType)
			p := testenv.StartProc(t, bin, connectorEnv(pg, k.Brokers,
				"OUTBOX_STALL_TIMEOUT", stallTimeout.String(),
				"OUTBOX_KAFKA_TRANSACTIONAL", tc.transactional))
			addr := httpAddr(t, p)
			waitOutput(t, p, "msg=streaming", 60*time.Second)

			// Flowing, for longer than the stall timeout: never unhealthy.
			w := testenv.NewWriter()
			flowEnd := time.Now().Add(stallTimeout + time.Second)
			for i := 0; time.Now().Before(flowEnd); i++ {
				w.Write(t, ctx, conn, aggType, 20, 10, 5)
				if code, body := get(t, addr, "/healthz"); code != http.StatusOK {
					t.Fatalf("/healthz %d while events flow: %s", code, body)
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.WaitFor(t, w.Snapshot(), time.Minute)
			expectStalled(t, addr, 0)

			// The broker accepts nothing; events are written and read from
			// the WAL, and stay in flight.
			var restore func()
			switch tc.outage {
			case "freeze":
				if err := k.Freeze(); err != nil {
					t.Fatal(err)
				}
				restore = func() {
					if err := k.Thaw(); err != nil {
						t.Fatal(err)
					}
				}
			case "stop":
				k.Stop()
				restore = func() {
					if err := k.Restart(); err != nil {
						t.Fatalf("restart the broker: %v", err)
					}
				}
			}
			restored := false
			t.Cleanup(func() {
				if !restored {
					restore()
				}
			})
			outage := time.Now()
			w.Write(t, ctx, conn, aggType, 200, 10, 20)
			unhealthy := waitHealthz(t, p, addr, http.StatusServiceUnavailable, stallTimeout+5*time.Second)
			t.Logf("/healthz 503 %s after the outage began: %s", time.Since(outage).Round(100*time.Millisecond), unhealthy)
			if !strings.Contains(unhealthy, "stalled") {
				t.Errorf("/healthz body %q does not say stalled", unhealthy)
			}
			expectStalled(t, addr, 1)
			m := scrape(t, addr)
			if age := m["outbox_connector_progress_age_seconds"]; age < stallTimeout.Seconds() {
				t.Errorf("outbox_connector_progress_age_seconds %v while stalled; want at least %v", age, stallTimeout.Seconds())
			}
			if m["outbox_connector_events_in_flight"] == 0 {
				t.Errorf("outbox_connector_events_in_flight 0 while stalled")
			}
			// Unhealthy for as long as the broker accepts nothing: a
			// session that ends and starts again (a Kafka transaction timed
			// out, a produce request failed) must not clear the stall.
			for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if code, body := get(t, addr, "/healthz"); code != http.StatusServiceUnavailable {
					t.Fatalf("/healthz %d %q %s into the outage, which goes on; output:\n%s", code, body, time.Since(outage).Round(100*time.Millisecond), tail(p.Output()))
				}
			}
			expectStalled(t, addr, 1)

			// The broker is back: healthy again, and everything arrives.
			restore()
			restored = true
			back := time.Now()
			waitHealthz(t, p, addr, http.StatusOK, time.Minute)
			t.Logf("/healthz 200 %s after the broker came back", time.Since(back).Round(100*time.Millisecond))
			expectStalled(t, addr, 0)
			w.Write(t, ctx, conn, aggType, 20, 10, 5)
			want := w.Snapshot()
			c.WaitFor(t, want, 2*time.Minute)
			p.Signal(syscall.SIGTERM)
			if code := p.Wait(t, 60*time.Second); code != 0 {
				t.Errorf("SIGTERM: exit code %d; output:\n%s", code, tail(p.Output()))
			}
			dups := c.Verify(t, want)
			t.Logf("%d events, all delivered in order per aggregate; %d duplicates", len(want), dups)
		})
	}
}

// waitHealthz polls /healthz until it answers want, failing the test after
// timeout; it returns the body.
func waitHealthz(t *testing.T, p *testenv.Proc, addr string, want int, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, body := get(t, addr, "/healthz")
		if code == want {
			return body
		}
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("/healthz answered %d %q, not %d, for %s (exited=%v); output:\n%s", code, body, want, timeout, p.Exited(), tail(p.Output()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func expectStalled(t *testing.T, addr string, want float64) {
	t.Helper()
	m := scrape(t, addr)
	got, ok := m["outbox_connector_stalled"]
	if !ok || got != want {
		t.Errorf("outbox_connector_stalled = %v (exported: %v), want %v", got, ok, want)
	}
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// scrape reads /metrics: series (name with labels) -> value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}
