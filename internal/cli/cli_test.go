package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

func TestExit(t *testing.T) {
	refuse := func([]string) error { return errors.New("OUTBOX_TYPO: unknown") }
	for _, c := range []struct {
		name   string
		check  func([]string) error
		runErr error
		code   int
		stderr string
		ran    bool
	}{
		{name: "ok", code: 0, ran: true},
		{name: "no check", code: 0, ran: true},
		{name: "help", runErr: fmt.Errorf("parse: %w", flag.ErrHelp), code: 0, ran: true},
		{name: "run fails", runErr: errors.New("boom"), code: 1, stderr: "bin: boom\n", ran: true},
		{name: "usage", runErr: Usagef("unknown command %q", "start"), code: 2, stderr: "bin: unknown command \"start\"\n", ran: true},
		{name: "check refuses", check: refuse, code: 1, stderr: "bin: OUTBOX_TYPO: unknown\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			ran := false
			check := c.check
			if check == nil && c.name != "no check" {
				check = func([]string) error { return nil }
			}
			code := Exit(context.Background(), "bin", []string{"A=1"}, &stderr, check, func(ctx context.Context) error {
				ran = true
				if ctx.Err() != nil {
					t.Errorf("run's context is done at the start: %v", ctx.Err())
				}
				return c.runErr
			})
			if code != c.code || stderr.String() != c.stderr || ran != c.ran {
				t.Errorf("code %d, stderr %q, ran %v; want %d, %q, %v", code, stderr.String(), ran, c.code, c.stderr, c.ran)
			}
		})
	}
}

func TestLog(t *testing.T) {
	bind := func(env map[string]string) Log {
		var l Log
		b := config.NewBinder(flag.NewFlagSet("x", flag.ContinueOnError), func(k string) string { return env[k] })
		l.Bind(b, "PFX")
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(b.EnvVars(), " "); got != "PFX_LOG_FORMAT PFX_LOG_LEVEL" {
			t.Errorf("variables %q; want PFX_LOG_FORMAT PFX_LOG_LEVEL", got)
		}
		return l
	}
	if l := bind(nil); l.Level != "info" || l.Format != "text" || l.Validate() != nil {
		t.Errorf("defaults: %+v, %v; want info, text, valid", l, l.Validate())
	}
	l := bind(map[string]string{"PFX_LOG_LEVEL": "loud", "PFX_LOG_FORMAT": "xml"})
	err := l.Validate()
	if err == nil || !strings.Contains(err.Error(), `PFX_LOG_LEVEL: "loud"; use debug, info, warn or error`) ||
		!strings.Contains(err.Error(), `PFX_LOG_FORMAT: "xml"; use text or json`) {
		t.Errorf("Validate: %v; want both settings named with what they may be", err)
	}

	var buf bytes.Buffer
	bind(map[string]string{"PFX_LOG_LEVEL": "warn", "PFX_LOG_FORMAT": "json"}).Logger(&buf).Info("dropped")
	bind(map[string]string{"PFX_LOG_LEVEL": "warn", "PFX_LOG_FORMAT": "json"}).Logger(&buf).Warn("kept", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "kept" || rec["level"] != "WARN" {
		t.Errorf("json logger at warn wrote %q (%v); want one JSON line with msg kept", buf.String(), err)
	}
	buf.Reset()
	bind(map[string]string{"PFX_LOG_LEVEL": "debug"}).Logger(&buf).Debug("seen")
	if !strings.HasPrefix(buf.String(), "time=") || !strings.Contains(buf.String(), "level=DEBUG msg=seen") {
		t.Errorf("text logger at debug wrote %q; want a text line", buf.String())
	}
}

// TestLogComponentOnce: a logger derived for a part of a component
// (log.With("component", "kafka") from the connector's) names one
// component: slog's handlers append attributes, and a JSON line with the
// key twice is read differently by different tools (the first wins in some,
// the last in others).
func TestLogComponentOnce(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			log := Log{Level: "info", Format: format}.Logger(&buf)
			log = log.With("component", "connector", "slot", "s1")
			log.With("component", "kafka").Info("hello", "n", 1)
			log.Info("again")
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(lines) != 2 {
				t.Fatalf("got %d lines: %q", len(lines), buf.String())
			}
			for i, want := range []string{"kafka", "connector"} {
				if n := strings.Count(lines[i], "component"); n != 1 {
					t.Errorf("line %d names component %d times: %s", i, n, lines[i])
				}
				if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "s1") {
					t.Errorf("line %d: want component %s and slot s1: %s", i, want, lines[i])
				}
				if format == "json" {
					var m map[string]any
					if err := json.Unmarshal([]byte(lines[i]), &m); err != nil || m["component"] != want {
						t.Errorf("line %d: component %v (%v): %s", i, m["component"], err, lines[i])
					}
				}
			}
			// The position of the replaced attribute is kept: component first.
			if c, s := strings.Index(lines[0], "component"), strings.Index(lines[0], "s1"); c > s {
				t.Errorf("component moved after slot: %s", lines[0])
			}
		})
	}
}
