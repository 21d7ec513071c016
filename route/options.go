package route

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/route/properties"
)

// option is one setting: its Debezium name, our flag and environment
// variable, and how to read and write it. One table drives the flags, the
// environment, the properties file and docs/router.md.
type option struct {
	field    string // Config field
	debezium string // Debezium's name, or "" when Debezium has none
	flag     string
	env      string
	usage    string
	boolean  bool
	secret   bool
	get      func(*Config) string
	set      func(*Config, string) error
}

func str(p func(*Config) *string) (func(*Config) string, func(*Config, string) error) {
	return func(c *Config) string { return *p(c) },
		func(c *Config, v string) error { *p(c) = strings.TrimSpace(v); return nil }
}

func integer(p func(*Config) *int) (func(*Config) string, func(*Config, string) error) {
	return func(c *Config) string { return strconv.Itoa(*p(c)) },
		func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			*p(c) = n
			return nil
		}
}

func boolean(p func(*Config) *bool) (func(*Config) string, func(*Config, string) error) {
	return func(c *Config) string { return strconv.FormatBool(*p(c)) },
		func(c *Config, v string) error {
			switch strings.ToLower(strings.TrimSpace(v)) {
			case "true", "1", "t":
				*p(c) = true
			case "false", "0", "f":
				*p(c) = false
			default:
				return fmt.Errorf("%q is not true or false", v)
			}
			return nil
		}
}

func enum[T ~string](p func(*Config) *T, values ...T) (func(*Config) string, func(*Config, string) error) {
	return func(c *Config) string { return string(*p(c)) },
		func(c *Config, v string) error {
			v = strings.ToLower(strings.TrimSpace(v))
			for _, ok := range values {
				if string(ok) == v {
					*p(c) = ok
					return nil
				}
			}
			return fmt.Errorf("%q is not one of %v", v, values)
		}
}

func list(p func(*Config) *[]string) (func(*Config) string, func(*Config, string) error) {
	return func(c *Config) string { return strings.Join(*p(c), ",") },
		func(c *Config, v string) error {
			var out []string
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, s)
				}
			}
			*p(c) = out
			return nil
		}
}

func opt(field, debezium, flagName, usage string, get func(*Config) string, set func(*Config, string) error) option {
	return option{field: field, debezium: debezium, flag: flagName,
		env: "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_")), usage: usage, get: get, set: set}
}

var options = func() []option {
	o := []option{}
	add := func(x option) { o = append(o, x) }
	g, s := str(func(c *Config) *string { return &c.FieldEventID })
	add(opt("FieldEventID", "table.field.event.id", "route-field-event-id", "column holding the event id, sent as header id", g, s))
	g, s = str(func(c *Config) *string { return &c.FieldEventKey })
	add(opt("FieldEventKey", "table.field.event.key", "route-field-event-key", "column holding the record key (empty: no key)", g, s))
	g, s = str(func(c *Config) *string { return &c.FieldEventType })
	add(opt("FieldEventType", "table.field.event.type", "route-field-event-type", "column holding the event type (accepted and unused, as in Debezium)", g, s))
	g, s = str(func(c *Config) *string { return &c.FieldPayload })
	add(opt("FieldPayload", "table.field.event.payload", "route-field-event-payload", "column holding the payload", g, s))
	g, s = str(func(c *Config) *string { return &c.FieldEventTimestamp })
	add(opt("FieldEventTimestamp", "table.field.event.timestamp", "route-field-event-timestamp", "timestamp column for the record timestamp (empty: processing time)", g, s))
	g, s = str(func(c *Config) *string { return &c.FieldSchemaVersion })
	add(opt("FieldSchemaVersion", "table.field.event.schema.version", "route-field-event-schema-version", "int4 column holding the envelope schema version", g, s))
	add(opt("AdditionalFields", "table.fields.additional.placement", "route-fields-additional-placement",
		"extra columns as column:header|envelope|partition[:alias], comma-separated",
		func(c *Config) string { return FormatAdditionalFields(c.AdditionalFields) },
		func(c *Config, v string) error {
			f, err := ParseAdditionalFields(v)
			if err == nil {
				c.AdditionalFields = f
			}
			return err
		}))
	g, s = enum(func(c *Config) *MissingBehavior { return &c.AdditionalMissing }, MissingError, MissingIgnore)
	add(opt("AdditionalMissing", "table.field.additional.missing", "route-field-additional-missing", "an additional column missing from the row: error or ignore", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.ExpandJSONPayload })
	add(opt("ExpandJSONPayload", "table.expand.json.payload", "route-expand-json-payload", "expand a JSON string payload into JSON structure", g, s))
	g, s = enum(func(c *Config) *NullBehavior { return &c.JSONNullBehavior }, NullIgnore, NullOptionalBytes)
	add(opt("JSONNullBehavior", "table.json.payload.null.behavior", "route-json-payload-null-behavior", "expanded JSON nulls: ignore (drop the field) or optional_bytes (keep null)", g, s))
	g, s = enum(func(c *Config) *EmptyArrayBehavior { return &c.JSONEmptyArrayBehavior }, EmptyArrayIgnore, EmptyArrayOptionalString)
	add(opt("JSONEmptyArrayBehavior", "table.json.payload.empty.array.behavior", "route-json-payload-empty-array-behavior", "expanded empty JSON arrays: ignore (drop) or optional_string (keep)", g, s))
	g, s = str(func(c *Config) *string { return &c.RouteByField })
	add(opt("RouteByField", "route.by.field", "route-by-field", "column whose value names the topic", g, s))
	g, s = str(func(c *Config) *string { return &c.TopicRegex })
	add(opt("TopicRegex", "route.topic.regex", "route-topic-regex", "Java regex over the route.by.field value", g, s))
	g, s = str(func(c *Config) *string { return &c.TopicReplacement })
	add(opt("TopicReplacement", "route.topic.replacement", "route-topic-replacement", "topic name, with ${routedByValue} and other regex groups", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.TombstoneOnEmptyPayload })
	add(opt("TombstoneOnEmptyPayload", "route.tombstone.on.empty.payload", "route-tombstone-on-empty-payload", "a null or blank payload becomes a tombstone (null value)", g, s))
	g, s = enum(func(c *Config) *InvalidOpBehavior { return &c.InvalidOpBehavior }, InvalidOpWarn, InvalidOpError, InvalidOpFatal)
	add(opt("InvalidOpBehavior", "table.op.invalid.behavior", "route-op-invalid-behavior", "an update of an outbox row: warn, error (skip and log) or fatal (stop)", g, s))
	g, s = str(func(c *Config) *string { return &c.TracingSpanContextField })
	add(opt("TracingSpanContextField", "tracing.span.context.field", "route-tracing-span-context-field", "column holding the serialized trace context", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.Tracing })
	add(opt("Tracing", "", "route-tracing", "send the span context column's trace context as traceparent/tracestate headers", g, s))
	g, s = enum(func(c *Config) *Format { return &c.KeyFormat }, FormatString, FormatJSON, FormatJSONSchema)
	add(opt("KeyFormat", "key.converter", "route-key-format", "key encoding: string, json or json-schema", g, s))
	g, s = enum(func(c *Config) *Format { return &c.ValueFormat }, FormatString, FormatJSON, FormatJSONSchema, FormatAvro)
	add(opt("ValueFormat", "value.converter", "route-value-format", "value encoding: string, json, json-schema or avro", g, s))
	g, s = enum(func(c *Config) *Format { return &c.HeaderFormat }, FormatString, FormatJSON, FormatJSONSchema)
	add(opt("HeaderFormat", "header.converter", "route-header-format", "header encoding: string (Kafka Connect), json or json-schema (Debezium Server's default)", g, s))
	g, s = enum(func(c *Config) *Runtime { return &c.Runtime }, RuntimeConnect, RuntimeServer)
	add(opt("Runtime", "", "route-runtime", "Debezium runtime to reproduce: connect or server (no partition, no timestamp)", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.ExtendedHeaders })
	add(opt("ExtendedHeaders", "extended.headers.enabled", "route-extended-headers", "add Debezium 3's four __debezium.context.* headers (connector name, task, run id) to every record", g, s))
	g, s = str(func(c *Config) *string { return &c.TopicPrefix })
	add(opt("TopicPrefix", "topic.prefix", "route-topic-prefix", "Debezium's topic.prefix, used in envelope schema names", g, s))
	g, s = list(func(c *Config) *[]string { return &c.RequiredColumns })
	add(opt("RequiredColumns", "", "route-required-columns", "NOT NULL columns, comma-separated (schemas print them as required)", g, s))
	g, s = list(func(c *Config) *[]string { return &c.RegistryURLs })
	add(opt("RegistryURLs", "value.converter.schema.registry.url", "route-registry-url", "schema registry URLs (Confluent API), comma-separated", g, s))
	g, s = str(func(c *Config) *string { return &c.RegistryUser })
	add(opt("RegistryUser", "value.converter.basic.auth.user.info", "route-registry-user", "schema registry basic-auth user", g, s))
	g, s = str(func(c *Config) *string { return &c.RegistryPassword })
	pw := opt("RegistryPassword", "value.converter.basic.auth.user.info", "route-registry-password", "schema registry basic-auth password", g, s)
	pw.secret = true
	add(pw)
	g, s = str(func(c *Config) *string { return &c.AvroSubject })
	add(opt("AvroSubject", "value.converter.value.subject.name.strategy", "route-avro-subject", "subject of a value's schema; ${topic} is the topic, ${record} the schema's full name", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.AvroAutoRegister })
	add(opt("AvroAutoRegister", "value.converter.auto.register.schemas", "route-avro-auto-register", "register the Avro schema derived from each value as Confluent's AvroConverter does (false: look it up, waiting while it is missing)", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.AvroUseLatestVersion })
	add(opt("AvroUseLatestVersion", "value.converter.use.latest.version", "route-avro-use-latest-version", "write values with the latest version of their subject instead of the derived schema", g, s))
	g, s = boolean(func(c *Config) *bool { return &c.AvroLatestCompatibilityStrict })
	add(opt("AvroLatestCompatibilityStrict", "value.converter.latest.compatibility.strict", "route-avro-latest-compatibility-strict", "with use.latest.version, use the latest version only if the registry finds the derived schema compatible with it", g, s))
	g, s = integer(func(c *Config) *int { return &c.AvroMaxSchemasPerSubject })
	add(opt("AvroMaxSchemasPerSubject", "value.converter.max.schemas.per.subject", "route-avro-max-schemas-per-subject", "most schemas derived and cached per subject; past it the subject's cache is emptied and fills again", g, s))
	g, s = str(func(c *Config) *string { return &c.AvroSchemaDir })
	add(opt("AvroSchemaDir", "", "route-avro-schema-dir", "directory of <subject>.avsc files registered at start", g, s))
	for i := range o {
		o[i].boolean = o[i].get(&Config{}) == "false"
	}
	return o
}()

// propertiesFlag loads a Debezium properties file; it is not a Config field.
const (
	propertiesFlag = "route-properties"
	propertiesEnv  = "OUTBOX_ROUTE_PROPERTIES"
)

func optionByField(field string) option {
	for _, o := range options {
		if o.field == field {
			return o
		}
	}
	return option{field: field, env: field, debezium: "-"}
}

// EnvVars lists every environment variable the router configuration reads.
func EnvVars() []string {
	out := []string{propertiesEnv}
	for _, o := range options {
		out = append(out, o.env)
	}
	return out
}

// flagValue adapts an option to flag.Value.
type flagValue struct {
	c *Config
	o option
}

func (v *flagValue) String() string {
	if v == nil || v.c == nil || v.o.secret {
		return ""
	}
	return v.o.get(v.c)
}

func (v *flagValue) Set(s string) error { return v.o.set(v.c, s) }

func (v *flagValue) IsBoolFlag() bool { return v.o.boolean }

// Bind binds every routing setting through b, as each other setting of a
// binary is bound (a flag, its OUTBOX_ROUTE_* variable, and that
// variable's _FILE form): first a Debezium properties file named by
// OUTBOX_ROUTE_PROPERTIES, then each OUTBOX_ROUTE_* variable over it. Flags
// parsed later override both; -route-properties applies the file when it is
// parsed, over what was set before it. b.Err names every variable that does
// not parse.
func (c *Config) Bind(b *config.Binder) {
	b.Var(propertiesValue{c}, propertiesFlag, propertiesEnv, "Debezium properties file with EventRouter options (transforms.<name>. prefixes allowed)")
	for _, o := range options {
		usage := o.usage
		if o.debezium != "" {
			usage += " (Debezium: " + o.debezium + ")"
		}
		if o.secret {
			usage += " (secret; prefer the environment or " + o.env + "_FILE)"
		}
		b.Var(&flagValue{c: c, o: o}, o.flag, o.env, usage)
	}
}

// propertiesValue loads a properties file into the Config when set.
type propertiesValue struct{ c *Config }

func (v propertiesValue) String() string     { return "" }
func (v propertiesValue) Set(s string) error { return v.c.loadPropertiesFile(s) }

func (c *Config) loadPropertiesFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return c.applyProperties(f)
}

// ParseProperties reads a Debezium configuration (a Kafka Connect connector
// .properties file or a Debezium Server application.properties) and
// returns DefaultConfig with the EventRouter's options from it. Options may
// be bare (route.by.field=...) or under the transform's prefix
// (transforms.outbox.route.by.field=..., debezium.transforms.outbox....).
// The converters (key.converter, value.converter, header.converter and
// their schemas.enable, or Debezium Server's debezium.format.*) choose the
// formats; debezium.* keys select RuntimeServer. An option under the
// router's prefix that Debezium does not define is an error, so that a typo
// does not fall back to a default. A Debezium Server file is read as Quarkus
// reads it ($${ is a literal ${), and a configuration expression Quarkus
// would expand (an unescaped ${routedByValue}) in a value the router takes
// is an error that names the key.
func ParseProperties(r io.Reader) (Config, error) {
	c := DefaultConfig()
	err := c.applyProperties(r)
	return c, err
}

// routerOptions are the EventRouter's option names, and the ones it accepts
// without effect here.
var ignoredRouterOptions = map[string]bool{
	"type": true, "predicate": true, "negate": true,
	"tracing.operation.name": true, "tracing.with.context.field.only": true,
	"field.name.adjustment.mode": true,
}

const eventRouterClass = "io.debezium.transforms.outbox.EventRouter"

func (c *Config) applyProperties(r io.Reader) error {
	text, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("read properties: %w", err)
	}
	p := properties.Parse(text)
	server := false
	for _, k := range p.Keys {
		if strings.HasPrefix(k, "debezium.") {
			server = true
			break
		}
	}
	// exprs holds, in server mode, the configuration expression a value
	// holds unescaped, by key: refused below where the router reads it.
	all, exprs := map[string]string{}, map[string]string{}
	// An expression naming an environment variable this process has (as
	// named, or as SmallRye maps the name: upper case, every other
	// character '_'; the environment ranks first in SmallRye too) is
	// expanded to it. Anything else is refused, a default included:
	// Debezium Server resolves it in its own environment, or from another
	// key of its file (itself expanded), and a value guessed here could
	// route elsewhere than it did, without a word.
	lookup := func(name string) (string, bool) {
		if strings.Contains(name, "$") {
			return "", false
		}
		if v, ok := os.LookupEnv(name); ok {
			return v, true
		}
		return os.LookupEnv(envName(name))
	}
	for i, k := range p.Keys {
		if server {
			// Debezium Server reads its file through Quarkus, which
			// expands ${name} as a configuration expression; $${ is the
			// escape a file written for it uses for a literal ${, as in
			// route.topic.replacement=outbox.$${routedByValue}.
			var expr string
			p.Values[i], expr = quarkusLiteral(p.Values[i], lookup)
			if expr != "" {
				exprs[k] = expr
			} else {
				delete(exprs, k) // the last value of a key given twice wins
			}
		}
		all[k] = p.Values[i]
	}
	read := map[string]bool{} // the keys whose values the router takes
	// Find the EventRouter's prefix.
	prefix := ""
	for _, base := range []string{"transforms", "debezium.transforms"} {
		for _, name := range strings.Split(all[base], ",") {
			name = strings.TrimSpace(name)
			if name != "" && strings.TrimSpace(all[base+"."+name+".type"]) == eventRouterClass {
				prefix = base + "." + name + "."
				break
			}
		}
		if prefix != "" {
			break
		}
	}
	if prefix == "" {
		for k, v := range all {
			if strings.HasSuffix(k, ".type") && strings.TrimSpace(v) == eventRouterClass {
				prefix = strings.TrimSuffix(k, "type")
				break
			}
		}
	}
	var errs []error
	byDebezium := map[string]option{}
	for _, o := range options {
		if o.debezium != "" && !strings.Contains(o.debezium, "converter") && o.debezium != "topic.prefix" && o.debezium != "extended.headers.enabled" {
			byDebezium[o.debezium] = o
		}
	}
	for i, k := range p.Keys {
		name, ok := strings.CutPrefix(k, prefix)
		if prefix == "" || !ok {
			// Bare option names count too (a file holding only the SMT's options).
			if _, known := byDebezium[k]; !known || strings.Contains(k, "transforms.") {
				continue
			}
			name = k
		}
		if o, known := byDebezium[name]; known {
			read[k] = true
			if err := o.set(c, p.Values[i]); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
			}
			continue
		}
		if !ignoredRouterOptions[name] {
			errs = append(errs, fmt.Errorf("%s: not an option of Debezium's EventRouter", k))
		}
	}
	if v, ok := all["topic.prefix"]; ok {
		read["topic.prefix"] = true
		c.TopicPrefix = strings.TrimSpace(v)
	} else if v, ok := all["debezium.source.topic.prefix"]; ok {
		read["debezium.source.topic.prefix"] = true
		c.TopicPrefix = strings.TrimSpace(v)
	}
	// A connector option, not the router's: Kafka Connect's name, or
	// Debezium Server's.
	for _, k := range []string{"extended.headers.enabled", "debezium.source.extended.headers.enabled"} {
		if v, ok := all[k]; ok {
			read[k] = true
			_, set := boolean(func(c *Config) *bool { return &c.ExtendedHeaders })
			if err := set(c, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
			}
		}
	}
	if err := c.applyConverters(all, read, server); err != nil {
		errs = append(errs, err)
	}
	// An expression in a value the router does not take (a database
	// password from the environment, say) is Debezium Server's business.
	for _, k := range p.Keys {
		if e := exprs[k]; e != "" && read[k] {
			errs = append(errs, unexpandedError(k, e))
			delete(exprs, k)
		}
	}
	return errors.Join(errs...)
}

// quarkusLiteral reads a value of a Debezium Server file as Quarkus (SmallRye
// Config's ExpressionConfigSourceInterceptor) does: \$ (\\$ in the file,
// which java.util.Properties unescapes) and $$ are a literal $; ${name} and
// ${name:default} are replaced by what lookup finds for name (a nested
// expression is not expanded, and refused); any other $ is itself. It
// returns the first expression lookup does not resolve (an unclosed one
// counts too, as SmallRye's lenient syntax takes it), or "" when there is
// none.
func quarkusLiteral(v string, lookup func(string) (string, bool)) (literal, expr string) {
	if !strings.Contains(v, "$") {
		return v, ""
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '\\' && i+1 < len(v) && v[i+1] == '$', v[i] == '$' && i+1 < len(v) && v[i+1] == '$':
			b.WriteByte('$')
			i++
		case v[i] == '$' && i+1 < len(v) && v[i+1] == '{':
			rest := v[i:]
			end := strings.IndexByte(rest, '}')
			if end >= 0 {
				name, _, _ := strings.Cut(rest[2:end], ":")
				if val, ok := lookup(name); ok && !strings.Contains(rest[2:end], "${") {
					b.WriteString(val)
					i += end
					continue
				}
				rest = rest[:end+1]
			}
			if expr == "" {
				expr = rest
			}
			b.WriteByte('$')
		default:
			b.WriteByte(v[i])
		}
	}
	return b.String(), expr
}

// envName is the environment variable SmallRye reads for a configuration
// name: upper case, every character but a letter or digit an underscore.
func envName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}

// unexpandedError refuses a configuration expression in a value the router
// takes from a Debezium Server file. Quarkus expands it before Debezium sees
// the value (Debezium Server 3.6.1 refuses to start when nothing is named so,
// as with ${routedByValue}); this router does not expand it, so the two would
// route differently.
func unexpandedError(key, expr string) error {
	return fmt.Errorf("%s: Debezium Server (Quarkus) expands %s as a configuration expression before Debezium sees it, "+
		"and this connector resolves only an environment variable it has (not another key of the file, nor a default, which Debezium Server may resolve otherwise); "+
		"write $%s for a literal %s, or write the value itself, or set the variable it names in this process's environment",
		key, expr, expr, expr)
}

// applyConverters maps converter settings to formats, and marks in read
// the keys it takes.
func (c *Config) applyConverters(all map[string]string, read map[string]bool, server bool) error {
	var errs []error
	get := func(k string) (string, bool) {
		v, ok := all[k]
		if ok {
			read[k] = true
		}
		return v, ok
	}
	// conv returns a converter's class and its schemas.enable, under Kafka
	// Connect's names or Debezium Server's (debezium.format.*, where
	// debezium.format.<x> applies to all three unless overridden).
	conv := func(which string) (class string, schemas bool, set bool) {
		schemas = true
		if server {
			f, _ := get("debezium.format." + which)
			f = strings.TrimSpace(f)
			if f == "" {
				f = "json"
			}
			class, set = f, true
			for _, k := range []string{"debezium.format.schemas.enable", "debezium.format." + which + ".schemas.enable"} {
				if v, ok := get(k); ok {
					schemas = !strings.EqualFold(strings.TrimSpace(v), "false")
				}
			}
			return
		}
		class, _ = get(which + ".converter")
		class, set = strings.TrimSpace(class), class != ""
		if v, ok := get(which + ".converter.schemas.enable"); ok {
			schemas = !strings.EqualFold(strings.TrimSpace(v), "false")
		}
		return
	}
	pick := func(which string, dst *Format, avroOK bool) {
		class, schemas, set := conv(which)
		if !set {
			return
		}
		switch class {
		case "org.apache.kafka.connect.storage.StringConverter", "io.debezium.converters.BinaryDataConverter",
			"org.apache.kafka.connect.storage.SimpleHeaderConverter", "simplestring", "binary":
			*dst = FormatString
		case "org.apache.kafka.connect.json.JsonConverter", "json":
			*dst = FormatJSON
			if schemas {
				*dst = FormatJSONSchema
			}
		case "io.confluent.connect.avro.AvroConverter", "io.apicurio.registry.utils.converter.AvroConverter", "avro":
			if !avroOK {
				errs = append(errs, fmt.Errorf("%s converter %s: Avro is supported for values only", which, class))
				return
			}
			*dst = FormatAvro
		default:
			errs = append(errs, fmt.Errorf("%s converter %q is not one this router reproduces (StringConverter, BinaryDataConverter, JsonConverter, AvroConverter)", which, class))
		}
	}
	pick("key", &c.KeyFormat, false)
	pick("value", &c.ValueFormat, true)
	pick("header", &c.HeaderFormat, false)
	if server {
		c.Runtime = RuntimeServer
	}
	vp := "value.converter."
	if server {
		vp = "debezium.format.value."
	}
	for _, k := range []string{vp + "schema.registry.url", vp + "apicurio.registry.url"} {
		if v, _ := get(k); v != "" {
			c.RegistryURLs = nil
			for _, u := range strings.Split(v, ",") {
				if u = strings.TrimSpace(u); u != "" {
					c.RegistryURLs = append(c.RegistryURLs, u)
				}
			}
		}
	}
	if v, _ := get(vp + "basic.auth.user.info"); v != "" {
		user, pass, _ := strings.Cut(v, ":")
		c.RegistryUser, c.RegistryPassword = user, pass
	}
	if v, _ := get(vp + "value.subject.name.strategy"); strings.TrimSpace(v) != "" {
		v = strings.TrimSpace(v)
		switch v[strings.LastIndexByte(v, '.')+1:] {
		case "TopicNameStrategy":
			c.AvroSubject = "${topic}-value"
		case "RecordNameStrategy":
			c.AvroSubject = "${record}"
		case "TopicRecordNameStrategy":
			c.AvroSubject = "${topic}-${record}"
		default:
			errs = append(errs, fmt.Errorf("%svalue.subject.name.strategy %s: not TopicNameStrategy, RecordNameStrategy or TopicRecordNameStrategy", vp, v))
		}
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{"auto.register.schemas", &c.AvroAutoRegister}, {"use.latest.version", &c.AvroUseLatestVersion}, {"latest.compatibility.strict", &c.AvroLatestCompatibilityStrict}} {
		if v, ok := get(vp + b.key); ok {
			_, set := boolean(func(*Config) *bool { return b.dst })
			if err := set(c, v); err != nil {
				errs = append(errs, fmt.Errorf("%s%s: %w", vp, b.key, err))
			}
		}
	}
	if v, ok := get(vp + "max.schemas.per.subject"); ok {
		_, set := integer(func(c *Config) *int { return &c.AvroMaxSchemasPerSubject })
		if err := set(c, v); err != nil {
			errs = append(errs, fmt.Errorf("%smax.schemas.per.subject: %w", vp, err))
		}
	}
	return errors.Join(errs...)
}
