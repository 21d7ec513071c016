package kafkaopt

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

func bind(t *testing.T, env map[string]string) *Config {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	b := config.NewBinder(fs, func(k string) string { return env[k] })
	c.Bind(b, "test")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		env  map[string]string
		want string // substring of the error; empty: valid
	}{
		{"brokers only", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092"}, ""},
		{"no brokers", map[string]string{}, "OUTBOX_KAFKA_BROKERS: missing"},
		{"unknown mechanism", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092", "OUTBOX_KAFKA_SASL_MECHANISM": "GSSAPI"}, "OUTBOX_KAFKA_SASL_MECHANISM: \"GSSAPI\" is not supported"},
		{"scram without password", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092", "OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "OUTBOX_KAFKA_SASL_USERNAME": "u"}, "required for SASL SCRAM-SHA-512"},
		{"missing CA", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092", "OUTBOX_KAFKA_TLS_CA_FILE": filepath.Join(dir, "nope.pem")}, "OUTBOX_KAFKA_TLS_CA_FILE: cannot read"},
		{"cert without key", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092", "OUTBOX_KAFKA_TLS_CERT_FILE": "c.pem"}, "set both or neither"},
		{"oauth without token", map[string]string{"OUTBOX_KAFKA_BROKERS": "k:9092", "OUTBOX_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}, "OUTBOX_KAFKA_SASL_OAUTH_TOKEN_FILE: required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := bind(t, tt.env).Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v; want one containing %q", err, tt.want)
			}
		})
	}
}

// TestSASLAgainstKfake authenticates with PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512 against kfake, and sees a wrong password refused, the
// password coming from a _FILE setting and never appearing in the error.
func TestSASLAgainstKfake(t *testing.T) {
	const user, pass = "alice", "s3cret-pass"
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			pwFile := filepath.Join(t.TempDir(), "pw")
			for _, try := range []struct {
				pw string
				ok bool
			}{{pass, true}, {"wrong-pass", false}} {
				if err := os.WriteFile(pwFile, []byte(try.pw+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				cfg := bind(t, map[string]string{
					"OUTBOX_KAFKA_BROKERS":            c.ListenAddrs()[0],
					"OUTBOX_KAFKA_SASL_MECHANISM":     mech,
					"OUTBOX_KAFKA_SASL_USERNAME":      user,
					"OUTBOX_KAFKA_SASL_PASSWORD_FILE": pwFile,
				})
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				cl, err := kgo.NewClient(cfg.Opts(nil)...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = cl.Ping(ctx)
				cancel()
				cl.Close()
				if try.ok && err != nil {
					t.Fatalf("%s with the right password: %v", mech, err)
				}
				if !try.ok {
					if err == nil {
						t.Fatalf("%s accepted a wrong password", mech)
					}
					if strings.Contains(err.Error(), try.pw) {
						t.Fatalf("the error reveals the password: %v", err)
					}
				}
			}
		})
	}
}
