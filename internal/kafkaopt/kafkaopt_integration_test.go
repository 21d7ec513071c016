package kafkaopt

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

const (
	scramUser     = "alice"
	scramPassword = "alice-Secr3t-pw"
)

// TestCheckAgainstSecureBroker runs Check and a produce/consume round trip
// against a real broker's SASL_SSL listener (one broker for every case):
// good settings pass; each kind of bad setting is a *ConfigError naming the
// variable to change, and the password never appears in it; a broker that
// does not answer is not a ConfigError (the caller may wait for it).
func TestCheckAgainstSecureBroker(t *testing.T) {
	pki := testenv.NewPKI(t, "outbox_connector")
	k := testenv.StartSecureKafka(t, pki, map[string]string{scramUser: scramPassword})
	good := Config{Brokers: k.Addr, ClientID: "check-test", TLSCAFile: pki.CA,
		SASLMechanism: "SCRAM-SHA-512", SASLUsername: scramUser, SASLPassword: scramPassword}

	t.Run("round trip over TLS and SCRAM", func(t *testing.T) {
		for _, mech := range []string{"SCRAM-SHA-512", "SCRAM-SHA-256"} {
			c := good
			c.SASLMechanism = mech
			roundTrip(t, c, "check."+strings.ToLower(mech))
		}
	})

	closed, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		change  func(c *Config)
		setting string // the *ConfigError's setting; empty: Check passes
		want    string // in the message
		timeout time.Duration
	}{
		{name: "SCRAM-SHA-512", change: func(*Config) {}},
		{name: "SCRAM-SHA-256", change: func(c *Config) { c.SASLMechanism = "scram-sha-256" }},
		{name: "unrelated CA", change: func(c *Config) { c.TLSCAFile = pki.OtherCA },
			setting: "OUTBOX_KAFKA_TLS_CA_FILE", want: "certificate signed by unknown authority"},
		{name: "system roots", change: func(c *Config) { c.TLSCAFile, c.TLS = "", true },
			setting: "OUTBOX_KAFKA_TLS_CA_FILE", want: "the system's roots"},
		{name: "server name not in the certificate", change: func(c *Config) { c.TLSServerName = "kafka.example.com" },
			setting: "OUTBOX_KAFKA_TLS_SERVER_NAME", want: "kafka.example.com"},
		{name: "wrong password", change: func(c *Config) { c.SASLPassword = "not-" + scramPassword },
			setting: "OUTBOX_KAFKA_SASL_PASSWORD", want: `user "alice" with SCRAM-SHA-512`},
		{name: "unknown user", change: func(c *Config) { c.SASLUsername = "mallory" },
			setting: "OUTBOX_KAFKA_SASL_PASSWORD", want: `user "mallory"`},
		{name: "PLAIN not enabled", change: func(c *Config) { c.SASLMechanism = "PLAIN" },
			setting: "OUTBOX_KAFKA_SASL_MECHANISM", want: "does not enable PLAIN on this listener; it offers SCRAM-SHA-512, SCRAM-SHA-256"},
		{name: "SASL on the PLAINTEXT listener", change: func(c *Config) { c.Brokers, c.TLSCAFile = k.Brokers, "" },
			setting: "OUTBOX_KAFKA_SASL_MECHANISM", want: "does not take SASL"},
		{name: "no TLS on the TLS listener", change: func(c *Config) { c.TLSCAFile = "" },
			setting: "OUTBOX_KAFKA_TLS", want: "speaks TLS and the client does not"},
		// The broker closes the connection without a word: that cannot be
		// told from a broker going down.
		{name: "TLS on the PLAINTEXT listener", change: func(c *Config) { c.Brokers, c.SASLMechanism = k.Brokers, "" },
			want: "did not answer", timeout: 2 * time.Second},
		{name: "nothing listening", change: func(c *Config) { c.Brokers = "127.0.0.1:" + strconv.Itoa(closed) },
			want: "did not answer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.change(&c)
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 15 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			err := c.Check(ctx)
			took := time.Since(start)
			var ce *ConfigError
			switch {
			case tc.setting == "" && tc.want == "":
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			case err == nil:
				t.Fatalf("Check passed; want an error with %q", tc.want)
			case tc.setting == "" && errors.As(err, &ce):
				t.Fatalf("Check: %v is a ConfigError; want a plain error (the broker may come up)", err)
			case tc.setting != "" && !errors.As(err, &ce):
				t.Fatalf("Check: %v (%T); want a ConfigError naming %s", err, err, tc.setting)
			}
			msg := err.Error()
			t.Logf("%s (after %s)", msg, took.Round(time.Millisecond))
			if ce != nil && (ce.Setting != tc.setting || !strings.HasPrefix(msg, tc.setting+": ")) {
				t.Errorf("setting %q; want %q at the start of the message", ce.Setting, tc.setting)
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("message lacks %q", tc.want)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("message is not one line")
			}
			if strings.Contains(msg, scramPassword) {
				t.Errorf("message holds the password")
			}
			// A setting's fault shows in the first answer: no retrying
			// until the deadline (15s).
			if ce != nil && took > 10*time.Second {
				t.Errorf("took %s to tell a bad setting", took)
			}
		})
	}
}

// roundTrip creates topic, produces a record and consumes it back with c's
// options (TLS and SASL as configured).
func roundTrip(t *testing.T, c Config, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(c.Opts(nil), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatalf("%s: create topic %s: %v", c.SASLMechanism, topic, err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(c.SASLMechanism)}).FirstErr(); err != nil {
		t.Fatalf("%s: produce: %v", c.SASLMechanism, err)
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("%s: consume: %v", c.SASLMechanism, err)
		}
		if recs := fs.Records(); len(recs) > 0 {
			if got := string(recs[0].Value); got != c.SASLMechanism {
				t.Fatalf("consumed %q; want %q", got, c.SASLMechanism)
			}
			return
		}
	}
}
