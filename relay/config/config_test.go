package config

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func parse(t *testing.T, env map[string]string, args ...string) (Config, *flag.FlagSet) {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("connector", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	b := c.Bind(fs, func(k string) string { return env[k] })
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	return c, fs
}

// TestHTTPAddr: the endpoint listens on loopback by default; off turns it
// off; an empty variable means the default, like every setting's.
func TestHTTPAddr(t *testing.T) {
	base := map[string]string{"OUTBOX_PG_DSN": "postgres://u@h/db", "OUTBOX_KAFKA_BROKERS": "k:9092"}
	for _, tc := range []struct {
		name    string
		env     string // OUTBOX_HTTP_ADDR; "-" leaves it unset
		args    []string
		addr    string
		enabled bool
		err     string
	}{
		{"default", "-", nil, "127.0.0.1:9189", true, ""},
		{"empty variable", "", nil, "127.0.0.1:9189", true, ""},
		{"off", "off", nil, "off", false, ""},
		{"empty flag", "-", []string{"-http-addr="}, "", false, ""},
		{"all interfaces", "0.0.0.0:9189", nil, "0.0.0.0:9189", true, ""},
		{"not host:port", "9189", nil, "9189", true, `OUTBOX_HTTP_ADDR: "9189" is not host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			if tc.env != "-" {
				env["OUTBOX_HTTP_ADDR"] = tc.env
			}
			c, _ := parse(t, env, tc.args...)
			if c.HTTPAddr != tc.addr || c.HTTPEnabled() != tc.enabled {
				t.Errorf("HTTPAddr %q enabled %v; want %q %v", c.HTTPAddr, c.HTTPEnabled(), tc.addr, tc.enabled)
			}
			err := c.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Validate: %v; want %q", err, tc.err)
			}
		})
	}
}

// TestHelpHidesDSN: -help does not print the DSN (and its password) as the
// flag's default.
func TestHelpHidesDSN(t *testing.T) {
	_, fs := parse(t, map[string]string{"OUTBOX_PG_DSN": "postgres://u:hunter2@h/db"})
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.PrintDefaults()
	if strings.Contains(out.String(), "hunter2") || !strings.Contains(out.String(), "-pg-dsn") {
		t.Errorf("-help output shows the password or lacks -pg-dsn:\n%s", out.String())
	}
}
