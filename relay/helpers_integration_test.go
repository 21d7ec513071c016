package relay

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/route"
)

// testConfig is the connector's configuration for a test: defaults and fast
// status updates.
func testConfig(t testing.TB, dsn, brokers string) config.Config {
	t.Helper()
	var cfg config.Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg.Bind(fs, func(string) string { return "" })
	cfg.PGDSN = dsn
	cfg.Kafka.Brokers = brokers
	cfg.HTTPAddr = ""
	cfg.StatusInterval = 200 * time.Millisecond
	cfg.ShutdownTimeout = 20 * time.Second
	cfg.TopicPartitions = 3
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

type running struct {
	cancel context.CancelFunc
	done   chan error
	relay  *Relay
	m      *metrics.Metrics
}

func startRelay(t testing.TB, cfg config.Config) *running {
	t.Helper()
	return startRelayRouting(t, cfg, route.DefaultConfig())
}

// startRelayRouting is startRelay with the router's configuration.
func startRelayRouting(t testing.TB, cfg config.Config, rcfg route.Config) *running {
	t.Helper()
	return startRelayFaults(t, cfg, rcfg, nil)
}

// startRelayFaults is startRelayRouting with a fault hook.
func startRelayFaults(t testing.TB, cfg config.Config, rcfg route.Config, hook fault.Hook) *running {
	t.Helper()
	return startRelayPrepared(t, cfg, rcfg, func(r *Relay) { r.faults = hook })
}

// startRelayPrepared is startRelayRouting with prepare run on the relay
// before it starts (its test-only fields).
func startRelayPrepared(t testing.TB, cfg config.Config, rcfg route.Config, prepare func(*Relay)) *running {
	t.Helper()
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelInfo
	if os.Getenv("OUTBOX_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	m := metrics.New()
	r := New(cfg, router, log, m)
	prepare(r)
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan error, 1), relay: r, m: m}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() { _ = run.stop(t) })
	return run
}

// waitStreaming waits until the relay streams the slot.
func (r *running) waitStreaming(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !r.relay.Streaming() {
		select {
		case err := <-r.done:
			t.Fatalf("relay exited before streaming: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("relay did not start streaming within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *running) stop(t testing.TB) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not stop within 60s")
		return nil
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
