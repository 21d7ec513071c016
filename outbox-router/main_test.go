package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestReadmeDocumentsSettings: every environment variable the binary reads
// is named in README.md (internal/compose checks the other binaries; this
// one is a main package it cannot import).
func TestReadmeDocumentsSettings(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	vars := EnvVars()
	if len(vars) < 10 {
		t.Fatalf("EnvVars() = %v; want every setting", vars)
	}
	for _, v := range vars {
		if !strings.Contains(string(raw), "`"+v+"`") {
			t.Errorf("README.md does not document the outbox-router setting %s", v)
		}
	}
}

func TestConfigInputFormat(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // substring of the error; empty: valid
	}{
		{env: map[string]string{}},
		{env: map[string]string{"OUTBOX_ROUTER_INPUT_FORMAT": "json"}},
		{env: map[string]string{"OUTBOX_ROUTER_INPUT_FORMAT": "avro"}, want: "OUTBOX_ROUTER_INPUT_FORMAT=avro: no schema registry; set OUTBOX_ROUTE_REGISTRY_URL"},
		{env: map[string]string{"OUTBOX_ROUTER_INPUT_FORMAT": "avro", "OUTBOX_ROUTE_REGISTRY_URL": "http://registry:8081"}},
		{env: map[string]string{"OUTBOX_ROUTER_INPUT_FORMAT": "protobuf"}, want: `OUTBOX_ROUTER_INPUT_FORMAT: "protobuf" is not auto, json or avro`},
	} {
		env := map[string]string{"OUTBOX_ROUTER_SOURCE_TOPIC": "dbserver1.public.outbox", "OUTBOX_KAFKA_BROKERS": "127.0.0.1:9092"}
		for k, v := range tc.env {
			env[k] = v
		}
		var c config
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		if _, err := c.bind(fs, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		err := c.validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.want)
		}
	}
}

// TestRawRow: an undecodable value is kept byte for byte: JSON as text,
// anything binary or in the Confluent wire format as \x hex.
func TestRawRow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		oid  uint32
		want string
	}{
		{`{"op":`, route.OIDText, `{"op":`},
		{"\x00\x00\x00\x00\x01AB", route.OIDBytea, `\x00000000014142`},
		{"\xff\xfe", route.OIDBytea, `\xfffe`},
	} {
		c := rawRow([]byte(tc.in)).Columns[0]
		if c.Name != "value" || c.Type != tc.oid || string(c.Value) != tc.want {
			t.Errorf("rawRow(%q) = %s type %d %q; want type %d %q", tc.in, c.Name, c.Type, c.Value, tc.oid, tc.want)
		}
	}
}

// TestCheckEnv: a typo in one of the router's settings stops it at start
// with the setting it meant, and so does a setting only the connector reads
// (it would seem to apply and be ignored); the shared log, Kafka and DLQ
// settings pass.
func TestCheckEnv(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string // "" for accepted
	}{
		{env: []string{"OUTBOX_KAFKA_BROKERS=b:9092", "OUTBOX_ROUTER_SOURCE_TOPIC=t", "OUTBOX_ROUTER_INPUT_FORMAT=avro"}},
		{env: []string{"OUTBOX_ROUTE_BY_FIELD=type", "OUTBOX_LOG_LEVEL=debug", "OUTBOX_LOG_FORMAT=json", "OUTBOX_DLQ_TOPIC=d"}},
		{env: []string{"OUTBOX_PG_DSN=postgres://x"}, want: "OUTBOX_PG_DSN"},
		{env: []string{"OUTBOX_SLOT=s"}, want: "OUTBOX_SLOT"},
		{env: []string{"OUTBOX_SNAPSHOT=initial"}, want: "OUTBOX_SNAPSHOT"},
		{env: []string{"OUTBOX_KAFKA_SASL_PASSWORD_FILE=/run/secrets/p", "PATH=/bin", "OUTBOX_TEST_KAFKA_BROKERS=x"}},
		{env: []string{"OUTBOX_KAFKA_BROKER=b:9092"}, want: "did you mean OUTBOX_KAFKA_BROKERS?"},
		{env: []string{"OUTBOX_ROUTER_INPUT_FORMT=avro"}, want: "did you mean OUTBOX_ROUTER_INPUT_FORMAT?"},
		{env: []string{"OUTBOX_ROUTE_REGISTRY_PASSWORD_FILE=/run/secrets/registry"}}, // every secret has a _FILE form
	} {
		err := iconfig.CheckUnknownEnv(tc.env, envRule())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckUnknownEnv(%q) = %v; want accepted", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckUnknownEnv(%q) = %v; want an error containing %q", tc.env, err, tc.want)
		}
	}
}
