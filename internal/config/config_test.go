package config

import (
	"strings"
	"testing"
)

func TestCheckUnknownEnv(t *testing.T) {
	rule := EnvRule{
		Prefixes: []string{"OUTBOX_"},
		Others:   []string{"OUTBOX_ROUTER_"},
		Known:    []string{"OUTBOX_KAFKA_BROKERS", "OUTBOX_KAFKA_SASL_PASSWORD", "OUTBOX_PG_DSN", "OUTBOX_SLOT", "OUTBOX_HTTP_ADDR", "OUTBOX_HTTP_WEB_CONFIG", "OUTBOX_ROUTE_REGISTRY_PASSWORD"},
	}
	for _, tc := range []struct {
		name    string
		environ []string
		want    []string // one line each, in order; nil: accepted
	}{
		{"known settings and other prefixes", []string{"OUTBOX_PG_DSN=x", "OUTBOX_SLOT=", "PATH=/bin", "KAFKA_BROKERS=y", "SLOTWATCH_LISTN=z"}, nil},
		{"secret file form", []string{"OUTBOX_KAFKA_SASL_PASSWORD_FILE=/run/secrets/pw", "OUTBOX_PG_DSN_FILE=/x"}, nil},
		{"another binary's namespace", []string{"OUTBOX_ROUTER_SOURCE_TOPIC=t", "OUTBOX_ROUTER_GRUOP=g"}, nil},
		{"tooling", []string{"OUTBOX_TEST_KAFKA_BROKERS=k", "OUTBOX_CACHE_DIR=/c", "OUTBOX_SOAK=1", "OUTBOX_SOAK_RUNS=3", "OUTBOX_FENCING_COST=1", "OUTBOX_HA_LOGS=1", "OUTBOX_STACK_PG_PORT=1", "OUTBOX_BENCH_FSYNC=off"}, nil},
		{"typo with a suggestion", []string{"OUTBOX_KAFKA_BROKER=k"},
			[]string{"OUTBOX_KAFKA_BROKER: unknown setting; did you mean OUTBOX_KAFKA_BROKERS? (-help lists the settings; unset it to start)"}},
		{"typo of a secret file", []string{"OUTBOX_KAFKA_SASL_PASWORD_FILE=/x"},
			[]string{"OUTBOX_KAFKA_SASL_PASWORD_FILE: unknown setting; did you mean OUTBOX_KAFKA_SASL_PASSWORD_FILE? (-help lists the settings; unset it to start)"}},
		{"empty value still refused", []string{"OUTBOX_SLOTS="},
			[]string{"OUTBOX_SLOTS: unknown setting; did you mean OUTBOX_SLOT? (-help lists the settings; unset it to start)"}},
		{"every setting has a file form", []string{"OUTBOX_ROUTE_REGISTRY_PASSWORD_FILE=/x", "OUTBOX_SLOT_FILE=/y"}, nil},
		{"nothing close", []string{"OUTBOX_COLOUR=blue"},
			[]string{"OUTBOX_COLOUR: unknown setting (-help lists the settings; unset it to start)"}},
		{"a tooling look-alike is not tooling", []string{"OUTBOX_TESTING=1"},
			[]string{"OUTBOX_TESTING: unknown setting (-help lists the settings; unset it to start)"}},
		{"every unknown, once each", []string{"OUTBOX_HTTP_ADR=1", "OUTBOX_PG_DNS=2", "OUTBOX_HTTP_ADR=3"},
			[]string{
				"OUTBOX_HTTP_ADR: unknown setting; did you mean OUTBOX_HTTP_ADDR? (-help lists the settings; unset it to start)",
				"OUTBOX_PG_DNS: unknown setting; did you mean OUTBOX_PG_DSN? (-help lists the settings; unset it to start)",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckUnknownEnv(tc.environ, rule)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want %q", tc.want)
			}
			if got := strings.Split(err.Error(), "\n"); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got\n%s\nwant\n%s", err, strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"abc", "ab", 1}, {"ab", "ba", 2}, {"kitten", "sitting", 3}, {"", "abc", 3},
	} {
		if got := distance(tc.a, tc.b); got != tc.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestEnvRuleReads(t *testing.T) {
	rule := EnvRule{Prefixes: []string{"OUTBOX_"}, Known: []string{"OUTBOX_PG_DSN", "OUTBOX_KAFKA_TLS_CA_FILE", "MAINTAIN_MODE"}}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"OUTBOX_PG_DSN", true},
		{"OUTBOX_PG_DSN_FILE", true},
		{"OUTBOX_KAFKA_TLS_CA_FILE", true},
		{"OUTBOX_KAFKA_TLS_CA_FILE_FILE", true}, // the file that names the CA file
		{"MAINTAIN_MODE", true},                 // outside Prefixes, still read
		{"OUTBOX_PG_DSNS", false},
		{"OUTBOX_TEST_KAFKA_BROKERS", false}, // tooling is accepted, not read
		{"OUTBOX_FILE", false},
		{"PATH", false},
	} {
		if got := rule.Reads(tc.name); got != tc.want {
			t.Errorf("Reads(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
