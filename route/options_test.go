package route

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

func TestParsePropertiesConnect(t *testing.T) {
	const props = `# a Kafka Connect connector
name=outbox-connector
connector.class=io.debezium.connector.postgresql.PostgresConnector
topic.prefix=dbserver1
transforms=unwrap,outbox
transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState
transforms.unwrap.route.by.field=ignored
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id = event_id
transforms.outbox.table.fields.additional.placement=type:header:eventType,\
    version:envelope
transforms.outbox.route.topic.replacement=${routedByValue}.events
transforms.outbox.route.tombstone.on.empty.payload=TRUE
transforms.outbox.table.op.invalid.behavior=Fatal
transforms.outbox.predicate=isOutbox
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
`
	c, err := ParseProperties(strings.NewReader(props))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.FieldEventID = "event_id"
	want.AdditionalFields = []AdditionalField{{"type", PlaceHeader, "eventType"}, {"version", PlaceEnvelope, "version"}}
	want.TopicReplacement = "${routedByValue}.events"
	want.TombstoneOnEmptyPayload = true
	want.InvalidOpBehavior = InvalidOpFatal
	want.ValueFormat = FormatJSON
	want.TopicPrefix = "dbserver1"
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
}

func TestParsePropertiesServer(t *testing.T) {
	const props = `debezium.sink.type=kafka
debezium.source.topic.prefix=tutorial
debezium.format.value=avro
debezium.format.value.schema.registry.url=http://registry:8081
debezium.format.value.basic.auth.user.info=u:p:w
debezium.transforms=outbox
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.transforms.outbox.route.by.field=kind
`
	c, err := ParseProperties(strings.NewReader(props))
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != RuntimeServer || c.HeaderFormat != FormatJSONSchema || c.KeyFormat != FormatJSONSchema ||
		c.ValueFormat != FormatAvro || c.RouteByField != "kind" || c.TopicPrefix != "tutorial" ||
		!reflect.DeepEqual(c.RegistryURLs, []string{"http://registry:8081"}) || c.RegistryUser != "u" || c.RegistryPassword != "p:w" {
		t.Fatalf("%+v", c)
	}
}

func TestParsePropertiesErrors(t *testing.T) {
	for _, props := range []string{
		"transforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.route.by.feild=x", // typo
		"table.op.invalid.behavior=sometimes",
		"table.fields.additional.placement=a:top",
		"table.expand.json.payload=yes",
		"key.converter=io.confluent.connect.avro.AvroConverter",
		"value.converter=com.example.Mine",
	} {
		if _, err := ParseProperties(strings.NewReader(props)); err == nil {
			t.Errorf("%q: no error", props)
		}
	}
}

// TestBindEnv: the routing settings come from a properties file, then the
// environment over it, then flags over both; a secret comes from its
// variable's _FILE form too (issue 15: it had none), and a malformed value
// is named.
func TestBindEnv(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "router.properties")
	if err := os.WriteFile(path, []byte("route.by.field=fromfile\ntable.field.event.key=filekey\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "registry-password")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"OUTBOX_ROUTE_PROPERTIES":                  path,
		"OUTBOX_ROUTE_BY_FIELD":                    "fromenv",
		"OUTBOX_ROUTE_FIELDS_ADDITIONAL_PLACEMENT": "type:header",
		"OUTBOX_ROUTE_TRACING":                     "false",
		"OUTBOX_ROUTE_REGISTRY_PASSWORD_FILE":      secret,
	}
	c := DefaultConfig()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	b := config.NewBinder(fs, func(k string) string { return env[k] })
	c.Bind(b)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"-route-expand-json-payload", "-route-topic-replacement", "t.${routedByValue}"}); err != nil {
		t.Fatal(err)
	}
	if c.RouteByField != "fromenv" || c.FieldEventKey != "filekey" || c.Tracing || !c.ExpandJSONPayload ||
		c.TopicReplacement != "t.${routedByValue}" || len(c.AdditionalFields) != 1 || c.RegistryPassword != "s3cret" {
		t.Fatalf("%+v", c)
	}
	if got := fs.Lookup("route-registry-password").Value.String(); got != "" {
		t.Errorf("the password's flag prints %q as its default; want nothing", got)
	}
	bad := DefaultConfig()
	bb := config.NewBinder(flag.NewFlagSet("y", flag.ContinueOnError), func(k string) string {
		return map[string]string{"OUTBOX_ROUTE_OP_INVALID_BEHAVIOR": "never"}[k]
	})
	bad.Bind(bb)
	if err := bb.Err(); err == nil || !strings.Contains(err.Error(), "OUTBOX_ROUTE_OP_INVALID_BEHAVIOR") {
		t.Fatalf("bad env: %v", err)
	}
}

// TestEnvVarsDocumented keeps docs/router.md's table in step with the code.
func TestEnvVarsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/router.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range options {
		row := "| " + dash(o.debezium) + " | `-" + o.flag + "` | `" + o.env + "` |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/router.md lacks the row %s", row)
		}
	}
	for _, e := range EnvVars() {
		if !strings.HasPrefix(e, "OUTBOX_ROUTE_") {
			t.Errorf("%s is not OUTBOX_ROUTE_*", e)
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return "`" + s + "`"
}

func TestValidateDefaults(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.TopicReplacement = "x.${nope}"
	c.ValueFormat = FormatAvro
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "OUTBOX_ROUTE_TOPIC_REGEX") || !strings.Contains(err.Error(), "OUTBOX_ROUTE_REGISTRY_URL") {
		t.Fatalf("%v", err)
	}
}

// TestParsePropertiesServerEscape: a properties file written for Debezium
// Server escapes the replacement's ${routedByValue} as $${routedByValue}
// (Quarkus would expand it as a configuration expression); it is read as
// Debezium Server reads it. A Kafka Connect file keeps $$ as it is, which
// Java's regex replacement refuses, as Debezium does.
func TestParsePropertiesServerEscape(t *testing.T) {
	const server = "debezium.sink.type=kafka\ndebezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"debezium.transforms.outbox.route.topic.replacement=outbox.$${routedByValue}.events\n"
	c, err := ParseProperties(strings.NewReader(server))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(c)
	if err != nil {
		t.Fatalf("router from a Debezium Server file with $${routedByValue}: %v", err)
	}
	rec, err := r.Route(context.Background(), orderRow(orderPayload))
	if err != nil || rec.Topic != "outbox.Order.events" {
		t.Fatalf("topic %v (%v), want outbox.Order.events", rec, err)
	}
	const connect = "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"transforms.outbox.route.topic.replacement=outbox.$${routedByValue}.events\n"
	c, err = ParseProperties(strings.NewReader(connect))
	if err == nil {
		_, err = New(c)
	}
	if err == nil || !strings.Contains(err.Error(), "illegal group reference") {
		t.Fatalf("Kafka Connect file with $${: %v; want Java's illegal group reference", err)
	}
}

// TestExtendedHeaders: extended.headers.enabled (Kafka Connect's name or
// Debezium Server's) adds Debezium 3's four context headers before the
// others, encoded by the header converter, one run id per router.
func TestExtendedHeaders(t *testing.T) {
	for _, props := range []string{
		"transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\nextended.headers.enabled=true\n",
		"debezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\ndebezium.source.extended.headers.enabled=true\ndebezium.source.topic.prefix=shop\n",
	} {
		cfg, err := ParseProperties(strings.NewReader(props))
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.ExtendedHeaders {
			t.Fatalf("%s: ExtendedHeaders off", props)
		}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var runID string
		for i := 0; i < 2; i++ {
			rec, err := r.Route(context.Background(), orderRow(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Headers) < 5 {
				t.Fatalf("headers %s", fmtHeaders(rec.Headers))
			}
			want := []string{"__debezium.context.connectorLogicalName", "__debezium.context.taskId", "__debezium.context.connectorName", "__debezium.context.runId", "id"}
			for k, key := range want {
				if rec.Headers[k].Key != key {
					t.Fatalf("header %d %q, want %q (%s)", k, rec.Headers[k].Key, key, fmtHeaders(rec.Headers))
				}
			}
			prefix, vals := `"outbox"`, []string{"", "0", "postgresql"}
			if cfg.Runtime == RuntimeServer {
				prefix = `{"schema":{"type":"string","optional":false},"payload":"shop"}`
				if string(rec.Headers[0].Value) != prefix || string(rec.Headers[2].Value) != `{"schema":{"type":"string","optional":false},"payload":"postgresql"}` {
					t.Fatalf("headers %s", fmtHeaders(rec.Headers))
				}
			} else if string(rec.Headers[0].Value) != "outbox" || string(rec.Headers[1].Value) != vals[1] || string(rec.Headers[2].Value) != vals[2] {
				t.Fatalf("headers %s", fmtHeaders(rec.Headers))
			}
			if i == 1 && string(rec.Headers[3].Value) != runID {
				t.Fatalf("run id %s, then %s: one per router", runID, rec.Headers[3].Value)
			}
			runID = string(rec.Headers[3].Value)
		}
		if !strings.Contains(runID, "-") {
			t.Fatalf("run id %q", runID)
		}
	}
	r, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := r.Route(context.Background(), orderRow(`{}`))
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "__debezium") {
			t.Fatalf("a context header by default: %s", fmtHeaders(rec.Headers))
		}
	}
}

// TestParsePropertiesServerExpression: Quarkus expands an unescaped ${…} in
// a Debezium Server file as a configuration expression (Debezium Server
// 3.6.1 refuses to start on ${routedByValue}), so a value the router takes
// that holds one is refused, naming the key and the $${…} to write instead
// (issue 35, item 7b: it was read as a literal ${routedByValue} and routed
// where neither the author nor Debezium meant). A Kafka Connect file has no
// such expressions, and an expression in a key the router does not take is
// Debezium Server's business.
func TestParsePropertiesServerExpression(t *testing.T) {
	t.Setenv("OUTBOX_TEST_TOPIC_PREFIX", "env")
	const server = "debezium.sink.type=kafka\ndebezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	const connect = "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	for _, tc := range []struct {
		name, props string
		wantErr     []string // each in the error; none: no error
		wantTopic   string   // the replacement read, when no error
	}{{
		name:    "server unescaped routedByValue",
		props:   server + "debezium.transforms.outbox.route.topic.replacement=outbox.${routedByValue}\n",
		wantErr: []string{"debezium.transforms.outbox.route.topic.replacement", "${routedByValue}", "$${routedByValue}"},
	}, {
		name:    "server unescaped, closing brace missing",
		props:   server + "debezium.transforms.outbox.route.topic.replacement=outbox.${routedByValue\n",
		wantErr: []string{"debezium.transforms.outbox.route.topic.replacement", "$${routedByValue"},
	}, {
		name:    "server expression in a converter setting",
		props:   server + "debezium.format.value=avro\ndebezium.format.value.schema.registry.url=${REGISTRY_URL}\n",
		wantErr: []string{"debezium.format.value.schema.registry.url", "$${REGISTRY_URL}"},
	}, {
		name:    "server expression in the topic prefix, unresolved",
		props:   server + "debezium.source.topic.prefix=${OUTBOX_TEST_UNSET_PREFIX}\n",
		wantErr: []string{"debezium.source.topic.prefix", "$${OUTBOX_TEST_UNSET_PREFIX}"},
	}, {
		name:    "server expression with a default, unset here: refused (Debezium Server's environment may differ)",
		props:   server + "debezium.transforms.outbox.route.topic.replacement=${OUTBOX_TEST_UNSET_PREFIX:shop}.$${routedByValue}\n",
		wantErr: []string{"debezium.transforms.outbox.route.topic.replacement", "$${OUTBOX_TEST_UNSET_PREFIX:shop}"},
	}, {
		name:    "server nested expression: refused",
		props:   server + "debezium.transforms.outbox.route.topic.replacement=${OUTBOX_TEST_TOPIC_PREFIX:${OTHER}}.$${routedByValue}\n",
		wantErr: []string{"debezium.transforms.outbox.route.topic.replacement"},
	}, {
		name:      "server expression resolved by the environment",
		props:     server + "debezium.transforms.outbox.route.topic.replacement=${OUTBOX_TEST_TOPIC_PREFIX}.$${routedByValue}\n",
		wantTopic: "env.${routedByValue}",
	}, {
		name:      "server expression resolved by the environment, as SmallRye maps a dotted name",
		props:     server + "debezium.transforms.outbox.route.topic.replacement=${outbox.test.topic.prefix}.$${routedByValue}\n",
		wantTopic: "env.${routedByValue}",
	}, {
		name:    "server expression naming another key of the file: refused",
		props:   server + "prefix.of.topics=file\ndebezium.transforms.outbox.route.topic.replacement=${prefix.of.topics}.$${routedByValue}\n",
		wantErr: []string{"debezium.transforms.outbox.route.topic.replacement", "$${prefix.of.topics}"},
	}, {
		name:      "server last value of a key given twice wins",
		props:     server + "debezium.transforms.outbox.route.topic.replacement=outbox.${routedByValue}\ndebezium.transforms.outbox.route.topic.replacement=outbox.$${routedByValue}\n",
		wantTopic: "outbox.${routedByValue}",
	}, {
		name:      "server escaped",
		props:     server + "debezium.transforms.outbox.route.topic.replacement=outbox.$${routedByValue}\n",
		wantTopic: "outbox.${routedByValue}",
	}, {
		name:      "server escaped with a backslash",
		props:     server + `debezium.transforms.outbox.route.topic.replacement=outbox.\\${routedByValue}` + "\n",
		wantTopic: "outbox.${routedByValue}",
	}, {
		name:      "server expression in a key the router does not take",
		props:     server + "debezium.source.database.password=${PGPASSWORD}\ndebezium.transforms.outbox.route.topic.replacement=outbox.$${routedByValue}\n",
		wantTopic: "outbox.${routedByValue}",
	}, {
		name:      "connect unescaped is literal",
		props:     connect + "transforms.outbox.route.topic.replacement=outbox.${routedByValue}\n",
		wantTopic: "outbox.${routedByValue}",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseProperties(strings.NewReader(tc.props))
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				if c.TopicReplacement != tc.wantTopic {
					t.Fatalf("replacement %q, want %q", c.TopicReplacement, tc.wantTopic)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error (replacement %q, registry %q, prefix %q); want one naming %q", c.TopicReplacement, c.RegistryURLs, c.TopicPrefix, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
