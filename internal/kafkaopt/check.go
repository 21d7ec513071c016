package kafkaopt

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ConfigError is a Kafka connection setting that can never work as it is:
// the broker's certificate does not verify, the broker refused the client's
// certificate, the SASL mechanism or the credentials. Retrying does not
// help; a person must change the setting it names.
type ConfigError struct {
	// Setting is the environment variable to change, e.g.
	// OUTBOX_KAFKA_TLS_CA_FILE.
	Setting string
	// Msg says what happened and what to do, on one line. It never holds
	// the SASL password.
	Msg string
	Err error
}

func (e *ConfigError) Error() string { return e.Setting + ": " + e.Msg }
func (e *ConfigError) Unwrap() error { return e.Err }

// Check connects to the brokers with the settings and asks for the
// cluster's metadata, within ctx (give it a deadline). It returns nil when a
// broker answered, a *ConfigError when the answer shows that the settings
// can never work, and otherwise the error met: the brokers may just not be
// up yet, and the caller decides whether to go on.
//
// A listener that expects TLS or SASL from a client that does neither, or
// a plaintext listener spoken to with TLS, closes the connection without
// saying why. Check cannot tell that from a broker that is going down, so
// it returns the plain error then (at once, or at ctx's deadline when the
// client retries), with franz-go's guess in its text.
func (c *Config) Check(ctx context.Context) error {
	cl, err := kgo.NewClient(c.Opts(nil)...)
	if err != nil {
		return &ConfigError{Setting: "OUTBOX_KAFKA_BROKERS", Msg: fmt.Sprintf("invalid client settings: %v", err), Err: err}
	}
	defer cl.Close()
	_, err = kadm.NewClient(cl).BrokerMetadata(ctx)
	if err == nil {
		return nil
	}
	if ce := c.classify(ctx, err); ce != nil {
		return ce
	}
	return fmt.Errorf("Kafka at %s did not answer a metadata request: %w", c.Brokers, err)
}

// classify returns the *ConfigError that err shows, or nil for an error a
// retry may get past. It is the one place that decides which connection
// errors are the settings' fault.
func (c *Config) classify(ctx context.Context, err error) *ConfigError {
	var (
		unknownCA x509.UnknownAuthorityError
		badHost   x509.HostnameError
		invalid   x509.CertificateInvalidError
		opErr     *net.OpError
	)
	mech := strings.ToUpper(c.SASLMechanism)
	bad := func(setting, format string, args ...any) *ConfigError {
		return &ConfigError{Setting: setting, Msg: c.scrub(fmt.Sprintf(format, args...)), Err: err}
	}
	switch {
	case errors.As(err, &unknownCA):
		return bad("OUTBOX_KAFKA_TLS_CA_FILE", "the broker's certificate is not signed by a CA in %s (%v); set OUTBOX_KAFKA_TLS_CA_FILE to the PEM bundle of the CA that signed the brokers' certificates",
			c.caSource(), unknownCA)
	case errors.As(err, &badHost):
		return bad("OUTBOX_KAFKA_TLS_SERVER_NAME", "the broker's certificate does not name the host connected to (%v); connect by a name the certificate lists (OUTBOX_KAFKA_BROKERS and the brokers' advertised listeners) or set OUTBOX_KAFKA_TLS_SERVER_NAME to one",
			badHost)
	case errors.As(err, &invalid):
		return bad("OUTBOX_KAFKA_TLS_CA_FILE", "the broker's certificate is not valid (%v); renew the brokers' certificates or fix OUTBOX_KAFKA_TLS_CA_FILE", invalid)
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		// A TLS alert from the broker: it refused the handshake, most
		// often for the client certificate (missing, expired, or signed
		// by a CA the broker's trust store lacks).
		return bad("OUTBOX_KAFKA_TLS_CERT_FILE", "the broker refused the TLS handshake (%v); give a client certificate the brokers' trust store accepts (OUTBOX_KAFKA_TLS_CERT_FILE, OUTBOX_KAFKA_TLS_KEY_FILE)", opErr)
	case !c.tlsEnabled() && strings.Contains(err.Error(), "plaintext connection speaking to a tls endpoint"):
		// franz-go recognises a TLS alert where a Kafka response should
		// be; it says so only in the error's text.
		return bad("OUTBOX_KAFKA_TLS", "the broker's listener speaks TLS and the client does not; set OUTBOX_KAFKA_TLS=true and OUTBOX_KAFKA_TLS_CA_FILE to the CA that signed the brokers' certificates")
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		offered := "other mechanisms"
		if m := c.offeredMechanisms(ctx); len(m) > 0 {
			offered = strings.Join(m, ", ")
		}
		return bad("OUTBOX_KAFKA_SASL_MECHANISM", "the broker does not enable %s on this listener; it offers %s: set one of them", mech, offered)
	case errors.Is(err, kerr.IllegalSaslState):
		return bad("OUTBOX_KAFKA_SASL_MECHANISM", "the broker's listener does not take SASL (%v); unset OUTBOX_KAFKA_SASL_MECHANISM or connect to the brokers' SASL listener", err)
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		if mech == "OAUTHBEARER" {
			return bad("OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE", "the broker refused the OAUTHBEARER token (%v); check the token in OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE", err)
		}
		return bad("OUTBOX_KAFKA_SASL_PASSWORD", "the broker refused user %q with %s (%v); check OUTBOX_KAFKA_SASL_USERNAME and OUTBOX_KAFKA_SASL_PASSWORD (or _FILE), and that the user has %s credentials on the cluster",
			c.SASLUsername, mech, err, mech)
	}
	return nil
}

// offeredMechanisms asks a broker, on a connection without SASL, which
// mechanisms its listener enables: a SASL handshake for the configured
// mechanism is refused with the list. It returns nil when it cannot tell.
func (c *Config) offeredMechanisms(ctx context.Context) []string {
	plain := *c
	plain.SASLMechanism = ""
	cl, err := kgo.NewClient(plain.Opts(nil)...)
	if err != nil {
		return nil
	}
	defer cl.Close()
	req := kmsg.NewPtrSASLHandshakeRequest()
	req.Version = 1
	req.Mechanism = strings.ToUpper(c.SASLMechanism)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil
	}
	return resp.SupportedMechanisms
}

func (c *Config) caSource() string {
	if c.TLSCAFile != "" {
		return fmt.Sprintf("OUTBOX_KAFKA_TLS_CA_FILE (%s)", c.TLSCAFile)
	}
	return "the system's roots"
}

// scrub removes the SASL password from s, in case a broker or a library
// ever echoes it. Very short passwords are left alone: replacing every
// occurrence of two letters would garble the message and hide nothing.
func (c *Config) scrub(s string) string {
	if len(c.SASLPassword) >= 4 {
		s = strings.ReplaceAll(s, c.SASLPassword, "xxxxx")
	}
	return s
}
