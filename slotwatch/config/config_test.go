package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseDefaults(t *testing.T) {
	c, err := Parse(nil, env(map[string]string{"SLOTWATCH_PG_DSN": "postgres://u@db:5432/app"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != DefaultListen || c.Interval != 10*time.Second || c.LagWarnBytes != 1<<30 || c.LagCritBytes != 10<<30 ||
		c.AlertRepeat != 4*time.Hour || c.Log.Level != "info" || c.AlertFor != "" {
		t.Errorf("defaults: %+v", c)
	}
	if d, err := c.AlertForOverride(); d != nil || err != nil {
		t.Errorf("AlertForOverride = %v, %v; want unset", d, err)
	}
	if got := c.GeneratorURL(); got != "http://127.0.0.1:9188/" {
		t.Errorf("GeneratorURL = %q", got)
	}
}

func TestFlagsOverrideEnv(t *testing.T) {
	c, err := Parse([]string{"-interval", "2s", "-alert-for", "0s"}, env(map[string]string{
		"SLOTWATCH_PG_DSN":   "postgres://u@db/app",
		"SLOTWATCH_INTERVAL": "30s",
		"SLOTWATCH_LISTEN":   ":9999",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != 2*time.Second || c.Listen != ":9999" {
		t.Errorf("interval %s listen %s", c.Interval, c.Listen)
	}
	if d, _ := c.AlertForOverride(); d == nil || *d != 0 {
		t.Errorf("AlertForOverride = %v, want 0s", d)
	}
	if got := c.GeneratorURL(); got != "http://localhost:9999/" {
		t.Errorf("GeneratorURL = %q", got)
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	_, err := Parse([]string{"-help"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, v := range EnvVars() {
		if !strings.Contains(out.String(), v) {
			t.Errorf("-help does not mention %s", v)
		}
	}
}

func TestValidate(t *testing.T) {
	base := map[string]string{"SLOTWATCH_PG_DSN": "postgres://u@db/app"}
	tests := []struct {
		name string
		set  map[string]string
		args []string
		want string // the variable the error names
	}{
		{"missing DSN", map[string]string{"SLOTWATCH_PG_DSN": ""}, nil, "SLOTWATCH_PG_DSN: missing"},
		{"bad DSN", map[string]string{"SLOTWATCH_PG_DSN": "postgres://u@db:notaport/app"}, nil, "SLOTWATCH_PG_DSN"},
		{"bad listen", map[string]string{"SLOTWATCH_LISTEN": "9188"}, nil, "SLOTWATCH_LISTEN"},
		{"bad duration", map[string]string{"SLOTWATCH_INTERVAL": "ten"}, nil, "SLOTWATCH_INTERVAL"},
		{"zero interval", nil, []string{"-interval", "0s"}, "SLOTWATCH_INTERVAL"},
		{"crit below warn", map[string]string{"SLOTWATCH_LAG_WARN_BYTES": "100", "SLOTWATCH_LAG_CRIT_BYTES": "10"}, nil, "SLOTWATCH_LAG_CRIT_BYTES"},
		{"bytes not a number", map[string]string{"SLOTWATCH_LAG_WARN_BYTES": "1GB"}, nil, "SLOTWATCH_LAG_WARN_BYTES"},
		{"bad alert for", map[string]string{"SLOTWATCH_ALERT_FOR": "soon"}, nil, "SLOTWATCH_ALERT_FOR"},
		{"bad webhook", map[string]string{"SLOTWATCH_ALERT_WEBHOOK_URL": "ftp://x/y"}, nil, "SLOTWATCH_ALERT_WEBHOOK_URL"},
		{"bad alertmanager", map[string]string{"SLOTWATCH_ALERTMANAGER_URL": "http://am:9093,am2:9093"}, nil, "SLOTWATCH_ALERTMANAGER_URL"},
		{"window beyond history", map[string]string{"SLOTWATCH_RATE_WINDOW": "2h", "SLOTWATCH_HISTORY": "1h"}, nil, "SLOTWATCH_RATE_WINDOW"},
		{"log level", map[string]string{"SLOTWATCH_LOG_LEVEL": "loud"}, nil, "SLOTWATCH_LOG_LEVEL"},
		{"duplicate names", map[string]string{"SLOTWATCH_PG_DSN": "a=postgres://h1/db a=postgres://h2/db"}, nil, "named"},
		{"stray argument", nil, []string{"extra"}, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			for k, v := range tt.set {
				m[k] = v
			}
			_, err := Parse(tt.args, env(m), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestTargets(t *testing.T) {
	tests := []struct {
		dsn   string
		names []string
		dbs   []string
	}{
		{"postgres://u@db1:5432/app", []string{"db1:5432/app"}, []string{"app"}},
		{"postgres://u@db1/app, postgres://u@db2:6432/other", []string{"db1:5432/app", "db2:6432/other"}, []string{"app", "other"}},
		{"primary=postgres://u:pw@db1/app\nreplica=postgresql://u@db2/app", []string{"primary", "replica"}, []string{"app", "app"}},
		{"postgres://u@h1:5432,h2:5433/app?target_session_attrs=read-write", []string{"h1:5432/app"}, []string{"app"}},
		{"host=db1 port=5433 dbname=app user=u password='a b'", []string{"db1:5433/app"}, []string{"app"}},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			c := Config{DSN: tt.dsn}
			ts, err := c.Targets()
			if err != nil {
				t.Fatal(err)
			}
			var names, dbs []string
			for _, x := range ts {
				names = append(names, x.Name)
				dbs = append(dbs, x.Database)
			}
			if !slices.Equal(names, tt.names) || !slices.Equal(dbs, tt.dbs) {
				t.Fatalf("names %v dbs %v; want %v %v", names, dbs, tt.names, tt.dbs)
			}
		})
	}
}

func TestRedaction(t *testing.T) {
	tests := []struct{ in, want string }{
		{"postgres://u:hunter2@db/app", "postgres://u:xxxxx@db/app"},
		{"postgres://u@db/app?password=hunter2&sslmode=require", "postgres://u@db/app?password=xxxxx&sslmode=require"},
		{"host=db password=hunter2 user=u", "host=db password=xxxxx user=u"},
		{"host=db password='hunter 2' user=u", "host=db password=xxxxx user=u"},
		{"postgres://u@db/app", "postgres://u@db/app"},
	}
	for _, tt := range tests {
		if got := RedactDSN(tt.in); got != tt.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	tgt, err := NewTarget("", "postgres://u:p%40ss@db/app")
	if err != nil {
		t.Fatal(err)
	}
	msg := tgt.RedactError(errors.New("failed: postgres://u:p%40ss@db/app and p@ss and p%40ss"))
	if strings.Contains(msg, "p@ss") || strings.Contains(msg, "p%40ss") {
		t.Errorf("RedactError left the password: %q", msg)
	}
	// Redact masks the same and keeps the error's type for errors.As.
	pe := &pgconn.PgError{Code: "28P01", Message: "password authentication failed: p@ss"}
	rerr := tgt.Redact(fmt.Errorf("connect: %w", pe))
	var got *pgconn.PgError
	if strings.Contains(rerr.Error(), "p@ss") || !errors.As(rerr, &got) || got.Code != "28P01" {
		t.Errorf("Redact: %q, errors.As found %v", rerr, got)
	}
	if tgt.String() != "db:5432/app" {
		t.Errorf("String() = %q", tgt.String())
	}
	if got := RedactURL("https://user:tok@hooks.example/x?token=abc"); strings.Contains(got, "tok") || strings.Contains(got, "abc") {
		t.Errorf("RedactURL = %q", got)
	}
	// A malformed DSN's error does not echo its password.
	c := Config{DSN: "postgres://u:hunter2@db:port/app", Listen: DefaultListen}
	if _, err := c.Targets(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("Targets error = %v", err)
	}
}

func TestEnvVars(t *testing.T) {
	got := EnvVars()
	for _, want := range []string{
		"SLOTWATCH_PG_DSN", "SLOTWATCH_LISTEN", "SLOTWATCH_INTERVAL", "SLOTWATCH_LAG_WARN_BYTES", "SLOTWATCH_LAG_CRIT_BYTES",
		"SLOTWATCH_ALERT_FOR", "SLOTWATCH_ALERT_WEBHOOK_URL", "SLOTWATCH_ALERTMANAGER_URL",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("EnvVars() lacks %s", want)
		}
	}
	if !slices.IsSorted(got) {
		t.Errorf("EnvVars() not sorted: %v", got)
	}
	// Besides its own, slotwatch reads the connector's Kafka, table,
	// dead-letter topic and routing settings, for the end-to-end watch.
	for _, v := range got {
		if !strings.HasPrefix(v, "SLOTWATCH_") && !strings.HasPrefix(v, "OUTBOX_KAFKA_") && !strings.HasPrefix(v, "OUTBOX_ROUTE_") &&
			v != "OUTBOX_TABLE" && v != "OUTBOX_DLQ_TOPIC" {
			t.Errorf("%s is neither a SLOTWATCH_ variable nor a shared one", v)
		}
	}
}

// TestGeneratorURLScheme: alerts link to https when the web config turns TLS
// on, and to the listen address with localhost for a wildcard host.
func TestGeneratorURLScheme(t *testing.T) {
	dir := t.TempDir()
	tlsFile := filepath.Join(dir, "tls.yml")
	authFile := filepath.Join(dir, "auth.yml")
	if err := os.WriteFile(tlsFile, []byte("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(authFile, []byte("basic_auth_users:\n  a: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ listen, web, want string }{
		{"0.0.0.0:9188", "", "http://localhost:9188/"},
		{"127.0.0.1:9188", tlsFile, "https://127.0.0.1:9188/"},
		{":9188", authFile, "http://localhost:9188/"},
	} {
		c := Config{Listen: tc.listen, WebConfig: tc.web}
		if got := c.GeneratorURL(); got != tc.want {
			t.Errorf("listen %s, web config %q: %s, want %s", tc.listen, tc.web, got, tc.want)
		}
	}
}

// TestOutboxValidate: the end-to-end watch's settings, when it is on.
func TestOutboxValidate(t *testing.T) {
	base := map[string]string{
		"SLOTWATCH_PG_DSN":     "postgres://u@db/app",
		"SLOTWATCH_OUTBOX_DSN": "postgres://outbox_watch@db/app",
		"OUTBOX_KAFKA_BROKERS": "kafka:9092",
	}
	tests := []struct {
		name string
		set  map[string]string
		want string // "" for valid; else text the error must hold
	}{
		{"defaults", nil, ""},
		{"interval is window minus grace", map[string]string{"SLOTWATCH_AUDIT_INTERVAL": "14m"}, ""},
		// Rounds at t and t+14m judge [t−15m, t−1m) and [t−1m, t+13m): no gap.
		{"interval leaves a gap", map[string]string{"SLOTWATCH_AUDIT_INTERVAL": "15m"},
			"SLOTWATCH_AUDIT_INTERVAL (15m0s) must not be longer than SLOTWATCH_AUDIT_WINDOW (15m0s) minus SLOTWATCH_AUDIT_GRACE (1m0s)"},
		{"grace eats the window", map[string]string{"SLOTWATCH_AUDIT_INTERVAL": "5m", "SLOTWATCH_AUDIT_WINDOW": "10m", "SLOTWATCH_AUDIT_GRACE": "6m"},
			"SLOTWATCH_AUDIT_INTERVAL (5m0s) must not be longer than"},
		{"audit off: no gap to leave", map[string]string{"SLOTWATCH_AUDIT_INTERVAL": "0", "SLOTWATCH_AUDIT_WINDOW": "1m"}, ""},
		// The one-shot `slotwatch audit` validates these too: a grace past
		// the window is no gap when no round runs (it was refused).
		{"audit off, grace past the window", map[string]string{"SLOTWATCH_AUDIT_INTERVAL": "0", "SLOTWATCH_AUDIT_GRACE": "30m"}, ""},
		{"watch off: not checked", map[string]string{"SLOTWATCH_OUTBOX_DSN": "", "SLOTWATCH_AUDIT_INTERVAL": "1h"}, ""},
		{"window not beyond grace", map[string]string{"SLOTWATCH_AUDIT_WINDOW": "1m"}, "SLOTWATCH_AUDIT_WINDOW (1m0s) must be longer than SLOTWATCH_AUDIT_GRACE"},
		{"catch-up shorter than the window", map[string]string{"SLOTWATCH_AUDIT_CATCH_UP": "10m"}, "SLOTWATCH_AUDIT_CATCH_UP (10m0s) must be 0 (no bound) or at least SLOTWATCH_AUDIT_WINDOW (15m0s)"},
		{"catch-up off", map[string]string{"SLOTWATCH_AUDIT_CATCH_UP": "0"}, ""},
		{"catch-up negative", map[string]string{"SLOTWATCH_AUDIT_CATCH_UP": "-1h"}, "SLOTWATCH_AUDIT_CATCH_UP: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			for k, v := range tt.set {
				m[k] = v
			}
			_, err := Parse(nil, env(m), io.Discard)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("err = %v, want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("err = %v, want one holding %q", err, tt.want)
			}
		})
	}
}

// TestTargetNamedPipeline: "pipeline" is the end-to-end watch's server
// label; a database of that name would mix its alerts with the pipeline's.
func TestTargetNamedPipeline(t *testing.T) {
	c := Config{DSN: "primary=postgres://u@db1/app " + PipelineServer + "=postgres://u@db2/app"}
	_, err := c.Targets()
	if err == nil || !strings.Contains(err.Error(), `"pipeline" is reserved`) {
		t.Fatalf("err = %v; want the name refused", err)
	}
	c = Config{DSN: "pipelines=postgres://u@db2/app"}
	if _, err := c.Targets(); err != nil {
		t.Fatalf("pipelines: %v", err)
	}
}
