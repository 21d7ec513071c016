package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestLogFormat: the router reads OUTBOX_LOG_FORMAT as the connector does
// (before, it was accepted and ignored: the router logged text whatever it
// said): json gives one JSON object per line, and a format it does not know
// stops it at start, naming the variable.
func TestLogFormat(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	env := map[string]string{
		"OUTBOX_KAFKA_BROKERS":       c.ListenAddrs()[0],
		"OUTBOX_ROUTER_SOURCE_TOPIC": "dbserver1.public.outbox",
		"OUTBOX_LOG_FORMAT":          "json",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &testenv.SyncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, io.Discard, stderr) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), `"msg":"routing"`) {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no JSON line saying routing within 20 s (run: %v); stderr:\n%s", <-done, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(stderr.String()))
	for sc.Scan() {
		var line map[string]any
		// One component key: json.Unmarshal would keep the last of two.
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || strings.Count(sc.Text(), `"component":`) != 1 ||
			(line["component"] != "outbox-router" && line["component"] != "kafka") {
			t.Errorf("a log line that is not a JSON object of the router's: %q (%v)", sc.Text(), err)
		}
	}

	env["OUTBOX_LOG_FORMAT"] = "xml"
	err = run(context.Background(), nil, func(k string) string { return env[k] }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `OUTBOX_LOG_FORMAT: "xml"; use text or json`) {
		t.Errorf("OUTBOX_LOG_FORMAT=xml: %v; want the variable named with what it may be", err)
	}
	env["OUTBOX_LOG_FORMAT"], env["OUTBOX_LOG_LEVEL"] = "text", "loud"
	err = run(context.Background(), nil, func(k string) string { return env[k] }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `OUTBOX_LOG_LEVEL: "loud"`) {
		t.Errorf("OUTBOX_LOG_LEVEL=loud: %v; want it refused (before, an unknown level was info without a word)", err)
	}
}
