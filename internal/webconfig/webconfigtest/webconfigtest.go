// Package webconfigtest writes web configuration files for tests of the
// binaries' HTTP endpoints and talks to those endpoints as a scraper would.
package webconfigtest

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Write writes a web config into a temporary directory and returns its path:
// TLS with certFile and keyFile when certFile is set, and basic_auth_users
// with each user's password bcrypt-hashed (at the lowest cost: tests only).
func Write(t testing.TB, certFile, keyFile string, users map[string]string) string {
	t.Helper()
	var b strings.Builder
	if certFile != "" {
		b.WriteString("tls_server_config:\n  cert_file: " + certFile + "\n  key_file: " + keyFile + "\n")
	}
	if len(users) > 0 {
		b.WriteString("basic_auth_users:\n")
		names := make([]string, 0, len(users))
		for u := range users {
			names = append(names, u)
		}
		sort.Strings(names)
		for _, u := range names {
			h, err := bcrypt.GenerateFromPassword([]byte(users[u]), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString("  " + u + ": " + string(h) + "\n")
		}
	}
	p := filepath.Join(t.TempDir(), "web-config.yml")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Client is an HTTP client that trusts only the CA in caFile (none: plain
// HTTP only).
func Client(t testing.TB, caFile string) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	if caFile != "" {
		raw, err := os.ReadFile(caFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			t.Fatalf("no certificate in %s", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	// 30 s: a request for an unknown user is checked against a bcrypt hash
	// of the default cost (exporter-toolkit does so to hide which users
	// exist), which takes seconds under -race on two busy cores.
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

// Get fetches url with basic auth (when user is set) and returns the status
// and body; a transport error is returned as is.
func Get(cl *http.Client, url, user, password string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
