package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemo runs `make demo`'s program briefly on its embedded defaults
// (throwaway PostgreSQL, in-process kfake) and checks that every order
// written was consumed from Kafka.
func TestDemo(t *testing.T) {
	t.Setenv("DEMO_DURATION", "4s")
	t.Setenv("OUTBOX_KAFKA_BROKERS", "")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), &out, &errOut); err != nil {
		t.Fatalf("demo failed: %v\n%s%s", err, out.String(), errOut.String())
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "every one consumed from Kafka") {
		t.Fatalf("demo did not deliver every order:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "commit-to-consume p50") {
		t.Fatalf("demo printed no live summary:\n%s", out.String())
	}
	// A first run on a fresh database has nothing to warn about: a warning
	// there teaches a new user to ignore the connector's warnings.
	if strings.Contains(errOut.String(), "connector warnings") {
		t.Fatalf("demo printed connector warnings on a healthy run:\n%s", errOut.String())
	}
}
