package fatal

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestIsCertificate (issue 35, item 12): a TLS handshake that fails on a
// certificate stops the connector, whenever it happens: the errors here are
// the ones pgconn and franz-go return for a connection a session opens
// after start-up, with a client certificate that has expired since (the
// server's alert), or a server certificate that has (this side's
// verification). Other TLS failures stay transient.
func TestIsCertificate(t *testing.T) {
	pki := testenv.NewPKI(t, "outbox_connector")
	server := loadPair(t, pki.ServerCert, pki.ServerKey)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.Read(t, pki.CA))
	requireClientCert := &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots}
	pgDSN := func(addr, cert, key string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("host=%s port=%s user=outbox_connector dbname=outbox sslmode=verify-full sslrootcert=%s sslcert=%s sslkey=%s connect_timeout=5", host, port, pki.CA, cert, key)
	}

	for _, tc := range []struct {
		name string
		err  func(t *testing.T) error
		want bool
	}{
		{"PostgreSQL refuses an expired client certificate", func(t *testing.T) error {
			return pgConnect(t, pgDSN(fakePostgres(t, requireClientCert), pki.ExpiredCert, pki.ExpiredKey))
		}, true},
		{"PostgreSQL wants a client certificate of another CA", func(t *testing.T) error {
			other := loadPair(t, pki.ServerCert, pki.ServerKey)
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pki.Read(t, pki.OtherCA))
			return pgConnect(t, pgDSN(fakePostgres(t, &tls.Config{Certificates: []tls.Certificate{other}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}), pki.ClientCert, pki.ClientKey))
		}, true},
		{"PostgreSQL's server certificate expired", func(t *testing.T) error {
			// The expired client certificate serves as the server's: its
			// validity is checked first.
			expired := loadPair(t, pki.ExpiredCert, pki.ExpiredKey)
			return pgConnect(t, pgDSN(fakePostgres(t, &tls.Config{Certificates: []tls.Certificate{expired}}), pki.ClientCert, pki.ClientKey))
		}, true},
		{"PostgreSQL's handshake fails for another reason", func(t *testing.T) error {
			broken := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, errors.New("no certificate loaded") }}
			return pgConnect(t, pgDSN(fakePostgres(t, broken), pki.ClientCert, pki.ClientKey))
		}, false},
		{"PostgreSQL resets the connection in the handshake", func(t *testing.T) error {
			return pgConnect(t, pgDSN(fakePostgres(t, nil), pki.ClientCert, pki.ClientKey))
		}, false},
		{"Kafka refuses an expired client certificate", func(t *testing.T) error {
			return kafkaProducerID(t, requireClientCert, roots, loadPair(t, pki.ExpiredCert, pki.ExpiredKey))
		}, true},
		{"Kafka takes a valid client certificate", func(t *testing.T) error {
			return kafkaProducerID(t, requireClientCert, roots, loadPair(t, pki.ClientCert, pki.ClientKey))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err(t)
			if got := Is(err); got != tc.want {
				t.Errorf("Is(%v) = %v; want %v", err, got, tc.want)
			}
			t.Logf("%v", err)
		})
	}

	// The x509 verdicts alone, as a session's error wraps them.
	for _, err := range []error{
		x509.CertificateInvalidError{Reason: x509.Expired},
		x509.UnknownAuthorityError{},
		x509.HostnameError{Certificate: &x509.Certificate{}, Host: "db.example"},
		&tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}},
	} {
		if w := fmt.Errorf("connect to PostgreSQL: %w", err); !Is(w) {
			t.Errorf("Is(%v) = false; want true", w)
		}
	}
}

func loadPair(t *testing.T, cert, key string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fakePostgres accepts connections that ask for TLS (SSLRequest) and
// answers with a handshake under cfg, then drains what the client sends
// until it closes, so that it reads the alert rather than a reset (a server
// that closes at once races the client's startup message). A nil cfg
// closes the connection after the SSLRequest's answer instead.
func fakePostgres(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				req := make([]byte, 8)
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				if _, err := c.Write([]byte{'S'}); err != nil || cfg == nil {
					return
				}
				tc := tls.Server(c, cfg)
				if err := tc.Handshake(); err != nil {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				_, _ = io.Copy(io.Discard, tc)
			}()
		}
	}()
	return ln.Addr().String()
}

// pgConnect connects as a session does, and returns the error.
func pgConnect(t *testing.T, dsn string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	if err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a fake server")
	}
	return fmt.Errorf("connect to PostgreSQL: %w", err)
}

// kafkaProducerID initialises a transactional producer (a session's first
// step with Kafka) with the client certificate cert against a broker
// serving TLS under srv, and returns its error as the session wraps it.
func kafkaProducerID(t *testing.T, srv *tls.Config, roots *x509.CertPool, cert tls.Certificate) error {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("outbox-connector-test"),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err = cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("initialise the Kafka transactional producer: %w", err)
	}
	return nil
}
