package webconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/internal/webconfig/webconfigtest"
)

// writeFile writes a web config (or any file) into dir and returns its path.
func writeFile(t testing.TB, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func hash(t testing.TB, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// TestCheck: a web config that cannot be used refuses start with one line
// that names the setting and the file; a good one passes.
func TestCheck(t *testing.T) {
	pki := testenv.NewPKI(t, "client")
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body string
		want       string // substring of the one-line error; "" means valid
	}{
		{"tls and users", "tls_server_config:\n  cert_file: " + pki.ServerCert + "\n  key_file: " + pki.ServerKey + "\nbasic_auth_users:\n  alice: " + hash(t, "pw") + "\n", ""},
		{"users only", "basic_auth_users:\n  alice: " + hash(t, "pw") + "\n", ""},
		{"empty file", "", ""},
		{"bad yaml", "tls_server_config: [\n", "yaml: line 1"},
		{"unknown key", "tls_server_config:\n  cert_fil: x\n", "field cert_fil not found"},
		{"missing cert", "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "nope.crt"},
		{"key without cert", "tls_server_config:\n  key_file: " + pki.ServerKey + "\n", "missing one of cert or cert_file"},
		{"not a certificate", "tls_server_config:\n  cert_file: " + pki.ServerKey + "\n  key_file: " + pki.ServerKey + "\n", "failed to load X509KeyPair"},
		{"clear-text password", "basic_auth_users:\n  alice: hunter2\n", "bcrypt hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "_")+".yml", tc.body)
			err := Check("TLS_WEB_CONFIG", path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused a good file: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error with %q", tc.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "TLS_WEB_CONFIG: ") || !strings.Contains(msg, path) || !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line naming TLS_WEB_CONFIG, %s and %q", msg, path, tc.want)
			}
			if strings.Contains(msg, "hunter2") {
				t.Errorf("error %q shows the clear-text password", msg)
			}
		})
	}
	if err := Check("X", ""); err != nil {
		t.Errorf("no file: %v", err)
	}
	if err := Check("X", filepath.Join(dir, "absent.yml")); err == nil || err.Error() != `X: cannot read the web config "`+filepath.Join(dir, "absent.yml")+`": no such file or directory` {
		t.Errorf("missing file: %v", err)
	}
}

// serve runs Serve on a free loopback port until the test ends.
func serve(t *testing.T, path string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "secret metrics") }), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() {
		done <- Serve(ln, srv, "TEST_WEB_CONFIG", path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve after Shutdown: %v, want nil", err)
		}
	})
	return ln.Addr().String()
}

// TestServeTLSAndBasicAuth: with TLS and a user, HTTPS verified with the
// right CA and the right password gets the page; a wrong password or none
// gets 401; a client that trusts another CA does not connect; plain HTTP to
// the port gets no page.
func TestServeTLSAndBasicAuth(t *testing.T) {
	pki := testenv.NewPKI(t, "client")
	path := writeFile(t, t.TempDir(), "web.yml", "tls_server_config:\n  cert_file: "+pki.ServerCert+"\n  key_file: "+pki.ServerKey+
		"\nbasic_auth_users:\n  prometheus: "+hash(t, "right-password")+"\n")
	if err := Check("TEST_WEB_CONFIG", path); err != nil {
		t.Fatal(err)
	}
	if tls, users := Summary(path); !tls || users != 1 || Scheme(path) != "https" {
		t.Errorf("Summary = %v, %d; Scheme %s; want true, 1, https", tls, users, Scheme(path))
	}
	addr := serve(t, path)
	cl := webconfigtest.Client(t, pki.CA)
	for _, tc := range []struct {
		user, password string
		code           int
	}{
		{"prometheus", "right-password", 200},
		{"prometheus", "wrong-password", 401},
		{"someone", "right-password", 401},
		{"", "", 401},
	} {
		code, body, err := webconfigtest.Get(cl, "https://"+addr+"/metrics", tc.user, tc.password)
		if err != nil {
			t.Fatalf("%s/%s: %v", tc.user, tc.password, err)
		}
		if code != tc.code || (code == 200) != (body == "secret metrics") {
			t.Errorf("user %q password %q: %d %q; want %d", tc.user, tc.password, code, body, tc.code)
		}
	}
	if _, _, err := webconfigtest.Get(webconfigtest.Client(t, pki.OtherCA), "https://"+addr+"/metrics", "prometheus", "right-password"); err == nil || !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("a client trusting another CA: %v; want a certificate verification error", err)
	}
	code, body, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/metrics", "prometheus", "right-password")
	if err == nil && (code == 200 || strings.Contains(body, "secret metrics")) {
		t.Errorf("plain HTTP to the TLS port: %d %q; want no page", code, body)
	}
	t.Logf("plain HTTP to the TLS port: %d %q %v", code, strings.TrimSpace(body), err)
}

// TestServePlain: without a file, plain HTTP and no authentication; with
// users but no TLS, authentication still applies (and a warning is logged
// by Serve, not asserted here).
func TestServePlain(t *testing.T) {
	addr := serve(t, "")
	if code, body, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/", "", ""); err != nil || code != 200 || body != "secret metrics" {
		t.Errorf("no web config: %d %q %v", code, body, err)
	}
	path := writeFile(t, t.TempDir(), "web.yml", "basic_auth_users:\n  prometheus: "+hash(t, "pw")+"\n")
	addr = serve(t, path)
	if code, _, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/", "", ""); err != nil || code != 401 {
		t.Errorf("users, no credentials: %d %v; want 401", code, err)
	}
	if code, _, err := webconfigtest.Get(webconfigtest.Client(t, ""), "http://"+addr+"/", "prometheus", "pw"); err != nil || code != 200 {
		t.Errorf("users, right password: %d %v; want 200", code, err)
	}
	if Scheme(path) != "http" {
		t.Errorf("Scheme = %s, want http", Scheme(path))
	}
}
