// Package kafkaopt holds the Kafka connection settings every binary shares,
// all named OUTBOX_KAFKA_* (brokers, client id, TLS, SASL), and turns them
// into franz-go client options. Secrets (the SASL password, an OAuth token)
// can come from files (<NAME>_FILE) and never appear in errors or logs.
package kafkaopt

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Config is how to reach Kafka.
type Config struct {
	// Brokers is a comma-separated bootstrap list (OUTBOX_KAFKA_BROKERS).
	Brokers string
	// ClientID is the Kafka client id (OUTBOX_KAFKA_CLIENT_ID).
	ClientID string

	// TLS enables TLS (OUTBOX_KAFKA_TLS, default false; implied by any
	// other TLS setting).
	TLS bool
	// TLSCAFile is a PEM CA bundle to verify brokers with
	// (OUTBOX_KAFKA_TLS_CA_FILE; default: the system's roots).
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a PEM client certificate and key
	// (OUTBOX_KAFKA_TLS_CERT_FILE, OUTBOX_KAFKA_TLS_KEY_FILE).
	TLSCertFile, TLSKeyFile string
	// TLSServerName overrides the name verified in the broker's certificate
	// (OUTBOX_KAFKA_TLS_SERVER_NAME).
	TLSServerName string
	// TLSInsecureSkipVerify disables certificate verification
	// (OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY, default false). For tests only.
	TLSInsecureSkipVerify bool

	// SASLMechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
	// (OUTBOX_KAFKA_SASL_MECHANISM; empty: no SASL).
	SASLMechanism string
	// SASLUsername and SASLPassword authenticate PLAIN and SCRAM
	// (OUTBOX_KAFKA_SASL_USERNAME, OUTBOX_KAFKA_SASL_PASSWORD or
	// OUTBOX_KAFKA_SASL_PASSWORD_FILE).
	SASLUsername, SASLPassword string
	// SASLOAuthTokenFile holds the OAUTHBEARER token, re-read whenever the
	// file changes (OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE).
	SASLOAuthTokenFile string
}

// Bind registers the settings on b.
func (c *Config) Bind(b *config.Binder, defaultClientID string) {
	b.String(&c.Brokers, "kafka-brokers", "OUTBOX_KAFKA_BROKERS", "", config.Required+"comma-separated Kafka bootstrap brokers (host:port)")
	b.String(&c.ClientID, "kafka-client-id", "OUTBOX_KAFKA_CLIENT_ID", defaultClientID, "Kafka client id")
	b.Bool(&c.TLS, "kafka-tls", "OUTBOX_KAFKA_TLS", false, "connect to Kafka with TLS (implied by the other TLS settings)")
	b.String(&c.TLSCAFile, "kafka-tls-ca-file", "OUTBOX_KAFKA_TLS_CA_FILE", "", "PEM CA bundle that signs the brokers' certificates (default: system roots)")
	b.String(&c.TLSCertFile, "kafka-tls-cert-file", "OUTBOX_KAFKA_TLS_CERT_FILE", "", "PEM client certificate for mutual TLS")
	b.String(&c.TLSKeyFile, "kafka-tls-key-file", "OUTBOX_KAFKA_TLS_KEY_FILE", "", "PEM private key of the client certificate")
	b.String(&c.TLSServerName, "kafka-tls-server-name", "OUTBOX_KAFKA_TLS_SERVER_NAME", "", "name to verify in the brokers' certificates (default: the broker host)")
	b.Bool(&c.TLSInsecureSkipVerify, "kafka-tls-insecure-skip-verify", "OUTBOX_KAFKA_TLS_INSECURE_SKIP_VERIFY", false, "INSECURE: do not verify the brokers' certificates")
	b.String(&c.SASLMechanism, "kafka-sasl-mechanism", "OUTBOX_KAFKA_SASL_MECHANISM", "", "SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
	b.String(&c.SASLUsername, "kafka-sasl-username", "OUTBOX_KAFKA_SASL_USERNAME", "", "SASL user (PLAIN, SCRAM)")
	b.Secret(&c.SASLPassword, "kafka-sasl-password", "OUTBOX_KAFKA_SASL_PASSWORD", "SASL password (PLAIN, SCRAM)")
	b.String(&c.SASLOAuthTokenFile, "kafka-sasl-oauth-token-file", "OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE", "", "file holding the OAUTHBEARER token; re-read when it changes")
}

// Validate checks the settings and that the files they name can be read.
func (c *Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Brokers) == "" {
		errs = append(errs, errors.New("OUTBOX_KAFKA_BROKERS: missing; set it to the Kafka bootstrap brokers, e.g. kafka:9092"))
	}
	if _, err := c.tlsConfig(); err != nil {
		errs = append(errs, err)
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
		if c.SASLUsername != "" || c.SASLPassword != "" || c.SASLOAuthTokenFile != "" {
			errs = append(errs, errors.New("OUTBOX_KAFKA_SASL_MECHANISM: missing while SASL credentials are set; set PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"))
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.SASLUsername == "" || c.SASLPassword == "" {
			errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_SASL_USERNAME and OUTBOX_KAFKA_SASL_PASSWORD (or OUTBOX_KAFKA_SASL_PASSWORD_FILE): required for SASL %s", strings.ToUpper(c.SASLMechanism)))
		}
	case "OAUTHBEARER":
		if c.SASLOAuthTokenFile == "" {
			errs = append(errs, errors.New("OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE: required for SASL OAUTHBEARER"))
		} else if _, err := os.ReadFile(c.SASLOAuthTokenFile); err != nil {
			errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE: cannot read %q: %v", c.SASLOAuthTokenFile, unwrapPath(err)))
		}
	default:
		errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_SASL_MECHANISM: %q is not supported; use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER", c.SASLMechanism))
	}
	return errors.Join(errs...)
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (c *Config) tlsEnabled() bool {
	return c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSServerName != "" || c.TLSInsecureSkipVerify
}

func (c *Config) tlsConfig() (*tls.Config, error) {
	if !c.tlsEnabled() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName, InsecureSkipVerify: c.TLSInsecureSkipVerify} //nolint:gosec // skip-verify only behind the explicitly insecure setting
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("OUTBOX_KAFKA_TLS_CA_FILE: cannot read %q: %v", c.TLSCAFile, unwrapPath(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("OUTBOX_KAFKA_TLS_CA_FILE: %q holds no PEM certificate", c.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return nil, errors.New("OUTBOX_KAFKA_TLS_CERT_FILE and OUTBOX_KAFKA_TLS_KEY_FILE: set both or neither")
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("OUTBOX_KAFKA_TLS_CERT_FILE / OUTBOX_KAFKA_TLS_KEY_FILE: cannot load the client certificate: %v", unwrapPath(err))
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// SeedBrokers splits the broker list.
func (c *Config) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Opts returns the client options for the connection settings. Call
// Validate first; Opts ignores what Validate reports.
func (c *Config) Opts(log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(c.SeedBrokers()...), kgo.ClientID(c.ClientID)}
	if log != nil {
		opts = append(opts, kgo.WithLogger(kslog.New(log.With("component", "kafka"))))
	}
	if tc, err := c.tlsConfig(); err == nil && tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if m := c.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts
}

func (c *Config) mechanism() sasl.Mechanism {
	switch strings.ToUpper(c.SASLMechanism) {
	case "PLAIN":
		return plain.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: c.SASLUsername, Pass: c.SASLPassword}.AsSha512Mechanism()
	case "OAUTHBEARER":
		t := &tokenFile{path: c.SASLOAuthTokenFile}
		return oauth.Oauth(t.auth)
	}
	return nil
}

// tokenFile re-reads an OAuth token file when its modification time
// changes, so that a sidecar rotating the token is picked up at the next
// authentication.
type tokenFile struct {
	path  string
	mu    sync.Mutex
	mod   time.Time
	token string
}

func (t *tokenFile) auth(context.Context) (oauth.Auth, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		return oauth.Auth{}, fmt.Errorf("OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE: %v", unwrapPath(err))
	}
	if !fi.ModTime().Equal(t.mod) || t.token == "" {
		raw, err := os.ReadFile(t.path)
		if err != nil {
			return oauth.Auth{}, fmt.Errorf("OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE: %v", unwrapPath(err))
		}
		t.token = strings.TrimSpace(string(raw))
		t.mod = fi.ModTime()
	}
	return oauth.Auth{Token: t.token}, nil
}
