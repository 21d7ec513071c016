package avro

import (
	"fmt"
	"strconv"
	"strings"

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
	if s.Optional {
		dst = append(dst, `["null",`...)
	}
	var err error
	if dst, err = d.base(dst, s, ns, top); err != nil {
		return dst, err
	}
	if s.Optional {
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
	if !decimal && connectType == "" && !s.HasName && !s.HasVersion && s.Doc == "" && len(s.Params) == 0 {
		return appendJSONString(dst, prim), nil
	}
	dst = append(dst, `{"type":`...)
	dst = appendJSONString(dst, prim)
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
	if decimal {
		dst = append(dst, `,"logicalType":"decimal"`...)
	}
	return append(dst, '}'), nil
}

// props writes the connect.* properties AvroData adds, in its order.
func (d *deriver) props(dst []byte, s *connect.Schema, connectType string) []byte {
	if s.Doc != "" {
		dst = append(dst, `,"connect.doc":`...)
		dst = appendJSONString(dst, s.Doc)
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
			dst = appendJSONString(dst, p[0])
			dst = append(dst, ':')
			dst = appendJSONString(dst, p[1])
		}
		dst = append(dst, '}')
	}
	if s.HasName {
		dst = append(dst, `,"connect.name":`...)
		dst = appendJSONString(dst, s.Name)
	}
	if connectType != "" {
		dst = append(dst, `,"connect.type":`...)
		dst = appendJSONString(dst, connectType)
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
			return appendJSONString(dst, name), nil
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
	dst = appendJSONString(dst, name)
	if space != ns {
		dst = append(dst, `,"namespace":`...)
		dst = appendJSONString(dst, space)
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
		dst = appendJSONString(dst, f.Name)
		dst = append(dst, `,"type":`...)
		var err error
		if dst, err = d.schema(dst, f.Schema, space); err != nil {
			return dst, err
		}
		if f.Schema.Optional {
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

// validName is Avro's name rule, which Avro's Java Schema enforces when
// AvroData builds the schema (a Debezium envelope named after an aggregate
// type with a '-' fails there too).
func validName(n string) error {
	if n == "" {
		return fmt.Errorf("an empty name is not a valid Avro name")
	}
	for i, c := range n {
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return fmt.Errorf("%q is not a valid Avro name (letters, digits and _, not beginning with a digit)", n)
	}
	return nil
}
