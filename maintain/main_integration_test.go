package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestUnknownSettingRefused: a MAINTAIN_* typo stops maintain with one line
// naming the setting meant, while the connector's OUTBOX_* settings that
// share its environment are left alone.
func TestUnknownSettingRefused(t *testing.T) {
	p := testenv.StartProc(t, testenv.Binary(t, "maintain"), map[string]string{
		"MAINTAIN_MOD":         "delete",
		"OUTBOX_PG_DSN":        "postgres://u@127.0.0.1:1/db",
		"OUTBOX_KAFKA_BROKERS": "k:9092",
	})
	if code := p.Wait(t, 20*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, p.Output())
	}
	want := "maintain: MAINTAIN_MOD: unknown setting; did you mean MAINTAIN_MODE?"
	if out := strings.TrimSpace(p.Output()); !strings.HasPrefix(out, want) || strings.Contains(out, "\n") {
		t.Errorf("output %q; want one line starting %q", out, want)
	}
}
