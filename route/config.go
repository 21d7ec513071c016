package route

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Placement is where an additional column goes (table.fields.additional.placement).
type Placement string

// The placements Debezium knows.
const (
	PlaceHeader    Placement = "header"
	PlaceEnvelope  Placement = "envelope"
	PlacePartition Placement = "partition"
)

// AdditionalField is one entry of table.fields.additional.placement:
// "column:placement[:alias]".
type AdditionalField struct {
	Column    string
	Placement Placement
	// Alias names the header or envelope field; it defaults to Column and
	// means nothing for PlacePartition.
	Alias string
}

// Format is how keys, values or headers are serialized: which Kafka Connect
// converter the router reproduces.
type Format string

// The formats.
const (
	// FormatString is StringConverter (text as is) for text and
	// BinaryDataConverter (bytes as is) for bytea; for headers it is Kafka
	// Connect's default SimpleHeaderConverter.
	FormatString Format = "string"
	// FormatJSON is JsonConverter with schemas.enable=false.
	FormatJSON Format = "json"
	// FormatJSONSchema is JsonConverter with schemas.enable=true (its
	// default, and Debezium Server's default header format).
	FormatJSONSchema Format = "json-schema"
	// FormatAvro (values only) is Avro in the Confluent wire format against
	// a schema registry.
	FormatAvro Format = "avro"
)

// Runtime is the Debezium runtime whose record-level behaviour to reproduce.
type Runtime string

// The runtimes.
const (
	// RuntimeConnect is Debezium on Kafka Connect: the record keeps the
	// router's timestamp and partition.
	RuntimeConnect Runtime = "connect"
	// RuntimeServer is Debezium Server's Kafka sink, which sends every
	// record with no partition and no timestamp (the producer picks both),
	// and drops null-valued headers.
	RuntimeServer Runtime = "server"
)

// MissingBehavior is table.field.additional.missing.
type MissingBehavior string

// The values of table.field.additional.missing.
const (
	MissingError  MissingBehavior = "error"
	MissingIgnore MissingBehavior = "ignore"
)

// InvalidOpBehavior is table.op.invalid.behavior: what an update does.
type InvalidOpBehavior string

// The values of table.op.invalid.behavior.
const (
	InvalidOpWarn  InvalidOpBehavior = "warn"
	InvalidOpError InvalidOpBehavior = "error"
	InvalidOpFatal InvalidOpBehavior = "fatal"
)

// NullBehavior is table.json.payload.null.behavior.
type NullBehavior string

// The values of table.json.payload.null.behavior.
const (
	NullIgnore        NullBehavior = "ignore"
	NullOptionalBytes NullBehavior = "optional_bytes"
)

// EmptyArrayBehavior is table.json.payload.empty.array.behavior.
type EmptyArrayBehavior string

// The values of table.json.payload.empty.array.behavior.
const (
	EmptyArrayIgnore         EmptyArrayBehavior = "ignore"
	EmptyArrayOptionalString EmptyArrayBehavior = "optional_string"
)

// Config holds the router's options. Zero values are not defaults: start
// from DefaultConfig, which is Debezium's EventRouter with its defaults and
// StringConverter for keys and values. Each field names the Debezium option
// it reproduces; docs/router.md maps them to flags and environment variables.
type Config struct {
	// FieldEventID is table.field.event.id (default "id"): the column whose
	// value becomes the header "id".
	FieldEventID string
	// FieldEventKey is table.field.event.key (default "aggregateid"): the
	// column whose value becomes the record key. Empty means a null key.
	FieldEventKey string
	// FieldEventType is table.field.event.type (default "type"). Debezium
	// accepts it and does not use it; so do we.
	FieldEventType string
	// FieldPayload is table.field.event.payload (default "payload").
	FieldPayload string
	// FieldEventTimestamp is table.field.event.timestamp (default none: the
	// record timestamp is when the row was processed). The column must be a
	// timestamp (Debezium's MicroTimestamp); timestamptz is accepted too,
	// which Debezium rejects.
	FieldEventTimestamp string
	// FieldSchemaVersion is table.field.event.schema.version (default
	// none): an int4 column whose value is the envelope schema's version.
	FieldSchemaVersion string
	// AdditionalFields is table.fields.additional.placement (default none).
	AdditionalFields []AdditionalField
	// AdditionalMissing is table.field.additional.missing (default "error").
	AdditionalMissing MissingBehavior
	// ExpandJSONPayload is table.expand.json.payload (default false).
	ExpandJSONPayload bool
	// JSONNullBehavior is table.json.payload.null.behavior (default "ignore").
	JSONNullBehavior NullBehavior
	// JSONEmptyArrayBehavior is table.json.payload.empty.array.behavior
	// (default "ignore").
	JSONEmptyArrayBehavior EmptyArrayBehavior
	// RouteByField is route.by.field (default "aggregatetype").
	RouteByField string
	// TopicRegex is route.topic.regex (default "(?<routedByValue>.*)"), a
	// Java regular expression; the subset RE2 supports is accepted.
	TopicRegex string
	// TopicReplacement is route.topic.replacement (default
	// "outbox.event.${routedByValue}"), in java.util.regex.Matcher syntax.
	TopicReplacement string
	// TombstoneOnEmptyPayload is route.tombstone.on.empty.payload (default
	// false).
	TombstoneOnEmptyPayload bool
	// InvalidOpBehavior is table.op.invalid.behavior (default "warn").
	InvalidOpBehavior InvalidOpBehavior
	// TracingSpanContextField is tracing.span.context.field (default
	// "tracingspancontext"): a column holding a java.util.Properties text
	// with the application's W3C trace context.
	TracingSpanContextField string
	// Tracing turns the span context column into traceparent/tracestate
	// headers (default true). Debezium does this only with OpenTelemetry on
	// its class path, and then with a span of its own (see docs/router.md).
	Tracing bool

	// KeyFormat is the key converter (default FormatString).
	KeyFormat Format
	// ValueFormat is the value converter (default FormatString).
	ValueFormat Format
	// HeaderFormat is the header converter (default FormatString, Kafka
	// Connect's SimpleHeaderConverter; Debezium Server's default is
	// FormatJSONSchema).
	HeaderFormat Format
	// Runtime is the Debezium runtime to reproduce (default RuntimeConnect).
	Runtime Runtime
	// ExtendedHeaders adds the four context headers Debezium 3 puts on
	// every record (extended.headers.enabled, Debezium's default true; ours
	// false): __debezium.context.connectorLogicalName (TopicPrefix),
	// .taskId ("0"), .connectorName ("postgresql") and .runId (a UUID per
	// router, as Debezium's is per task start), before the others.
	ExtendedHeaders bool
	// TopicPrefix is Debezium's topic.prefix (default "outbox"); it names the
	// envelope schema ("<prefix>.<schema>.<table>.<routedByValue>.Value").
	TopicPrefix string
	// RequiredColumns are the NOT NULL columns (default id, aggregatetype,
	// aggregateid, type: Debezium's basic outbox table). pgoutput does not
	// say which columns are nullable, and the JSON-with-schema encoding
	// prints "optional" for each field.
	RequiredColumns []string

	// RegistryURLs are the Confluent-API schema registry's URLs (Debezium:
	// value.converter.schema.registry.url); needed for FormatAvro.
	RegistryURLs []string
	// RegistryUser and RegistryPassword are the registry's basic auth
	// (value.converter.basic.auth.user.info).
	RegistryUser     string
	RegistryPassword string
	// AvroSubject is the subject a topic's value schema lives under:
	// "${topic}" is replaced by the topic, "${record}" by the full name of
	// the value's schema (default "${topic}-value", Confluent's
	// TopicNameStrategy; "${record}" is its RecordNameStrategy and
	// "${topic}-${record}" its TopicRecordNameStrategy, which
	// value.converter.value.subject.name.strategy selects).
	AvroSubject string
	// AvroAutoRegister registers the schema derived from each value, as
	// Confluent's AvroConverter derives it from the Connect schema
	// (value.converter.auto.register.schemas, default true); false looks the
	// derived schema up under its subject and waits, retrying, while it is
	// not registered.
	AvroAutoRegister bool
	// AvroUseLatestVersion writes every value with the latest version of its
	// subject instead of the derived schema (value.converter.use.latest.version,
	// default false).
	AvroUseLatestVersion bool
	// AvroLatestCompatibilityStrict, with AvroUseLatestVersion, asks the
	// registry whether the derived schema is compatible with that latest
	// version before using it (value.converter.latest.compatibility.strict,
	// default true).
	AvroLatestCompatibilityStrict bool
	// AvroMaxSchemasPerSubject bounds the schemas derived and cached per
	// subject (value.converter.max.schemas.per.subject, default 1000): past
	// it the subject's cache is emptied and fills again, so that memory
	// stays bounded when an expanded payload's shape varies without end
	// (Confluent's client fails the record there instead).
	AvroMaxSchemasPerSubject int
	// AvroSchemaDir holds <subject>.avsc files registered at New.
	AvroSchemaDir string
	// AvroSchemas maps subjects to Avro schemas registered at New.
	AvroSchemas map[string]string
}

// DefaultConfig is Debezium's EventRouter with its defaults, with
// StringConverter as key and value converter on Kafka Connect.
func DefaultConfig() Config {
	return Config{
		FieldEventID:                  "id",
		FieldEventKey:                 "aggregateid",
		FieldEventType:                "type",
		FieldPayload:                  "payload",
		AdditionalMissing:             MissingError,
		JSONNullBehavior:              NullIgnore,
		JSONEmptyArrayBehavior:        EmptyArrayIgnore,
		RouteByField:                  "aggregatetype",
		TopicRegex:                    "(?<routedByValue>.*)",
		TopicReplacement:              "outbox.event.${routedByValue}",
		InvalidOpBehavior:             InvalidOpWarn,
		TracingSpanContextField:       "tracingspancontext",
		Tracing:                       true,
		KeyFormat:                     FormatString,
		ValueFormat:                   FormatString,
		HeaderFormat:                  FormatString,
		Runtime:                       RuntimeConnect,
		TopicPrefix:                   "outbox",
		RequiredColumns:               []string{"id", "aggregatetype", "aggregateid", "type"},
		AvroSubject:                   "${topic}-value",
		AvroAutoRegister:              true,
		AvroLatestCompatibilityStrict: true,
		AvroMaxSchemasPerSubject:      1000,
	}
}

// ParseAdditionalFields parses table.fields.additional.placement as
// Debezium does: comma-separated "column:placement[:alias]", each part
// trimmed, placement case-insensitive.
func ParseAdditionalFields(s string) ([]AdditionalField, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []AdditionalField
	for _, entry := range strings.Split(s, ",") {
		parts := strings.Split(entry, ":")
		// Java's String.split drops trailing empty strings.
		for len(parts) > 0 && parts[len(parts)-1] == "" {
			parts = parts[:len(parts)-1]
		}
		if len(parts) != 2 && len(parts) != 3 {
			return nil, fmt.Errorf("%q: want column:placement or column:placement:alias", entry)
		}
		f := AdditionalField{Column: strings.TrimSpace(parts[0])}
		switch p := Placement(strings.ToLower(strings.TrimSpace(parts[1]))); p {
		case PlaceHeader, PlaceEnvelope, PlacePartition:
			f.Placement = p
		default:
			return nil, fmt.Errorf("%q: placement %q is not header, envelope or partition", entry, parts[1])
		}
		f.Alias = f.Column
		if len(parts) == 3 {
			f.Alias = strings.TrimSpace(parts[2])
		}
		if f.Column == "" {
			return nil, fmt.Errorf("%q: empty column name", entry)
		}
		out = append(out, f)
	}
	return out, nil
}

// FormatAdditionalFields is the inverse of ParseAdditionalFields.
func FormatAdditionalFields(fs []AdditionalField) string {
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(f.Column)
		b.WriteByte(':')
		b.WriteString(string(f.Placement))
		if f.Alias != "" && f.Alias != f.Column {
			b.WriteByte(':')
			b.WriteString(f.Alias)
		}
	}
	return b.String()
}

// Validate reports every setting that cannot work, naming the environment
// variable and the Debezium option of each.
func (c *Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		o := optionByField(name)
		errs = append(errs, fmt.Errorf("%s (%s): %s", o.env, o.debezium, fmt.Sprintf(format, args...)))
	}
	for _, n := range []struct{ field, v string }{
		{"FieldEventID", c.FieldEventID}, {"FieldPayload", c.FieldPayload}, {"RouteByField", c.RouteByField},
	} {
		if n.v == "" {
			bad(n.field, "missing; set it to a column of the outbox table")
		}
	}
	if c.AdditionalMissing != MissingError && c.AdditionalMissing != MissingIgnore {
		bad("AdditionalMissing", "%q is not error or ignore", c.AdditionalMissing)
	}
	if c.JSONNullBehavior != NullIgnore && c.JSONNullBehavior != NullOptionalBytes {
		bad("JSONNullBehavior", "%q is not ignore or optional_bytes", c.JSONNullBehavior)
	}
	if c.JSONEmptyArrayBehavior != EmptyArrayIgnore && c.JSONEmptyArrayBehavior != EmptyArrayOptionalString {
		bad("JSONEmptyArrayBehavior", "%q is not ignore or optional_string", c.JSONEmptyArrayBehavior)
	}
	switch c.InvalidOpBehavior {
	case InvalidOpWarn, InvalidOpError, InvalidOpFatal:
	default:
		bad("InvalidOpBehavior", "%q is not warn, error or fatal", c.InvalidOpBehavior)
	}
	for _, f := range c.AdditionalFields {
		switch {
		case f.Column == "":
			bad("AdditionalFields", "an entry has no column")
		case f.Placement != PlaceHeader && f.Placement != PlaceEnvelope && f.Placement != PlacePartition:
			bad("AdditionalFields", "%s: placement %q is not header, envelope or partition", f.Column, f.Placement)
		case f.Placement != PlacePartition && f.Alias == "":
			bad("AdditionalFields", "%s: empty alias", f.Column)
		case f.Placement == PlaceEnvelope && f.Alias == "payload":
			// Debezium's SchemaBuilder refuses a second field named payload.
			bad("AdditionalFields", "%s: alias %q clashes with the envelope's payload field", f.Column, f.Alias)
		}
	}
	if _, err := compileTopicRule(c.TopicRegex, c.TopicReplacement); err != nil {
		bad("TopicRegex", "%v", err)
	}
	for _, f := range []struct {
		field string
		v     Format
		avro  bool
	}{{"KeyFormat", c.KeyFormat, false}, {"ValueFormat", c.ValueFormat, true}, {"HeaderFormat", c.HeaderFormat, false}} {
		switch f.v {
		case FormatString, FormatJSON, FormatJSONSchema:
		case FormatAvro:
			if !f.avro {
				bad(f.field, "avro is supported for values only")
			}
		default:
			bad(f.field, "%q is not string, json, json-schema or avro", f.v)
		}
	}
	if c.Runtime != RuntimeConnect && c.Runtime != RuntimeServer {
		bad("Runtime", "%q is not connect or server", c.Runtime)
	}
	if c.ValueFormat == FormatAvro {
		if len(c.RegistryURLs) == 0 {
			bad("RegistryURLs", "missing; value format avro needs a schema registry, set it to http://host:8081")
		}
		if c.AvroMaxSchemasPerSubject < 1 {
			bad("AvroMaxSchemasPerSubject", "%d; it must be at least 1 (Confluent's default is 1000)", c.AvroMaxSchemasPerSubject)
		}
		if !strings.Contains(c.AvroSubject, "${topic}") && !strings.Contains(c.AvroSubject, "${record}") {
			bad("AvroSubject", "%q contains neither ${topic} nor ${record}", c.AvroSubject)
		}
		if c.AvroSchemaDir != "" {
			if st, err := os.Stat(c.AvroSchemaDir); err != nil || !st.IsDir() {
				bad("AvroSchemaDir", "%q is not a readable directory", c.AvroSchemaDir)
			}
		}
	}
	return errors.Join(errs...)
}

// avroSchemaFiles reads AvroSchemaDir: every <subject>.avsc file.
func (c *Config) avroSchemaFiles() (map[string]string, error) {
	out := make(map[string]string, len(c.AvroSchemas))
	for k, v := range c.AvroSchemas {
		out[k] = v
	}
	if c.AvroSchemaDir == "" {
		return out, nil
	}
	paths, err := filepath.Glob(filepath.Join(c.AvroSchemaDir, "*.avsc"))
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read Avro schema: %w", err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".avsc")] = string(b)
	}
	return out, nil
}
