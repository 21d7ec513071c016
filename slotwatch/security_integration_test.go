package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/internal/webconfig/webconfigtest"
)

// TestStartupRefusals runs the slotwatch binary with one wrong setting at a
// time: it exits 1 at once with a single line that names the setting (and,
// for a typo, the setting meant), and never shows the DSN's password.
func TestStartupRefusals(t *testing.T) {
	bin := testenv.Binary(t, "slotwatch")
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(badYAML, []byte("basic_auth_users:\n  alice: clear-text\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const pw = "pw-never-shown"
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"typo", map[string]string{"SLOTWATCH_LISTN": "127.0.0.1:9"},
			[]string{"slotwatch: SLOTWATCH_LISTN: unknown setting; did you mean SLOTWATCH_LISTEN?"}},
		{"malformed DSN", map[string]string{"SLOTWATCH_PG_DSN": "postgres://u:" + pw + "@host:notaport/db"},
			[]string{"slotwatch: SLOTWATCH_PG_DSN:", "malformed connection string", "invalid port"}},
		{"missing sslrootcert", map[string]string{"SLOTWATCH_PG_DSN": "postgres://u:" + pw + "@127.0.0.1/db?sslmode=verify-full&sslrootcert=/nonexistent/root.crt"},
			[]string{"slotwatch: SLOTWATCH_PG_DSN:", "TLS settings", "/nonexistent/root.crt", "no such file"}},
		{"missing web config", map[string]string{"SLOTWATCH_WEB_CONFIG": "/nonexistent/web.yml"},
			[]string{"slotwatch: SLOTWATCH_WEB_CONFIG: cannot read the web config \"/nonexistent/web.yml\": no such file or directory"}},
		{"clear-text password in the web config", map[string]string{"SLOTWATCH_WEB_CONFIG": badYAML},
			[]string{"slotwatch: SLOTWATCH_WEB_CONFIG: web config", "bcrypt hash"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SLOTWATCH_PG_DSN": "postgres://u:" + pw + "@127.0.0.1:1/db", "SLOTWATCH_LISTEN": "127.0.0.1:0"}
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
			if strings.Contains(out, pw) || strings.Contains(out, "clear-text") {
				t.Errorf("output shows a password: %s", out)
			}
		})
	}
}

// TestWebConfig: with SLOTWATCH_WEB_CONFIG (TLS and a user) every page
// (/metrics, /slots, /, /healthz) answers over HTTPS verified with the test
// CA to the right password only, and plain HTTP gets no page. The database
// is unreachable on purpose: slotwatch serves anyway.
func TestWebConfig(t *testing.T) {
	pki := testenv.NewPKI(t, "client")
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p := testenv.StartProc(t, testenv.Binary(t, "slotwatch"), map[string]string{
		"SLOTWATCH_PG_DSN":     "postgres://u@127.0.0.1:1/db",
		"SLOTWATCH_LISTEN":     addr,
		"SLOTWATCH_INTERVAL":   "200ms",
		"SLOTWATCH_WEB_CONFIG": webconfigtest.Write(t, pki.ServerCert, pki.ServerKey, map[string]string{"prometheus": "right-pw"}),
	})
	cl := webconfigtest.Client(t, pki.CA)
	eventually(t, 20*time.Second, func() (bool, string) {
		code, _, err := webconfigtest.Get(cl, "https://"+addr+"/healthz", "prometheus", "right-pw")
		if err != nil {
			return false, err.Error()
		}
		return code == 200, fmt.Sprint(code)
	})
	if !strings.Contains(p.Output(), "tls=true basic_auth_users=1") {
		t.Errorf("the start line does not say TLS and one user:\n%s", tailString(p.Output(), 3000))
	}
	for _, path := range []string{"/metrics", "/slots", "/", "/healthz"} {
		for _, tc := range []struct {
			user, pw string
			want     int
		}{{"prometheus", "right-pw", 200}, {"prometheus", "wrong-pw", 401}, {"", "", 401}} {
			code, body, err := webconfigtest.Get(cl, "https://"+addr+path, tc.user, tc.pw)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			if code != tc.want {
				t.Errorf("GET %s as %q/%q: %d, want %d", path, tc.user, tc.pw, code, tc.want)
			}
			if path == "/metrics" && code == 200 && !strings.Contains(body, "slotwatch_up") {
				t.Errorf("GET /metrics: no slotwatch_up")
			}
		}
	}
	code, body, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/metrics", "prometheus", "right-pw")
	if err == nil && (code == 200 || strings.Contains(body, "slotwatch_")) {
		t.Errorf("plain HTTP to the TLS endpoint: %d %q", code, body)
	}
	p.Signal(syscall.SIGTERM)
	if c := p.Wait(t, 20*time.Second); c != 0 {
		t.Errorf("exit %d:\n%s", c, tailString(p.Output(), 3000))
	}
}
