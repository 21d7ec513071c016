package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestStartupRefusals runs the connector binary with one wrong setting at a
// time: it exits 1 at once with a single line that names the setting (and,
// for a typo, the setting meant), and never shows the DSN's password.
func TestStartupRefusals(t *testing.T) {
	bin := testenv.Binary(t, "connector")
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const pw = "pw-never-shown"
	base := map[string]string{
		"OUTBOX_PG_DSN":        "postgres://outbox_connector:" + pw + "@127.0.0.1:1/outbox?sslmode=disable",
		"OUTBOX_KAFKA_BROKERS": "127.0.0.1:1",
		"OUTBOX_HTTP_ADDR":     "off",
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"typo", map[string]string{"OUTBOX_KAFKA_BROKER": "k:9092"},
			[]string{"connector: OUTBOX_KAFKA_BROKER: unknown setting; did you mean OUTBOX_KAFKA_BROKERS?"}},
		{"typo of a secret file", map[string]string{"OUTBOX_KAFKA_SASL_PASSWROD_FILE": "/run/secrets/pw"},
			[]string{"OUTBOX_KAFKA_SASL_PASSWROD_FILE: unknown setting; did you mean OUTBOX_KAFKA_SASL_PASSWORD_FILE?"}},
		{"malformed DSN", map[string]string{"OUTBOX_PG_DSN": "postgres://u:" + pw + "@host:notaport/db"},
			[]string{"connector: OUTBOX_PG_DSN: malformed connection string", "invalid port"}},
		{"missing sslrootcert", map[string]string{"OUTBOX_PG_DSN": "postgres://u:" + pw + "@127.0.0.1/db?sslmode=verify-full&sslrootcert=/nonexistent/root.crt"},
			[]string{"connector: OUTBOX_PG_DSN: its TLS settings", "/nonexistent/root.crt", "no such file"}},
		{"missing Kafka CA file", map[string]string{"OUTBOX_KAFKA_TLS_CA_FILE": "/nonexistent/kafka-ca.pem"},
			[]string{"connector: OUTBOX_KAFKA_TLS_CA_FILE", "/nonexistent/kafka-ca.pem"}},
		{"missing web config", map[string]string{"OUTBOX_HTTP_ADDR": "127.0.0.1:0", "OUTBOX_HTTP_WEB_CONFIG": "/nonexistent/web.yml"},
			[]string{"connector: OUTBOX_HTTP_WEB_CONFIG: cannot read the web config \"/nonexistent/web.yml\": no such file or directory"}},
		{"web config not YAML", map[string]string{"OUTBOX_HTTP_ADDR": "127.0.0.1:0", "OUTBOX_HTTP_WEB_CONFIG": write("bad.yml", "tls_server_config: [\n")},
			[]string{"connector: OUTBOX_HTTP_WEB_CONFIG: web config", "yaml"}},
		{"web config certificate missing", map[string]string{"OUTBOX_HTTP_ADDR": "127.0.0.1:0", "OUTBOX_HTTP_WEB_CONFIG": write("nocert.yml", "tls_server_config:\n  cert_file: /nonexistent/server.crt\n  key_file: /nonexistent/server.key\n")},
			[]string{"connector: OUTBOX_HTTP_WEB_CONFIG: web config", "/nonexistent/server.crt"}},
		{"HTTP address without port", map[string]string{"OUTBOX_HTTP_ADDR": "localhost"},
			[]string{"connector: OUTBOX_HTTP_ADDR: \"localhost\" is not host:port", "or off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			p := testenv.StartProc(t, bin, env)
			if code := p.Wait(t, 20*time.Second); code != 1 {
				t.Fatalf("exit %d, want 1; output:\n%s", code, p.Output())
			}
			out := strings.TrimSpace(p.Output())
			if strings.Contains(out, "\n") {
				t.Errorf("more than one line:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if strings.Contains(out, pw) {
				t.Errorf("output shows the password: %s", out)
			}
		})
	}

	// What the project's scripts, tests and outbox-router set alongside does
	// not stop the connector.
	t.Run("tooling and outbox-router variables", func(t *testing.T) {
		env := map[string]string{
			"OUTBOX_TEST_KAFKA_BROKERS": "k:9092", "OUTBOX_TEST_REGISTRY_URL": "http://r", "OUTBOX_CACHE_DIR": dir,
			"OUTBOX_SOAK": "1", "OUTBOX_FENCING_COST": "1", "OUTBOX_BENCH_FSYNC": "off", "OUTBOX_STACK_PG_PORT": "5",
			"OUTBOX_ROUTER_SOURCE_TOPIC": "db.public.outbox", "OUTBOX_ROUTER_GROUP": "g",
			"OUTBOX_KAFKA_CLIENT_ID_FILE": write("client-id", "c1\n"),
		}
		for k, v := range base {
			env[k] = v
		}
		p := testenv.StartProc(t, bin, env)
		waitOutput(t, p, "msg=starting", 20*time.Second)
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(t, 20*time.Second); code != 0 {
			t.Errorf("exit %d:\n%s", code, tail(p.Output()))
		}
	})
}

// TestMissingTable: OUTBOX_TABLE naming a table that does not exist stops
// the connector with that cause and what to do, in WAL and in poll mode,
// whether or not the slot exists yet; not with a complaint about the
// publication, which is only a consequence.
func TestMissingTable(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"wal, no slot yet", nil, "table public.nosuch does not exist; create the outbox table (sql/001_outbox.sql"},
		{"poll", []string{"OUTBOX_SOURCE", "poll"}, `the outbox table "public"."nosuch" does not exist; apply sql/001_outbox.sql`},
		// The first case's refusal created no slot; make one as a run on
		// the right table would have.
		{"wal, slot exists", []string{"OUTBOX_SLOT", "other_slot"}, "table public.nosuch does not exist; create the outbox table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.name, "slot exists") {
				conn := pg.Conn(t, "outbox")
				if _, err := conn.Exec(t.Context(), "SELECT pg_create_logical_replication_slot('other_slot', 'pgoutput')"); err != nil {
					t.Fatal(err)
				}
			}
			p := testenv.StartProc(t, bin, connectorEnv(pg, brokers, append([]string{"OUTBOX_TABLE", "public.nosuch"}, tc.env...)...))
			if code := p.Wait(t, 60*time.Second); code != 1 {
				t.Fatalf("exit %d, want 1; output:\n%s", code, tail(p.Output()))
			}
			out := p.Output()
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, tail(out))
			}
			if strings.Contains(out, "does not include") {
				t.Errorf("output blames the publication:\n%s", tail(out))
			}
		})
	}
}
