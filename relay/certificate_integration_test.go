package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// TestExpiredCertificateAfterStart (issue 35, item 12): the connector
// started with a good client certificate and streams; then its certificate
// files hold one that has expired (a certificate that expired while it ran,
// or a renewal that put an expired one in place), and the next session
// presents it. That is the deployment's to fix, as it is at start: Run
// returns a fatal error naming the expired certificate (the process exits
// non-zero, a crash loop with the reason) instead of reconnecting with
// backoff for ever. For PostgreSQL (hostssl with cert authentication: the
// server's TLS alert) and for Kafka (a broker that requires client
// certificates; kfake, in-process, as the shared broker has no mutual TLS
// listener).
func TestExpiredCertificateAfterStart(t *testing.T) {
	pki := testenv.NewPKI(t, "outbox_connector")
	// certFiles copies the good client pair where the connector reads it,
	// and returns a func that puts the expired pair in its place.
	certFiles := func(t *testing.T) (cert, key string, expire func()) {
		dir := t.TempDir()
		cert, key = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
		put := func(c, k string) {
			if err := os.WriteFile(cert, pki.Read(t, c), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(key, pki.Read(t, k), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		put(pki.ClientCert, pki.ClientKey)
		return cert, key, func() { put(pki.ExpiredCert, pki.ExpiredKey) }
	}
	// endSession ends the relay's session from the server side (not the
	// lease's): the next one connects again.
	endSession := func(t *testing.T, admin *pgx.Conn, user string) {
		t.Helper()
		if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE usename = $1 AND pid <> pg_backend_pid() AND application_name <> 'outbox-connector lease'`, user); err != nil {
			t.Fatal(err)
		}
	}
	// waitFatal waits for Run to return, and checks that it says why.
	waitFatal := func(t *testing.T, run *running, says string) {
		t.Helper()
		began := time.Now()
		select {
		case err := <-run.done:
			run.cancel = nil
			t.Logf("Run returned %s after the session ended: %v", time.Since(began).Round(100*time.Millisecond), err)
			if !fatal.Is(err) || !strings.Contains(err.Error(), says) {
				t.Errorf("Run returned %v; want a fatal error saying %q", err, says)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("still running 30 s after its session ended with an expired certificate; retrying it: %s", run.relay.LastError())
		}
	}

	t.Run("PostgreSQL", func(t *testing.T) {
		pg := testenv.StartPostgres(t, testenv.PGOptions{
			Settings: map[string]string{"ssl": "on", "ssl_cert_file": "'server.crt'", "ssl_key_file": "'server.key'", "ssl_ca_file": "'ca.crt'"},
			HBA: []string{
				"hostssl outbox outbox_connector 127.0.0.1/32 cert",
				"hostssl replication outbox_connector 127.0.0.1/32 cert",
				"host all outbox_connector 127.0.0.1/32 reject",
				"host replication outbox_connector 127.0.0.1/32 reject",
			},
			Files: map[string][]byte{"server.crt": pki.Read(t, pki.ServerCert), "server.key": pki.Read(t, pki.ServerKey), "ca.crt": pki.Read(t, pki.CA)},
		})
		admin := pg.Conn(t, "outbox")
		cert, key, expire := certFiles(t)
		q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {pki.CA}, "sslcert": {cert}, "sslkey": {key}}
		dsn := (&url.URL{Scheme: "postgres", User: url.User("outbox_connector"), Host: fmt.Sprintf("127.0.0.1:%d", pg.Port), Path: "/outbox", RawQuery: q.Encode()}).String()
		cfg := testConfig(t, dsn, testenv.SharedKafka(t))
		run := startRelay(t, cfg)
		run.waitStreaming(t)

		expire()
		endSession(t, admin, "outbox_connector")
		waitFatal(t, run, "expired certificate")
	})

	t.Run("Kafka", func(t *testing.T) {
		server, err := tls.LoadX509KeyPair(pki.ServerCert, pki.ServerKey)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pki.Read(t, pki.CA))
		kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{
			Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(kc.Close)
		pg := testenv.StartPostgres(t, testenv.PGOptions{})
		admin := pg.Conn(t, "outbox")
		cert, key, expire := certFiles(t)
		cfg := testConfig(t, pg.DSN("outbox"), strings.Join(kc.ListenAddrs(), ","))
		cfg.Kafka.TLSCAFile, cfg.Kafka.TLSCertFile, cfg.Kafka.TLSKeyFile = pki.CA, cert, key
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		run := startRelay(t, cfg)
		run.waitStreaming(t)

		expire()
		endSession(t, admin, "postgres")
		waitFatal(t, run, "expired certificate")
	})
}
