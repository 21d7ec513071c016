package avro

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

// Derive writes the Avro schema Confluent's AvroConverter derives from a
// Kafka Connect schema (AvroData.fromConnectSchema with its defaults:
// connect.meta.data on, enhanced Avro schema support off), as Avro's
// Schema.toString prints it, so that the registry holds the same text
// under the same subject as for Debezium, and the same schema id. It also
// returns the full name of a record schema ("" for any other), for the
// record subject strategies.
func Derive(s *connect.Schema) (text, name string, err error) {
	d := &deriver{}
	b, err := d.schema(nil, s, "")
	if err != nil {
		return "", "", err
	}
	return string(b), d.topName, nil
}

type deriver struct {
	defaults int    // unnamed records so far: ConnectDefault, ConnectDefault2, ...
	topName  string // the full name of the top-level schema, "" when not a record
	depth    int
	// records are the records written so far: AvroData reuses the Avro
	// schema of a Connect schema equal to one it converted (optional or
	// not), which Avro prints the second time as a name.
	records []seenRecord
}

type seenRecord struct {
	s           *connect.Schema
	space, full string
}

const (
	connectNamespace   = "io.confluent.connect.avro"
	connectDefaultName = "ConnectDefault"
	// decimalPrecisionDefault is the precision AvroData gives a Decimal
	// without connect.decimal.precision.
	decimalPrecisionDefault = 64
)

// schema writes s; ns is the namespace Avro's toString is in (the enclosing
// record's), which a nested record's own namespace is printed against.
func (d *deriver) schema(dst []byte, s *connect.Schema, ns string) ([]byte, error) {
	top := d.depth == 0
	d.depth++
	defer func() { d.depth-- }()
	// maybeMakeOptional: null first, unless the schema has a default,
	// which an Avro union's default must match: then null second.
	switch {
	case s.Optional && s.Default != nil:
		dst = append(dst, '[')
	case s.Optional:
		dst = append(dst, `["null",`...)
	}
	var err error
	// Only a record is named for the record subject strategies: an
	// optional one is a union, which has no name (Confluent's AvroSchema.name
	// is null for it, and RecordNameStrategy refuses the value).
	if dst, err = d.base(dst, s, ns, top && !s.Optional); err != nil {
		return dst, err
	}
	switch {
	case s.Optional && s.Default != nil:
		dst = append(dst, `,"null"]`...)
	case s.Optional:
		dst = append(dst, ']')
	}
	return dst, nil
}

func (d *deriver) base(dst []byte, s *connect.Schema, ns string, top bool) ([]byte, error) {
	var prim, connectType string
	switch s.Type {
	case connect.TypeInt8:
		prim, connectType = "int", "int8"
	case connect.TypeInt16:
		prim, connectType = "int", "int16"
	case connect.TypeInt32:
		prim = "int"
	case connect.TypeInt64:
		prim = "long"
	case connect.TypeFloat32:
		prim = "float"
	case connect.TypeFloat64:
		prim = "double"
	case connect.TypeBool:
		prim = "boolean"
	case connect.TypeString:
		prim = "string"
	case connect.TypeBytes:
		prim = "bytes"
	case connect.TypeArray:
		dst = append(dst, `{"type":"array","items":`...)
		var err error
		if dst, err = d.schema(dst, s.Items, ns); err != nil {
			return dst, err
		}
		dst = d.props(dst, s, "")
		return append(dst, '}'), nil
	case connect.TypeStruct:
		return d.record(dst, s, ns, top)
	default:
		return dst, fmt.Errorf("no Avro schema for the Connect type %s", s.Type)
	}
	decimal := s.Type == connect.TypeBytes && s.HasName && s.Name == connect.DecimalSchemaName
	if !decimal && connectType == "" && !s.HasName && !s.HasVersion && s.Doc == "" && len(s.Params) == 0 && s.Default == nil {
		return appendSchemaString(dst, prim), nil
	}
	dst = append(dst, `{"type":`...)
	dst = appendSchemaString(dst, prim)
	if decimal {
		scale, precision := 0, decimalPrecisionDefault
		for _, p := range s.Params {
			n, err := strconv.Atoi(p[1])
			switch {
			case p[0] == "scale" && err == nil:
				scale = n
			case p[0] == connect.DecimalPrecisionParam && err == nil:
				precision = n
			case p[0] == "scale" || p[0] == connect.DecimalPrecisionParam:
				return dst, fmt.Errorf("decimal parameter %s=%q is not an integer", p[0], p[1])
			}
		}
		dst = append(dst, `,"scale":`...)
		dst = strconv.AppendInt(dst, int64(scale), 10)
		dst = append(dst, `,"precision":`...)
		dst = strconv.AppendInt(dst, int64(precision), 10)
	}
	dst = d.props(dst, s, connectType)
	switch {
	case decimal:
		dst = append(dst, `,"logicalType":"decimal"`...)
	case s.HasName && logicalTypes[s.Name] != "" && (s.Type == connect.TypeInt32 || s.Type == connect.TypeInt64):
		// AvroData adds Avro's logical type after the connect.* ones.
		dst = append(dst, `,"logicalType":`...)
		dst = appendSchemaString(dst, logicalTypes[s.Name])
	}
	return append(dst, '}'), nil
}

// logicalTypes are the Avro logical types AvroData gives Kafka Connect's
// own logical schemas (Decimal aside).
var logicalTypes = map[string]string{
	"org.apache.kafka.connect.data.Date":      "date",
	"org.apache.kafka.connect.data.Time":      "time-millis",
	"org.apache.kafka.connect.data.Timestamp": "timestamp-millis",
}

// props writes the connect.* properties AvroData adds, in its order.
func (d *deriver) props(dst []byte, s *connect.Schema, connectType string) []byte {
	if s.Doc != "" {
		dst = append(dst, `,"connect.doc":`...)
		dst = appendSchemaString(dst, s.Doc)
	}
	if s.HasVersion {
		dst = append(dst, `,"connect.version":`...)
		dst = strconv.AppendInt(dst, int64(s.Version), 10)
	}
	if len(s.Params) > 0 {
		dst = append(dst, `,"connect.parameters":{`...)
		for i, p := range s.Params {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSchemaString(dst, p[0])
			dst = append(dst, ':')
			dst = appendSchemaString(dst, p[1])
		}
		dst = append(dst, '}')
	}
	if s.Default != nil {
		dst = append(dst, `,"connect.default":`...)
		dst = appendDefault(dst, s, s.Default)
	}
	if s.HasName {
		dst = append(dst, `,"connect.name":`...)
		dst = appendSchemaString(dst, s.Name)
	}
	if connectType != "" {
		dst = append(dst, `,"connect.type":`...)
		dst = appendSchemaString(dst, connectType)
	}
	return dst
}

func (d *deriver) record(dst []byte, s *connect.Schema, ns string, top bool) ([]byte, error) {
	for _, r := range d.records {
		if sameRecord(r.s, s) {
			// Avro's Name.getQualified: the short name in its own
			// namespace, the full name elsewhere.
			name := r.full
			if r.space == ns && r.space != "" {
				name = r.full[len(r.space)+1:]
			}
			return appendSchemaString(dst, name), nil
		}
	}
	space, name := connectNamespace, connectDefaultName
	if s.HasName && s.Name != "" {
		space, name = "", s.Name
		if i := strings.LastIndexByte(s.Name, '.'); i >= 0 {
			space, name = s.Name[:i], s.Name[i+1:]
		}
	} else {
		d.defaults++
		if d.defaults > 1 {
			name += strconv.Itoa(d.defaults)
		}
	}
	if err := validName(name); err != nil {
		return dst, err
	}
	for _, part := range strings.Split(space, ".") {
		if space == "" {
			break
		}
		if err := validName(part); err != nil {
			return dst, fmt.Errorf("namespace %q: %w", space, err)
		}
	}
	full := name
	if space != "" {
		full = space + "." + name
	}
	if top {
		d.topName = full
	}
	d.records = append(d.records, seenRecord{s: s, space: space, full: full})
	dst = append(dst, `{"type":"record","name":`...)
	dst = appendSchemaString(dst, name)
	if space != ns {
		dst = append(dst, `,"namespace":`...)
		dst = appendSchemaString(dst, space)
	}
	dst = append(dst, `,"fields":[`...)
	for i, f := range s.Fields {
		if err := validName(f.Name); err != nil {
			return dst, fmt.Errorf("field of %s: %w", full, err)
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":`...)
		dst = appendSchemaString(dst, f.Name)
		dst = append(dst, `,"type":`...)
		var err error
		if dst, err = d.schema(dst, f.Schema, space); err != nil {
			return dst, err
		}
		switch {
		case f.Schema.Default != nil:
			dst = append(dst, `,"default":`...)
			dst = appendDefault(dst, f.Schema, f.Schema.Default)
		case f.Schema.Optional:
			dst = append(dst, `,"default":null`...)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	dst = d.props(dst, s, "")
	return append(dst, '}'), nil
}

// sameRecord is ConnectSchema.equals of the two schemas made required.
func sameRecord(a, b *connect.Schema) bool {
	x, y := *a, *b
	x.Optional, y.Optional = false, false
	return x.Equal(&y)
}

// validName is Avro's name rule as Avro 1.12's Java Schema enforces it when
// AvroData builds the schema (NameValidator.UTF_VALIDATOR, the default): a
// letter or '_', then letters, digits or '_', a letter or digit being
// what Java's Character says of each UTF-16 unit (so "prénom" is a name, and
// a character beyond the Basic Multilingual Plane is not). A Debezium
// envelope named after an aggregate type with a '-' fails there too.
func validName(n string) error {
	if n == "" {
		return fmt.Errorf("an empty name is not a valid Avro name")
	}
	for i, c := range n {
		if c == '_' || c <= 0xFFFF && (unicode.IsLetter(c) || i > 0 && unicode.IsDigit(c)) {
			continue
		}
		return fmt.Errorf("%q is not a valid Avro name (letters, digits and _, not beginning with a digit)", n)
	}
	return nil
}

// appendDefault writes a default value as AvroData.defaultValueFromConnect
// makes it (and Avro prints it): numbers as Java prints them, bytes (a
// Decimal's unscaled value included) as a string of one character per byte.
func appendDefault(dst []byte, s *connect.Schema, v *connect.Value) []byte {
	switch v.Kind {
	case connect.KindNull:
		return append(dst, "null"...)
	case connect.KindStr:
		return appendSchemaString(dst, string(v.Bytes))
	case connect.KindBool:
		return strconv.AppendBool(dst, v.Int != 0)
	case connect.KindI16, connect.KindI32, connect.KindI64:
		return strconv.AppendInt(dst, v.Int, 10)
	case connect.KindF32:
		return connect.AppendJavaDouble(dst, v.Float, 32)
	case connect.KindF64:
		return connect.AppendJavaDouble(dst, v.Float, 64)
	case connect.KindBytes:
		return appendLatin1(dst, v.Bytes)
	case connect.KindDec:
		return appendLatin1(dst, connect.TwosComplement(&v.Dec.Unscaled))
	case connect.KindStruct:
		dst = append(dst, '{')
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSchemaString(dst, s.Fields[i].Name)
			dst = append(dst, ':')
			dst = appendDefault(dst, s.Fields[i].Schema, &v.List[i])
		}
		return append(dst, '}')
	case connect.KindList:
		dst = append(dst, '[')
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendDefault(dst, s.Items, &v.List[i])
		}
		return append(dst, ']')
	}
	return append(dst, "null"...)
}

// appendLatin1 writes bytes as the string new String(b, ISO_8859_1) is.
func appendLatin1(dst []byte, b []byte) []byte {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return appendSchemaString(dst, string(r))
}

// appendSchemaString writes a string as Avro's Schema.toString does (Jackson
// writing to a Writer): '"', '\\' and control characters escaped (\uXXXX in
// upper case, or \b \t \n \f \r), every other character as it is, one
// beyond the Basic Multilingual Plane included.
func appendSchemaString(dst []byte, s string) []byte {
	const hexUpper = "0123456789ABCDEF"
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\b':
			dst = append(dst, '\\', 'b')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\f':
			dst = append(dst, '\\', 'f')
		case r == '\r':
			dst = append(dst, '\\', 'r')
		case r < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexUpper[r>>4], hexUpper[r&0xF])
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, '"')
}
