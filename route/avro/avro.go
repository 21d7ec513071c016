// Package avro writes values in Confluent's wire format against a schema
// registry, as Confluent's AvroConverter does for Debezium: magic byte 0,
// the schema id (4 bytes, big-endian), then the Avro binary datum. The datum
// is the value's JSON (the payload, or the envelope) read by the subject's
// schema (textual.go: a union takes the branch that holds the value
// exactly); a string schema of any attributes (Debezium's
// io.debezium.data.Json), or an optional one, takes the payload text as it
// is. The subject's
// schema is registered at start (from files) or looked up once, the
// latest version.
package avro

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/pgoutbox/pgoutbox/route/connect"
	"github.com/twmb/franz-go/pkg/sr"
)

// Encoder encodes values; it is safe for concurrent use.
type Encoder struct {
	cl      *sr.Client
	subject string // with ${topic} or ${record}
	opts    Options

	mu      sync.RWMutex
	schemas map[string]*avroSchema // by subject: given at New, or the latest version
	fixed   map[string]bool        // subjects whose schema was given at New
	derived map[derivedKey]*avroSchema
	// perSubject counts derived's schemas per subject.
	perSubject map[string]int
}

// derivedKey is a derived schema under its subject.
type derivedKey struct{ subject, text string }

type avroSchema struct {
	id      int
	version int // the subject's version it was read as (lookup), 0 otherwise
	codec   *goavro.Codec
	root    *node
	// text is the member a text payload goes into as it is: the schema
	// itself when it is a string (Debezium's io.debezium.data.Json, or any
	// string with attributes), a union's string branch (an optional one),
	// or nil.
	text *node
}

// compile parses a subject's schema.
func compile(text string) (*avroSchema, error) {
	ctext, err := codecText(text)
	if err != nil {
		return nil, err
	}
	codec, err := goavro.NewCodec(ctext)
	if err != nil {
		return nil, err
	}
	root, err := parseSchema(text)
	if err != nil {
		return nil, err
	}
	s := &avroSchema{codec: codec, root: root}
	switch root.kind {
	case "string":
		s.text = root
	case "union":
		for _, m := range root.members {
			if m.kind == "string" {
				s.text = m
				break
			}
		}
	}
	return s, nil
}

// registryTimeout bounds one registry request.
const registryTimeout = 10 * time.Second

// Options configure an Encoder.
type Options struct {
	// URLs are the registry's; User and Password its basic
	// authentication, when set.
	URLs           []string
	User, Password string
	// Subject is the subject a value's schema lives under, with "${topic}"
	// (the topic) or "${record}" (the schema's full name).
	Subject string
	// Schemas are registered under their subjects at New, and used for
	// their subjects' values as they are.
	Schemas map[string]string
	// AutoRegister registers the schema derived from each value's Connect
	// schema (Derive); false looks it up under its subject. UseLatest
	// writes with the subject's latest version instead; LatestStrict then
	// asks the registry first whether the derived schema is compatible
	// with it. Confluent's auto.register.schemas, use.latest.version and
	// latest.compatibility.strict.
	AutoRegister, UseLatest, LatestStrict bool
	// MaxSchemasPerSubject bounds the schemas derived and cached per
	// subject (Confluent's max.schemas.per.subject; 0 is its default,
	// 1000): past it the subject's cache is emptied and fills again.
	MaxSchemasPerSubject int
}

// Error is a value that cannot be encoded. Registry says the registry is at
// fault (retry the value as it is) rather than the value or the subject's
// schema (the row cannot be encoded by retrying).
//
// Rejected says the registry answered but refused the subject's schema (an
// incompatible schema, one not registered while auto-registration is off):
// the value is fine, and waits, retried, until an operator changes the
// registry; it is never a dead letter.
type Error struct {
	Registry bool
	Rejected bool
	Msg      string
	Err      error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(registry bool, err error, format string, args ...any) *Error {
	return &Error{Registry: registry, Msg: fmt.Sprintf(format, args...), Err: err}
}

// New connects to the registry and registers opts.Schemas.
func New(ctx context.Context, opts Options) (*Encoder, error) {
	copts := []sr.ClientOpt{sr.URLs(opts.URLs...), sr.HTTPClient(&http.Client{Timeout: registryTimeout}), sr.UserAgent("pgoutbox-route")}
	if opts.User != "" || opts.Password != "" {
		copts = append(copts, sr.BasicAuth(opts.User, opts.Password))
	}
	cl, err := sr.NewClient(copts...)
	if err != nil {
		return nil, fmt.Errorf("schema registry client: %w", err)
	}
	e := &Encoder{cl: cl, subject: opts.Subject, opts: opts, schemas: map[string]*avroSchema{}, fixed: map[string]bool{}, derived: map[derivedKey]*avroSchema{}, perSubject: map[string]int{}}
	for subject, text := range opts.Schemas {
		s, err := compile(text)
		if err != nil {
			return nil, fmt.Errorf("Avro schema for subject %q: %w", subject, err)
		}
		ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			return nil, fmt.Errorf("register Avro schema for subject %q at %s: %w", subject, strings.Join(opts.URLs, ","), err)
		}
		s.id = ss.ID
		e.schemas[subject] = s
		e.fixed[subject] = true
	}
	return e, nil
}

// schemaFor returns the schema a value of Connect schema vs on topic is
// written with, and its subject: a subject's schema given at New; else, as
// Confluent's serializer does, the latest version (UseLatest), the derived
// schema registered (AutoRegister) or looked up. Without vs (no Connect
// schema is known) the subject's latest version.
func (e *Encoder) schemaFor(ctx context.Context, topic string, vs *connect.Schema) (*avroSchema, string, error) {
	subject := strings.ReplaceAll(e.subject, "${topic}", topic)
	if !strings.Contains(subject, "${record}") {
		e.mu.RLock()
		s := e.schemas[subject]
		fixed := e.fixed[subject]
		e.mu.RUnlock()
		if fixed {
			return s, subject, nil
		}
	}
	if vs == nil {
		if strings.Contains(subject, "${record}") {
			return nil, subject, errorf(false, nil, "the value has no schema to name a ${record} subject by")
		}
		s, err := e.lookup(ctx, subject)
		return s, subject, err
	}
	text, name, err := Derive(vs)
	if err != nil {
		return nil, subject, errorf(false, err, "derive the Avro schema of the value (as Confluent's AvroConverter does)")
	}
	if strings.Contains(subject, "${record}") {
		if name == "" {
			// Confluent's RecordNameStrategy fails such a value too.
			return nil, subject, &Error{Rejected: true, Msg: fmt.Sprintf("the subject name strategy %q needs a record schema, and the value's schema is %s "+
				"(an optional one, as an expanded payload, is a union: Confluent's RecordNameStrategy refuses it too): "+
				"use TopicNameStrategy (OUTBOX_ROUTE_AVRO_SUBJECT=${topic}-value) or place a field in the envelope, which makes the value a record", e.subject, text)}
		}
		subject = strings.ReplaceAll(subject, "${record}", name)
		e.mu.RLock()
		s, fixed := e.schemas[subject], e.fixed[subject]
		e.mu.RUnlock()
		if fixed {
			return s, subject, nil
		}
	}
	key := derivedKey{subject, text}
	e.mu.RLock()
	s, n := e.derived[key], e.perSubject[subject]
	e.mu.RUnlock()
	if s != nil {
		return s, subject, nil
	}
	if n >= e.maxPerSubject() {
		// Bounded memory: a topic whose values vary in shape without end
		// (an expanded payload keyed by ids) would add a schema per
		// event. The subject's cache is emptied and fills again; the
		// registry answers a schema it holds with its id. (Confluent's
		// client fails the record there instead, and its task stops
		// until restarted, to fail again: a wedge.)
		e.mu.Lock()
		for k := range e.derived {
			if k.subject == subject {
				delete(e.derived, k)
			}
		}
		e.perSubject[subject] = 0
		e.mu.Unlock()
	}

	switch {
	case e.opts.UseLatest:
		if s, err = e.lookup(ctx, subject); err != nil {
			var ae *Error
			if errors.As(err, &ae) && !ae.Registry {
				// No version to use: Confluent's serializer fails the
				// record; here it waits for one.
				ae.Rejected = true
				ae.Msg += " and use.latest.version is on: register one, or set use.latest.version=false (OUTBOX_ROUTE_AVRO_USE_LATEST_VERSION)"
			}
			return nil, subject, err
		}
		if e.opts.LatestStrict {
			// Checked against the version the value would be written
			// with, not the registry's latest at this moment; refused,
			// the next attempt reads the latest again (an operator may
			// register a compatible one, as the error asks).
			ok, err := e.cl.CheckCompatibility(ctx, subject, s.version, sr.Schema{Schema: text, Type: sr.TypeAvro})
			if err != nil {
				e.forget(subject, s)
				return nil, subject, registryError(err, "ask the registry whether the value's schema is compatible with version %d of subject %q", s.version, subject)
			}
			if !ok.Is {
				e.forget(subject, s)
				return nil, subject, &Error{Rejected: true, Msg: fmt.Sprintf("the value's schema %s is not compatible with the latest version of subject %q (version %d, id %d), and latest.compatibility.strict is on: "+
					"register a compatible version, or set latest.compatibility.strict=false (OUTBOX_ROUTE_AVRO_LATEST_COMPATIBILITY_STRICT)", text, subject, s.version, s.id)}
			}
		}
	case e.opts.AutoRegister:
		// Compiled first: a schema this encoder cannot write with is not
		// registered for nothing.
		if s, err = compile(text); err != nil {
			return nil, subject, errorf(false, err, "the derived schema %s does not compile", text)
		}
		ss, err := e.cl.CreateSchema(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			return nil, subject, registryError(err, "register the value's schema %s under subject %q", text, subject)
		}
		s.id = ss.ID
	default:
		ss, err := e.cl.LookupSchema(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			var re *sr.ResponseError
			if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
				return nil, subject, &Error{Rejected: true, Err: err, Msg: fmt.Sprintf("the value's schema %s is not registered under subject %q and auto.register.schemas is off: "+
					"register it, or set auto.register.schemas=true (OUTBOX_ROUTE_AVRO_AUTO_REGISTER)", text, subject)}
			}
			return nil, subject, registryError(err, "look up the value's schema %s under subject %q", text, subject)
		}
		if s, err = compile(text); err != nil {
			return nil, subject, errorf(false, err, "the derived schema %s does not compile", text)
		}
		s.id = ss.ID
	}
	e.mu.Lock()
	if old := e.derived[key]; old != nil {
		s = old
	} else {
		e.derived[key] = s
		e.perSubject[subject]++
	}
	e.mu.Unlock()
	return s, subject, nil
}

// Cached is how many derived schemas the encoder holds.
func (e *Encoder) Cached() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.derived)
}

// maxPerSubject is Options.MaxSchemasPerSubject, or Confluent's default.
func (e *Encoder) maxPerSubject() int {
	if e.opts.MaxSchemasPerSubject > 0 {
		return e.opts.MaxSchemasPerSubject
	}
	return 1000
}

// forget drops subject's cached latest version s, so that the next lookup
// reads the registry's latest again.
func (e *Encoder) forget(subject string, s *avroSchema) {
	e.mu.Lock()
	if e.schemas[subject] == s && !e.fixed[subject] {
		delete(e.schemas, subject)
	}
	e.mu.Unlock()
}

// fieldNode is the schema of record n's field name, nil when n is no
// record or has no such field.
func fieldNode(n *node, name string) *node {
	if n == nil || n.kind != "record" {
		return nil
	}
	for _, f := range n.fields {
		if f.name == name {
			return f.n
		}
	}
	return nil
}

// takesText reports whether a JSON text goes into schema n as a string: n
// is a string, or a union with a string and nothing a JSON object or array
// could be read into.
func takesText(n *node) bool {
	if n == nil {
		return false
	}
	switch n.kind {
	case "string":
		return true
	case "union":
		text := false
		for _, m := range n.members {
			switch m.kind {
			case "string":
				text = true
			case "record", "map", "array":
				return false
			}
		}
		return text
	}
	return false
}

// registryError is a registry's error: refused (a 4xx answer about the
// schema: incompatible, invalid) or unavailable (anything else: retried).
func registryError(err error, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	var re *sr.ResponseError
	if errors.As(err, &re) && (re.StatusCode == http.StatusConflict || re.StatusCode == http.StatusUnprocessableEntity) {
		what := "the registry refused the schema"
		if re.StatusCode == http.StatusConflict {
			what = "the registry refused the schema as incompatible with the subject's versions (its compatibility level)"
		}
		return &Error{Rejected: true, Err: err, Msg: msg + ": " + what + ": change the subject's compatibility level or its versions; the line waits and retries"}
	}
	return &Error{Registry: true, Err: err, Msg: msg}
}

// lookup returns the subject's schema, from the registry's latest version
// the first time it is asked for.
func (e *Encoder) lookup(ctx context.Context, subject string) (*avroSchema, error) {
	e.mu.RLock()
	s := e.schemas[subject]
	e.mu.RUnlock()
	if s != nil {
		return s, nil
	}
	ss, err := e.cl.SchemaByVersion(ctx, subject, -1)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound && (re.ErrorCode == 40401 || re.ErrorCode == 40402) {
			// A routed topic with no schema (subject or version not found,
			// as the registry's error code says) is this row's problem, not
			// the registry's: dead-letter it. A 404 without those codes is a
			// wrong registry URL: retried, never dead-lettered.
			return nil, errorf(false, err, "no Avro schema registered under subject %q", subject)
		}
		return nil, errorf(true, err, "look up the Avro schema of subject %q", subject)
	}
	if ss.Type != sr.TypeAvro {
		return nil, errorf(false, nil, "subject %q holds a %s schema, not Avro", subject, ss.Type)
	}
	if len(ss.References) > 0 {
		return nil, errorf(false, nil, "subject %q: schemas with references are not supported", subject)
	}
	s, err = compile(ss.Schema.Schema)
	if err != nil {
		return nil, errorf(false, err, "subject %q: the registry's schema does not compile", subject)
	}
	s.id, s.version = ss.ID, ss.Version
	e.mu.Lock()
	if old := e.schemas[subject]; old != nil {
		s = old
	} else {
		e.schemas[subject] = s
	}
	e.mu.Unlock()
	return s, nil
}

// Encode appends the value for topic and reports a null value: a null
// payload is a null value (the Confluent serializer's null); a bytea
// payload is taken to be Avro already framed by the application
// (Debezium's documented BinaryDataConverter setup) and goes out as it is.
// pv is the payload (payloadJSON: a json or jsonb column's text) and ps its
// Connect schema; with envSchema the value is the envelope envVal, whose
// first field is the payload. An error is an *Error.
func (e *Encoder) Encode(ctx context.Context, buf []byte, topic string, payloadJSON bool, ps *connect.Schema, pv *connect.Value, envSchema *connect.Schema, envVal *connect.Value) ([]byte, bool, error) {
	if envSchema == nil {
		switch pv.Kind {
		case connect.KindNull:
			return buf, true, nil
		case connect.KindBytes:
			return append(buf, pv.Bytes...), false, nil
		}
	}
	vs := envSchema
	if vs == nil {
		vs = ps
	}
	s, subject, err := e.schemaFor(ctx, topic, vs)
	if err != nil {
		return buf, false, err
	}
	var native any
	switch {
	case envSchema == nil && pv.Kind == connect.KindStr && s.text == s.root:
		native = string(pv.Bytes)
	case envSchema == nil && pv.Kind == connect.KindStr && s.text != nil:
		native = goavro.Union(s.text.branch, string(pv.Bytes))
	default:
		var text []byte
		if envSchema == nil {
			text = appendAvroJSON(nil, payloadJSON, ps, pv)
		} else {
			text = append(text, '{')
			for i, f := range envSchema.Fields {
				if i > 0 {
					text = append(text, ',')
				}
				text = connect.AppendJSONStr(text, f.Name)
				text = append(text, ':')
				if i == 0 {
					// The payload's JSON as JSON for a schema that reads it
					// (a record registered by hand), as a string for one
					// that takes text (Debezium's io.debezium.data.Json).
					raw := payloadJSON && !takesText(fieldNode(s.root, f.Name))
					text = appendAvroJSON(text, raw, envSchema.Fields[0].Schema, &envVal.List[0])
				} else {
					text = appendAvroJSON(text, false, f.Schema, &envVal.List[i])
				}
			}
			text = append(text, '}')
		}
		var rest []byte
		if text, err = appendAvroText(nil, s.root, text); err == nil {
			native, rest, err = s.codec.NativeFromTextual(text)
		}
		if err == nil && len(strings.TrimSpace(string(rest))) > 0 {
			err = fmt.Errorf("trailing data after the JSON value")
		}
		if err != nil {
			return buf, false, errorf(false, err, "payload does not conform to the Avro schema of subject %q (id %d)", subject, s.id)
		}
	}
	buf = append(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, uint32(s.id))
	out, err := s.codec.BinaryFromNative(buf, native)
	if err != nil {
		return buf, false, errorf(false, err, "payload does not conform to the Avro schema of subject %q (id %d)", subject, s.id)
	}
	return out, false, nil
}

// appendAvroJSON writes a value as the JSON the Avro conversion reads: a
// json/jsonb payload as its JSON text, bytes as Avro's JSON encoding of
// bytes (one code point per byte), everything else as JsonConverter would.
// A numeric column whose declaration is known (s is its schema) is written
// as Confluent's AvroConverter writes Debezium's: a VariableScaleDecimal as
// the record {"scale": int, "value": bytes}, a Decimal of known precision as
// the bytes of its unscaled value (Avro's decimal logical type). Without
// the declaration a numeric stays a JSON number (fits a double).
func appendAvroJSON(dst []byte, jsonText bool, s *connect.Schema, v *connect.Value) []byte {
	switch {
	case v.Kind == connect.KindStr && jsonText:
		return append(dst, v.Bytes...)
	case v.Kind == connect.KindBytes:
		return appendAvroBytesJSON(dst, v.Bytes)
	case v.Kind == connect.KindVarDec:
		return connect.AppendVarDecimal(dst, v.Dec, appendAvroBytesJSON)
	case v.Kind == connect.KindDec && s != nil && s.Name == connect.DecimalSchemaName && s.HasParam(connect.DecimalPrecisionParam):
		return appendAvroBytesJSON(dst, connect.TwosComplement(&v.Dec.Unscaled))
	case v.Kind == connect.KindStruct && s != nil && len(s.Fields) == len(v.List):
		// An expanded payload: its fields named, its leaves as above.
		dst = append(dst, '{')
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = connect.AppendJSONStr(dst, s.Fields[i].Name)
			dst = append(dst, ':')
			dst = appendAvroJSON(dst, false, s.Fields[i].Schema, &v.List[i])
		}
		return append(dst, '}')
	case v.Kind == connect.KindList && s != nil:
		dst = append(dst, '[')
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendAvroJSON(dst, false, s.Items, &v.List[i])
		}
		return append(dst, ']')
	}
	if v.Kind == connect.KindNull && s != nil && s.Default != nil {
		// Struct.get gives a field's default for null (AvroData reads the
		// value through it).
		return appendAvroJSON(dst, jsonText, s, s.Default)
	}
	return connect.AppendValueJSON(dst, nil, v)
}

// appendAvroBytesJSON writes bytes as Avro's JSON encoding does: a string
// of one code point per byte. Bytes from 0x7f up are escaped (\u00XX):
// goavro reads an unescaped non-ASCII character as its UTF-8 bytes.
func appendAvroBytesJSON(dst []byte, b []byte) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c >= 0x7f:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
