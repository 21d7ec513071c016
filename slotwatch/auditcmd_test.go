package main

import (
	"strings"
	"testing"
)

// TestAuditExitCodes: slotwatch audit's exit status is a verdict (1: events
// are missing), so a usage or configuration error exits 2 and an audit that
// could not run exits 3; before, each of these exited 1, which a script
// reads as events missing.
func TestAuditExitCodes(t *testing.T) {
	dsn := "postgres://outbox_watch@127.0.0.1:1/outbox?connect_timeout=2"
	base := map[string]string{"SLOTWATCH_OUTBOX_DSN": dsn, "OUTBOX_KAFKA_BROKERS": "127.0.0.1:1"}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"no since", base, nil, 2, "-since is required"},
		{"a bad time", base, []string{"-since", "yesterday"}, 2, "not an RFC 3339 time"},
		{"unknown flag", base, []string{"-since", "2026-12-04T10:00:00Z", "-bogus"}, 2, "bogus"},
		{"bad match", base, []string{"-since", "2026-12-04T10:00:00Z", "-match", "value"}, 2, "use header or key"},
		{"key on the outbox", base, []string{"-since", "2026-12-04T10:00:00Z", "-match", "key", "-id-column", "aggregateid"}, 2, "-match header"},
		{"key without a type", base, []string{"-since", "2026-12-04T10:00:00Z", "-match", "key", "-table", "orders"}, 2, "-aggregate-type"},
		{"no DSN", map[string]string{"OUTBOX_KAFKA_BROKERS": "127.0.0.1:1"}, []string{"-since", "2026-12-04T10:00:00Z"}, 2, "SLOTWATCH_OUTBOX_DSN"},
		{"unknown setting", map[string]string{"SLOTWATCH_OUTBOX_DNS": dsn}, []string{"-since", "2026-12-04T10:00:00Z"}, 2, "SLOTWATCH_OUTBOX_DNS"},
		{"bad routing", map[string]string{"SLOTWATCH_OUTBOX_DSN": dsn, "OUTBOX_KAFKA_BROKERS": "127.0.0.1:1", "OUTBOX_ROUTE_KEY_FORMAT": "xml"},
			[]string{"-since", "2026-12-04T10:00:00Z"}, 2, "OUTBOX_ROUTE_KEY_FORMAT"},
		{"malformed DSN", map[string]string{"SLOTWATCH_OUTBOX_DSN": dsn + "&sslmode=bogus", "OUTBOX_KAFKA_BROKERS": "127.0.0.1:1"},
			[]string{"-since", "2026-12-04T10:00:00Z"}, 2, "sslmode"},
		{"database down", base, []string{"-since", "2026-12-04T10:00:00Z"}, 3, "did not finish"},
		{"help", base, []string{"-help"}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, lines, stderr := auditLines(t, c.env, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q, stdout %q; want exit %d and %q", code, stderr, lines, c.code, c.want)
			}
		})
	}
}
