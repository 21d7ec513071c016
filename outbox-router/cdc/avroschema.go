package cdc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// This file reads Avro schemas and the Avro binary encoding
// (https://avro.apache.org/docs/1.11.1/specification/), as far as Kafka
// Connect's converters use them, with the Connect metadata that Confluent's
// AvroData puts on each schema ("connect.name", "connect.type",
// "connect.parameters"). It is a decoder of its own rather than goavro's so
// that fields keep their order and their Connect types, and so that a hostile
// length or block count in a record fails instead of allocating gigabytes.

// avroType is one parsed Avro schema.
type avroType struct {
	kind     string // null boolean int long float double bytes string record enum array map fixed union
	fullName string // record, enum, fixed
	fields   []avroField
	branches []*avroType // union
	items    *avroType   // array items, map values
	symbols  []string    // enum
	size     int         // fixed

	// Connect metadata.
	connectName   string
	connectType   string // "int8" or "int16" on an Avro int
	connectParams map[string]string
	logicalType   string
	scale         int // decimal
}

type avroField struct {
	name string
	typ  *avroType
}

var primitives = map[string]bool{
	"null": true, "boolean": true, "int": true, "long": true, "float": true,
	"double": true, "bytes": true, "string": true,
}

// parseAvroSchema parses a schema as the registry returns it.
func parseAvroSchema(text string) (*avroType, error) {
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	p := schemaParser{named: map[string]*avroType{}}
	return p.parse(v, "", 0)
}

type schemaParser struct {
	named map[string]*avroType
}

// maxSchemaDepth bounds nesting, in schemas and in data.
const maxSchemaDepth = 64

func (p *schemaParser) parse(v any, ns string, depth int) (*avroType, error) {
	if depth > maxSchemaDepth {
		return nil, errors.New("schema nested too deeply")
	}
	switch x := v.(type) {
	case string:
		if primitives[x] {
			return &avroType{kind: x}, nil
		}
		if t := p.lookup(x, ns); t != nil {
			return t, nil
		}
		return nil, fmt.Errorf("unknown type %q", x)
	case []any:
		if len(x) == 0 {
			return nil, errors.New("empty union")
		}
		u := &avroType{kind: "union"}
		for _, b := range x {
			t, err := p.parse(b, ns, depth+1)
			if err != nil {
				return nil, err
			}
			if t.kind == "union" {
				return nil, errors.New("union directly inside a union")
			}
			u.branches = append(u.branches, t)
		}
		return u, nil
	case map[string]any:
		return p.parseObject(x, ns, depth)
	}
	return nil, fmt.Errorf("%T is not an Avro schema", v)
}

func (p *schemaParser) lookup(name, ns string) *avroType {
	if !strings.Contains(name, ".") && ns != "" {
		if t := p.named[ns+"."+name]; t != nil {
			return t
		}
	}
	return p.named[name]
}

func (p *schemaParser) parseObject(o map[string]any, ns string, depth int) (*avroType, error) {
	var t *avroType
	switch typ := o["type"].(type) {
	case string:
		switch typ {
		case "record", "error", "enum", "fixed":
			name, _ := o["name"].(string)
			if name == "" {
				return nil, fmt.Errorf("%s without a name", typ)
			}
			full := name
			if !strings.Contains(name, ".") {
				if n, ok := o["namespace"].(string); ok {
					ns = n
				}
				if ns != "" {
					full = ns + "." + name
				}
			}
			if i := strings.LastIndexByte(full, '.'); i >= 0 {
				ns = full[:i]
			} else {
				ns = ""
			}
			if p.named[full] != nil {
				return nil, fmt.Errorf("type %q defined twice", full)
			}
			t = &avroType{kind: typ, fullName: full}
			if typ == "error" {
				t.kind = "record"
			}
			// Registered before its fields, so that a field may refer
			// to its own record.
			p.named[full] = t
			if err := p.fill(t, o, ns, depth); err != nil {
				return nil, fmt.Errorf("%s: %w", full, err)
			}
		case "array":
			items, err := p.parse(o["items"], ns, depth+1)
			if err != nil {
				return nil, fmt.Errorf("array items: %w", err)
			}
			t = &avroType{kind: "array", items: items}
		case "map":
			values, err := p.parse(o["values"], ns, depth+1)
			if err != nil {
				return nil, fmt.Errorf("map values: %w", err)
			}
			t = &avroType{kind: "map", items: values}
		default:
			base, err := p.parse(typ, ns, depth+1)
			if err != nil {
				return nil, err
			}
			if !primitives[typ] {
				// {"type": "SomeNamedType"}: a reference, no metadata.
				return base, nil
			}
			t = &avroType{kind: typ}
		}
	case nil:
		return nil, errors.New("schema object without a type")
	default:
		// {"type": {...}} or {"type": [...]}: the inner schema.
		return p.parse(typ, ns, depth+1)
	}
	if s, ok := o["connect.name"].(string); ok {
		t.connectName = s
	}
	if s, ok := o["connect.type"].(string); ok {
		t.connectType = s
	}
	if params, ok := o["connect.parameters"].(map[string]any); ok {
		t.connectParams = make(map[string]string, len(params))
		for k, v := range params {
			if s, ok := v.(string); ok {
				t.connectParams[k] = s
			}
		}
	}
	if s, ok := o["logicalType"].(string); ok {
		t.logicalType = s
	}
	if f, ok := o["scale"].(float64); ok {
		t.scale = int(f)
	}
	return t, nil
}

// fill reads a named type's body.
func (p *schemaParser) fill(t *avroType, o map[string]any, ns string, depth int) error {
	switch t.kind {
	case "record":
		fields, ok := o["fields"].([]any)
		if !ok {
			return errors.New("record without fields")
		}
		seen := map[string]bool{}
		for i, f := range fields {
			fo, ok := f.(map[string]any)
			if !ok {
				return fmt.Errorf("field %d is not an object", i)
			}
			name, _ := fo["name"].(string)
			if name == "" || seen[name] {
				return fmt.Errorf("field %d: missing or repeated name %q", i, name)
			}
			seen[name] = true
			ft, err := p.parse(fo["type"], ns, depth+1)
			if err != nil {
				return fmt.Errorf("field %q: %w", name, err)
			}
			t.fields = append(t.fields, avroField{name: name, typ: ft})
		}
	case "enum":
		syms, _ := o["symbols"].([]any)
		for _, s := range syms {
			str, ok := s.(string)
			if !ok {
				return errors.New("enum symbol is not a string")
			}
			t.symbols = append(t.symbols, str)
		}
		if len(t.symbols) == 0 {
			return errors.New("enum without symbols")
		}
	case "fixed":
		size, ok := o["size"].(float64)
		if !ok || size < 0 || size != math.Trunc(size) || size > math.MaxInt32 {
			return errors.New("fixed without a valid size")
		}
		t.size = int(size)
	}
	return nil
}

// field returns the record's field called name, or nil.
func (t *avroType) field(name string) *avroField {
	for i := range t.fields {
		if t.fields[i].name == name {
			return &t.fields[i]
		}
	}
	return nil
}

// nonNull is the type a field has when it is not null: the one non-null
// branch of a union such as Connect's optional ["null", T] or, for an
// optional field with a default, [T, "null"].
func (t *avroType) nonNull() *avroType {
	if t.kind != "union" {
		return t
	}
	for _, b := range t.branches {
		if b.kind != "null" {
			return b
		}
	}
	return t
}

// connect returns the Connect schema an Avro schema was converted from, by
// the rules of Confluent's AvroData.fromConnectSchema: INT8 and INT16 are
// an Avro int with "connect.type"; logical names ride in "connect.name";
// Connect's Decimal, Date, Time and Timestamp also get Avro logical types.
func (t *avroType) connect() connectType {
	t = t.nonNull()
	c := connectType{Name: t.connectName, Params: t.connectParams}
	switch t.kind {
	case "int":
		c.Type = "int32"
		if t.connectType == "int8" || t.connectType == "int16" {
			c.Type = t.connectType
		}
	case "long":
		c.Type = "int64"
	case "float":
		c.Type = "float32"
	case "double":
		c.Type = "float64"
	case "boolean":
		c.Type = "boolean"
	case "string", "enum":
		c.Type = "string"
	case "bytes", "fixed":
		c.Type = "bytes"
	case "record":
		c.Type = "struct"
		if c.Name == "" {
			c.Name = t.fullName
		}
	default:
		c.Type = t.kind
	}
	if c.Name == "" {
		switch t.logicalType {
		case "decimal":
			c.Name = nameDecimal
		case "date":
			c.Name = nameConnectDate
		case "time-millis":
			c.Name = nameConnectTime
		case "timestamp-millis":
			c.Name = nameConnectTS
		}
	}
	if c.Name == nameDecimal && c.Params["scale"] == "" {
		params := map[string]string{"scale": fmt.Sprint(t.scale)}
		for k, v := range c.Params {
			params[k] = v
		}
		c.Params = params
	}
	return c
}

// recordValue is a decoded record: its type and its field values in order.
type recordValue struct {
	typ  *avroType
	vals []any
}

// get returns the value of the field called name, and whether there is one.
func (r *recordValue) get(name string) (any, bool) {
	for i, f := range r.typ.fields {
		if f.name == name {
			return r.vals[i], true
		}
	}
	return nil, false
}

// MarshalJSON writes the record as a JSON object in field order.
func (r *recordValue) MarshalJSON() ([]byte, error) {
	out := []byte{'{'}
	for i, f := range r.typ.fields {
		if i > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(f.name)
		v, err := json.Marshal(r.vals[i])
		if err != nil {
			return nil, err
		}
		out = append(append(append(out, k...), ':'), v...)
	}
	return append(out, '}'), nil
}

// errShort is a datum that ends early.
var errShort = errors.New("the Avro datum ends early")

// avroReader decodes Avro binary data.
type avroReader struct {
	b []byte
}

func (r *avroReader) long() (int64, error) {
	var u uint64
	for shift := uint(0); shift < 70; shift += 7 {
		if len(r.b) == 0 {
			return 0, errShort
		}
		c := r.b[0]
		r.b = r.b[1:]
		u |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return int64(u>>1) ^ -int64(u&1), nil
		}
	}
	return 0, errors.New("varint longer than 10 bytes")
}

func (r *avroReader) int() (int64, error) {
	n, err := r.long()
	if err == nil && (n < math.MinInt32 || n > math.MaxInt32) {
		err = fmt.Errorf("int %d out of range", n)
	}
	return n, err
}

func (r *avroReader) take(n int64) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("negative length %d", n)
	}
	if n > int64(len(r.b)) {
		return nil, errShort
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out, nil
}

// read decodes one datum of type t. Values: nil, bool, int64 (int, long,
// enum index as its symbol's string), float64, string, []byte (aliasing
// the input), *recordValue, []any, map[string]any.
func (r *avroReader) read(t *avroType, depth int) (any, error) {
	if depth > maxSchemaDepth {
		return nil, errors.New("datum nested too deeply")
	}
	switch t.kind {
	case "null":
		return nil, nil
	case "boolean":
		b, err := r.take(1)
		if err != nil {
			return nil, err
		}
		if b[0] > 1 {
			return nil, fmt.Errorf("boolean byte %d", b[0])
		}
		return b[0] == 1, nil
	case "int":
		return r.int()
	case "long":
		return r.long()
	case "float":
		b, err := r.take(4)
		if err != nil {
			return nil, err
		}
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), nil
	case "double":
		b, err := r.take(8)
		if err != nil {
			return nil, err
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
	case "bytes", "string":
		n, err := r.long()
		if err != nil {
			return nil, err
		}
		b, err := r.take(n)
		if err != nil {
			return nil, err
		}
		if t.kind == "string" {
			return string(b), nil
		}
		return b, nil
	case "fixed":
		return r.take(int64(t.size))
	case "enum":
		i, err := r.int()
		if err != nil {
			return nil, err
		}
		if i < 0 || i >= int64(len(t.symbols)) {
			return nil, fmt.Errorf("enum index %d of %d symbols", i, len(t.symbols))
		}
		return t.symbols[i], nil
	case "union":
		i, err := r.long()
		if err != nil {
			return nil, err
		}
		if i < 0 || i >= int64(len(t.branches)) {
			return nil, fmt.Errorf("union branch %d of %d", i, len(t.branches))
		}
		return r.read(t.branches[i], depth+1)
	case "record":
		rv := &recordValue{typ: t, vals: make([]any, len(t.fields))}
		for i, f := range t.fields {
			v, err := r.read(f.typ, depth+1)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.name, err)
			}
			rv.vals[i] = v
		}
		return rv, nil
	case "array", "map":
		var arr []any
		var m map[string]any
		if t.kind == "map" {
			m = map[string]any{}
		}
		for {
			n, err := r.long()
			if err != nil {
				return nil, err
			}
			if n == 0 {
				break
			}
			if n < 0 {
				// A negative count is followed by the block's size in
				// bytes, which a reader may use to skip it.
				if n == math.MinInt64 {
					return nil, errors.New("block count out of range")
				}
				n = -n
				if _, err := r.long(); err != nil {
					return nil, err
				}
			}
			if n > maxZeroSizeItems && zeroSize(t.items, 0) {
				// Items that take no bytes: the count alone could
				// keep the decoder busy for ever.
				return nil, fmt.Errorf("block of %d items that take no bytes", n)
			}
			for ; n > 0; n-- {
				// No preallocation from n: each item is decoded
				// from input that must be there.
				var key string
				if m != nil {
					k, err := r.read(&avroType{kind: "string"}, depth+1)
					if err != nil {
						return nil, err
					}
					key = k.(string)
				}
				v, err := r.read(t.items, depth+1)
				if err != nil {
					return nil, err
				}
				if m != nil {
					m[key] = v
				} else {
					arr = append(arr, v)
				}
			}
		}
		if m != nil {
			return m, nil
		}
		return arr, nil
	}
	return nil, fmt.Errorf("cannot decode Avro type %q", t.kind)
}

// maxZeroSizeItems bounds a block of items that take no bytes.
const maxZeroSizeItems = 1 << 16

// zeroSize reports whether a datum of t may take no bytes (null, an empty
// record), so that an array of them is not bounded by the input's length.
// Every other datum takes at least one byte: a union its branch index, a
// string or bytes its length.
func zeroSize(t *avroType, depth int) bool {
	if depth > maxSchemaDepth {
		return true
	}
	switch t.kind {
	case "null":
		return true
	case "fixed":
		return t.size == 0
	case "record":
		for _, f := range t.fields {
			if !zeroSize(f.typ, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}
