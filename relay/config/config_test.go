package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// TestRedact: the connection string and its password leave the text, and
// the error's type stays for errors.As (fatal.Is reads the SQLSTATE).
func TestRedact(t *testing.T) {
	dsn := "postgres://u:hunter2@db/app"
	pe := &pgconn.PgError{Code: "28P01", Message: "password authentication failed for " + dsn}
	err := fmt.Errorf("OUTBOX_PG_DSN: %w", Redact(fmt.Errorf("connect: %w", pe), dsn))
	if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "postgres://u:xxxxx@db/app") {
		t.Errorf("text not masked: %s", err)
	}
	var got *pgconn.PgError
	if !errors.As(err, &got) || got.Code != "28P01" {
		t.Errorf("errors.As lost the PostgreSQL error: %v", got)
	}
	if Redact(nil, dsn) != nil {
		t.Error("Redact(nil) is not nil")
	}
}

// TestParsedOnce: the outbox table and the topic configs are parsed when
// the setting is read, so that the relay uses them as they are and a
// malformed one is refused with its variable's name, from the environment
// or from a flag.
func TestParsedOnce(t *testing.T) {
	c, _ := parse(t, nil)
	if c.Table != (Table{"public", "outbox"}) || c.Table.String() != "public.outbox" || len(c.TopicConfigs) != 0 {
		t.Errorf("defaults: table %#v, topic configs %v", c.Table, c.TopicConfigs)
	}
	c, _ = parse(t, map[string]string{"OUTBOX_TABLE": "Sales.OutBox", "OUTBOX_TOPIC_CONFIGS": "retention.ms=60000, cleanup.policy=delete"})
	if c.Table != (Table{"Sales", "OutBox"}) {
		t.Errorf("table %#v", c.Table)
	}
	if got := c.TopicConfigs.String(); got != "cleanup.policy=delete,retention.ms=60000" {
		t.Errorf("topic configs %q", got)
	}
	c, _ = parse(t, nil, "-table", "orders", "-topic-configs", "")
	if c.Table != (Table{"public", "orders"}) || len(c.TopicConfigs) != 0 {
		t.Errorf("flags: table %#v, topic configs %v", c.Table, c.TopicConfigs)
	}
	for _, bad := range []map[string]string{{"OUTBOX_TABLE": "a.b.c"}, {"OUTBOX_TABLE": "bad-name"}, {"OUTBOX_TOPIC_CONFIGS": "a=1,b"}} {
		var c Config
		fs := flag.NewFlagSet("connector", flag.ContinueOnError)
		b := c.Bind(fs, func(k string) string { return bad[k] })
		err := b.Err()
		for k := range bad {
			if err == nil || !strings.Contains(err.Error(), k+": ") {
				t.Errorf("%v: want an error naming %s, got %v", bad, k, err)
			}
		}
	}
	var c2 Config
	fs := flag.NewFlagSet("connector", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	c2.Bind(fs, func(string) string { return "" })
	if err := fs.Parse([]string{"-table", "x.y.z"}); err == nil {
		t.Error("a malformed -table was taken")
	}
}

// TestTableLogged: the table is logged as schema.table in either format,
// and a table built in code is validated as one read from a setting.
func TestTableLogged(t *testing.T) {
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("starting", "table", Table{"Sales", "OutBox"})
	if !strings.Contains(buf.String(), `"table":"Sales.OutBox"`) {
		t.Errorf("JSON log: %s", buf.String())
	}
	c, _ := parse(t, nil)
	c.PGDSN = "postgres://u@db/app"
	c.Kafka.Brokers = "k:9092"
	c.Table = Table{Schema: "", Name: "outbox"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "OUTBOX_TABLE") {
		t.Errorf("Validate of a table without schema: %v", err)
	}
}

// TestStreamSilenceTimeout: 0 (the default) derives the timeout from the
// replication connection's wal_sender_timeout; a setting must be at least
// 1s and leave room for three status updates, since it caps that
// wal_sender_timeout.
func TestStreamSilenceTimeout(t *testing.T) {
	base := map[string]string{"OUTBOX_PG_DSN": "postgres://u@h/db", "OUTBOX_KAFKA_BROKERS": "k:9092"}
	for _, tc := range []struct {
		name, env, status string // "" leaves a variable unset
		want              time.Duration
		err               string
	}{
		{"default", "", "", 0, ""},
		{"set", "3s", "", 3 * time.Second, ""},
		{"set, status updates more often", "2s", "500ms", 2 * time.Second, ""},
		{"too short", "500ms", "", 500 * time.Millisecond, "OUTBOX_STREAM_SILENCE_TIMEOUT: 500ms; use 0"},
		{"status updates too rare", "2s", "1s", 2 * time.Second, "OUTBOX_STATUS_INTERVAL: 1s is over a third of OUTBOX_STREAM_SILENCE_TIMEOUT (2s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := maps.Clone(base)
			if tc.env != "" {
				env["OUTBOX_STREAM_SILENCE_TIMEOUT"] = tc.env
			}
			if tc.status != "" {
				env["OUTBOX_STATUS_INTERVAL"] = tc.status
			}
			c, _ := parse(t, env)
			if c.StreamSilenceTimeout != tc.want {
				t.Errorf("StreamSilenceTimeout %s; want %s", c.StreamSilenceTimeout, tc.want)
			}
			err := c.Validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Validate: %v; want %q", err, tc.err)
			}
		})
	}
}
