package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/internal/webconfig/webconfigtest"
)

var servingRE = regexp.MustCompile(`msg="serving /metrics[^"]*".*? addr=(\S+)`)

// httpAddr waits for the connector's "serving" line and returns its address.
func httpAddr(t testing.TB, p *testenv.Proc) string {
	t.Helper()
	waitOutput(t, p, `msg="serving /metrics`, 30*time.Second)
	m := servingRE.FindStringSubmatch(p.Output())
	if m == nil {
		t.Fatalf("no address in the serving line:\n%s", tail(p.Output()))
	}
	return m[1]
}

// TestHTTPWebConfig: with OUTBOX_HTTP_WEB_CONFIG (TLS and a user), every
// endpoint answers over HTTPS verified with the test CA to the right
// password only (health checks included: the exporter toolkit protects every
// path), and plain HTTP gets no page. OUTBOX_HTTP_ADDR=off serves nothing.
// The database is unreachable on purpose: the endpoint serves regardless.
func TestHTTPWebConfig(t *testing.T) {
	bin := testenv.Binary(t, "connector")
	pki := testenv.NewPKI(t, "client")
	web := webconfigtest.Write(t, pki.ServerCert, pki.ServerKey, map[string]string{"prometheus": "right-pw"})
	env := map[string]string{
		"OUTBOX_PG_DSN":          "postgres://nobody@127.0.0.1:1/outbox?sslmode=disable",
		"OUTBOX_KAFKA_BROKERS":   "127.0.0.1:1",
		"OUTBOX_HTTP_ADDR":       "127.0.0.1:0",
		"OUTBOX_HTTP_WEB_CONFIG": web,
	}
	p := testenv.StartProc(t, bin, env)
	addr := httpAddr(t, p)
	if !strings.Contains(p.Output(), "tls=true basic_auth_users=1") {
		t.Errorf("the serving line does not say TLS and one user:\n%s", tail(p.Output()))
	}
	cl := webconfigtest.Client(t, pki.CA)
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/leader"} {
		for _, tc := range []struct {
			user, pw string
			want     int
		}{{"prometheus", "wrong-pw", 401}, {"", "", 401}, {"prometheus", "right-pw", 0}} {
			code, body, err := webconfigtest.Get(cl, "https://"+addr+path, tc.user, tc.pw)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			if tc.want == 0 {
				// Authenticated: the endpoint's own answer (/readyz and
				// /leader are 503 while the database is unreachable).
				if code == 401 {
					t.Errorf("GET %s with the right password: 401", path)
				}
				if path == "/metrics" && (code != 200 || !strings.Contains(body, "outbox_connector_leader")) {
					t.Errorf("GET /metrics: %d, no outbox_connector_leader", code)
				}
				continue
			}
			if code != tc.want {
				t.Errorf("GET %s as %q/%q: %d, want %d", path, tc.user, tc.pw, code, tc.want)
			}
		}
	}
	code, body, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/metrics", "prometheus", "right-pw")
	if err == nil && (code == 200 || strings.Contains(body, "outbox_connector")) {
		t.Errorf("plain HTTP to the TLS endpoint: %d %q", code, body)
	}
	p.Signal(syscall.SIGTERM)
	if c := p.Wait(t, 30*time.Second); c != 0 {
		t.Errorf("exit %d:\n%s", c, tail(p.Output()))
	}

	env["OUTBOX_HTTP_ADDR"] = "off"
	p = testenv.StartProc(t, bin, env)
	waitOutput(t, p, "msg=starting", 30*time.Second)
	if strings.Contains(p.Output(), "serving /metrics") {
		t.Errorf("OUTBOX_HTTP_ADDR=off still serves:\n%s", tail(p.Output()))
	}
	p.Signal(syscall.SIGTERM)
	if c := p.Wait(t, 30*time.Second); c != 0 {
		t.Errorf("exit %d:\n%s", c, tail(p.Output()))
	}
}
