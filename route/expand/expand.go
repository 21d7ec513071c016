// Package expand reproduces Debezium's table.expand.json.payload: Jackson's
// readTree of the payload text, then the schema inference and conversion of
// io.debezium.transforms.outbox.JsonSchemaData (toConnectSchema,
// toConnectData), with the same numbers, the same merging of array element
// schemas and the same failures, so that an expanded value equals
// Debezium's, and a payload Debezium leaves as a string is left too.
package expand

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

type jkind uint8

const (
	jNull jkind = iota
	jString
	jBool
	jInt    // Jackson IntNode
	jLong   // LongNode
	jBigInt // BigIntegerNode
	jDouble // DoubleNode
	jArray
	jObject
)

type jnode struct {
	kind jkind
	s    string // jString; the literal for numbers
	b    bool
	i    int64
	f    float64
	arr  []*jnode
	keys []string // jObject, unique keys in first-seen order
	vals []*jnode // jObject, the last value of each key (Jackson keeps the last)
}

func (n *jnode) get(k string) (*jnode, bool) {
	for i, kk := range n.keys {
		if kk == k {
			return n.vals[i], true
		}
	}
	return nil, false
}

// Jackson's default StreamReadConstraints.
const (
	maxJSONDepth     = 1000
	maxJSONNumberLen = 1000
)

type jparser struct {
	s     []byte
	i     int
	depth int
}

var errJSON = errors.New("not valid JSON")

// parseJSONTree parses the first JSON value of s as Jackson's
// ObjectMapper.readTree does; what follows it is ignored, as Jackson does
// with FAIL_ON_TRAILING_TOKENS off (its default).
func parseJSONTree(s []byte) (*jnode, error) {
	p := &jparser{s: s}
	p.ws()
	return p.value()
}

func (p *jparser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jparser) value() (*jnode, error) {
	if p.i >= len(p.s) {
		return nil, errJSON
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return &jnode{kind: jString, s: s}, nil
	case c == 't':
		return p.lit("true", &jnode{kind: jBool, b: true})
	case c == 'f':
		return p.lit("false", &jnode{kind: jBool})
	case c == 'n':
		return p.lit("null", &jnode{kind: jNull})
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return nil, errJSON
}

func (p *jparser) lit(w string, n *jnode) (*jnode, error) {
	if !strings.HasPrefix(string(p.s[p.i:min(len(p.s), p.i+len(w))]), w) {
		return nil, errJSON
	}
	p.i += len(w)
	return n, nil
}

func (p *jparser) enter() error {
	p.depth++
	if p.depth > maxJSONDepth {
		return fmt.Errorf("JSON nesting deeper than %d", maxJSONDepth)
	}
	return nil
}

func (p *jparser) object() (*jnode, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	p.i++
	n := &jnode{kind: jObject}
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		p.depth--
		return n, nil
	}
	for {
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, errJSON
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, errJSON
		}
		p.i++
		p.ws()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		replaced := false
		for j, kk := range n.keys {
			if kk == k {
				n.vals[j], replaced = v, true
				break
			}
		}
		if !replaced {
			n.keys = append(n.keys, k)
			n.vals = append(n.vals, v)
		}
		p.ws()
		if p.i >= len(p.s) {
			return nil, errJSON
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] == '}' {
			p.i++
			p.depth--
			return n, nil
		}
		return nil, errJSON
	}
}

func (p *jparser) array() (*jnode, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	p.i++
	n := &jnode{kind: jArray}
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		p.depth--
		return n, nil
	}
	for {
		p.ws()
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		n.arr = append(n.arr, v)
		p.ws()
		if p.i >= len(p.s) {
			return nil, errJSON
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] == ']' {
			p.i++
			p.depth--
			return n, nil
		}
		return nil, errJSON
	}
}

func (p *jparser) str() (string, error) {
	p.i++
	var b []byte
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			b = append(b, p.s[start:p.i]...)
			p.i++
			return string(b), nil
		case c < 0x20:
			return "", errJSON
		case c == '\\':
			b = append(b, p.s[start:p.i]...)
			if p.i+1 >= len(p.s) {
				return "", errJSON
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", errJSON
				}
				if utf16.IsSurrogate(r) {
					// A pair makes one character; a lone half cannot be
					// written as UTF-8 and becomes U+FFFD.
					if p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						r2, ok := p.hex4()
						if !ok {
							return "", errJSON
						}
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							r = d
						} else {
							p.i = save
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				}
				b = utf8.AppendRune(b, r)
			default:
				return "", errJSON
			}
			start = p.i
		default:
			p.i++
		}
	}
	return "", errJSON
}

func (p *jparser) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.s[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(v), true
}

func (p *jparser) number() (*jnode, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	intStart := p.i
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	nInt := p.i - intStart
	if nInt == 0 || nInt > 1 && p.s[intStart] == '0' {
		return nil, errJSON // no digits, or a leading zero
	}
	isFloat := false
	if p.i < len(p.s) && p.s[p.i] == '.' {
		isFloat = true
		p.i++
		d := p.i
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return nil, errJSON
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		isFloat = true
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		d := p.i
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		if p.i == d {
			return nil, errJSON
		}
	}
	lit := string(p.s[start:p.i])
	if len(lit) > maxJSONNumberLen {
		return nil, fmt.Errorf("JSON number longer than %d", maxJSONNumberLen)
	}
	if isFloat {
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, errJSON
		}
		return &jnode{kind: jDouble, f: f, s: lit}, nil
	}
	v, err := strconv.ParseInt(lit, 10, 64)
	switch {
	case err != nil:
		return &jnode{kind: jBigInt, s: lit}, nil
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return &jnode{kind: jInt, i: v, s: lit}, nil
	default:
		return &jnode{kind: jLong, i: v, s: lit}, nil
	}
}

// Expander holds the JsonSchemaData options.
type Expander struct {
	NullAsBytes       bool // table.json.payload.null.behavior=optional_bytes
	EmptyArrayAsArray bool // table.json.payload.empty.array.behavior=optional_string
}

var (
	optString  = &connect.Schema{Type: connect.TypeString, Optional: true}
	optBool    = &connect.Schema{Type: connect.TypeBool, Optional: true}
	optInt32   = &connect.Schema{Type: connect.TypeInt32, Optional: true}
	optInt64   = &connect.Schema{Type: connect.TypeInt64, Optional: true}
	optFloat64 = &connect.Schema{Type: connect.TypeFloat64, Optional: true}
	optBytes   = &connect.Schema{Type: connect.TypeBytes, Optional: true}
)

// inferError is a ConnectException thrown while inferring the schema; the
// EventRouter then keeps the payload as it was.
type inferError struct{ msg string }

func (e *inferError) Error() string { return e.msg }

// schemaOf is JsonSchemaData.toConnectSchema; key nil is Java's null.
func (x *Expander) schemaOf(key *string, n *jnode) (*connect.Schema, error) {
	switch n.kind {
	case jString:
		return optString, nil
	case jBool:
		return optBool, nil
	case jInt:
		return optInt32, nil
	case jLong:
		return optInt64, nil
	case jBigInt, jDouble:
		return optFloat64, nil
	case jArray:
		if len(n.arr) == 0 {
			if x.EmptyArrayAsArray {
				return &connect.Schema{Type: connect.TypeArray, Optional: true, Items: optString}, nil
			}
			return nil, nil
		}
		items, err := x.arraySchema(key, n)
		if err != nil {
			return nil, err
		}
		return &connect.Schema{Type: connect.TypeArray, Optional: true, Items: items}, nil
	case jObject:
		s := &connect.Schema{Type: connect.TypeStruct, Optional: true}
		if key != nil {
			s.HasName, s.Name = true, *key
		}
		for i, k := range n.keys {
			fk := k
			if key != nil && strings.TrimSpace(*key) != "" {
				fk = *key + "." + k
			}
			fs, err := x.schemaOf(&fk, n.vals[i])
			if err != nil {
				return nil, err
			}
			if fs != nil && s.FieldIndex(k) < 0 {
				s.Fields = append(s.Fields, connect.Field{Name: k, Schema: fs})
			}
		}
		return s, nil
	case jNull:
		if x.NullAsBytes {
			return optBytes, nil
		}
	}
	return nil, nil
}

func sameNodeType(a, b *jnode) bool {
	num := func(k jkind) bool { return k == jInt || k == jLong || k == jBigInt || k == jDouble }
	return a.kind == b.kind || num(a.kind) && num(b.kind)
}

// arraySchema is JsonSchemaData.toConnectSchemaWithCycles.
func (x *Expander) arraySchema(key *string, n *jnode) (*connect.Schema, error) {
	// getFirstArrayElement: the first non-null element, all of one JSON type,
	// numbers all of one Connect schema.
	var sample, refSchema *connect.Schema
	var ref *jnode
	for _, e := range n.arr {
		if e.kind == jNull {
			continue
		}
		if ref == nil {
			ref = e
		}
		if !sameNodeType(ref, e) {
			return nil, &inferError{"Field is not a homogenous array"}
		}
		if k := ref.kind; k == jInt || k == jLong || k == jBigInt || k == jDouble {
			if refSchema == nil {
				refSchema, _ = x.schemaOf(nil, ref)
			}
			if es, _ := x.schemaOf(nil, e); es != refSchema {
				return nil, &inferError{"Field is not a homogenous array, different number types"}
			}
		}
	}
	if ref != nil && ref.kind == jObject {
		// The distinct schemas of the object elements, merged. Debezium
		// iterates a HashSet whose order depends on the JVM run when the
		// elements differ; first-seen order is one of its possible outputs.
		var distinct []*connect.Schema
		for _, e := range n.arr {
			if e.kind != jObject {
				continue
			}
			s, err := x.schemaOf(key, e)
			if err != nil {
				return nil, err
			}
			dup := false
			for _, d := range distinct {
				if d.Equal(s) {
					dup = true
					break
				}
			}
			if !dup {
				distinct = append(distinct, s)
			}
		}
		for _, s := range distinct {
			sample = mergeSchema(sample, s)
		}
		return sample, nil
	}
	if ref == nil {
		ref = &jnode{kind: jNull}
	}
	s, err := x.schemaOf(nil, ref)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &inferError{"Array has unrecognized member schema"}
	}
	return s, nil
}

// mergeSchema is JsonSchemaData.mergeSchema; note that the merged schema
// is not optional (SchemaUtil.copySchemaBasics does not copy optionality).
func mergeSchema(left, right *connect.Schema) *connect.Schema {
	if left == nil {
		return right
	}
	fields := append([]connect.Field(nil), left.Fields...)
	for _, f := range right.Fields {
		i := -1
		for j := range fields {
			if fields[j].Name == f.Name {
				i = j
				break
			}
		}
		switch {
		case i < 0:
			fields = append(fields, f)
		case !fields[i].Schema.Equal(f.Schema) && fields[i].Schema.Type == connect.TypeBytes && f.Schema.Type != connect.TypeBytes:
			fields[i] = f
		}
	}
	return &connect.Schema{Type: connect.TypeStruct, HasName: left.HasName, Name: left.Name, HasVersion: left.HasVersion,
		Version: left.Version, Params: left.Params, Fields: fields}
}

// structOf is JsonSchemaData.jsonNodeToStructInternal followed by the
// validation Struct.put does.
func structOf(n *jnode, s *connect.Schema) (connect.Value, error) {
	if s == nil || s.Type != connect.TypeStruct {
		return connect.Value{}, errors.New("not a struct schema")
	}
	v := connect.Value{Kind: connect.KindStruct, List: make([]connect.Value, len(s.Fields))}
	for i, f := range s.Fields {
		c, ok := n.get(f.Name)
		if !ok {
			continue
		}
		fv, err := valueOf(c, f.Schema)
		if err != nil {
			return connect.Value{}, err
		}
		if err := validate(f.Schema, &fv); err != nil {
			return connect.Value{}, fmt.Errorf("field %q: %w", f.Name, err)
		}
		v.List[i] = fv
	}
	return v, nil
}

// valueOf is JsonSchemaData.getStructFieldValue.
func valueOf(n *jnode, s *connect.Schema) (connect.Value, error) {
	switch n.kind {
	case jString:
		return connect.Value{Kind: connect.KindStr, Bytes: []byte(n.s)}, nil
	case jBool:
		if n.b {
			return connect.Value{Kind: connect.KindBool, Int: 1}, nil
		}
		return connect.Value{Kind: connect.KindBool}, nil
	case jDouble:
		return connect.Value{Kind: connect.KindF64, Float: n.f}, nil
	case jInt:
		return connect.Value{Kind: connect.KindI32, Int: n.i}, nil
	case jLong:
		return connect.Value{Kind: connect.KindI64, Int: n.i}, nil
	case jBigInt:
		d, _ := connect.ParseDecimal([]byte(n.s))
		return connect.Value{Kind: connect.KindDec, Dec: d}, nil
	case jArray:
		var items *connect.Schema
		if s != nil && s.Type == connect.TypeArray {
			items = s.Items
		}
		out := connect.Value{Kind: connect.KindList, List: make([]connect.Value, len(n.arr))}
		for i, e := range n.arr {
			ev, err := valueOf(e, items)
			if err != nil {
				return connect.Value{}, err
			}
			out.List[i] = ev
		}
		return out, nil
	case jObject:
		return structOf(n, s)
	}
	return connect.Value{Kind: connect.KindNull}, nil
}

// javaClassOf is the value class ConnectSchema.validateValue expects.
var javaClassOf = [...]connect.Kind{connect.TypeString: connect.KindStr, connect.TypeBytes: connect.KindBytes, connect.TypeBool: connect.KindBool, connect.TypeInt8: connect.KindI16, connect.TypeInt16: connect.KindI16, connect.TypeInt32: connect.KindI32,
	connect.TypeInt64: connect.KindI64, connect.TypeFloat32: connect.KindF32, connect.TypeFloat64: connect.KindF64, connect.TypeStruct: connect.KindStruct, connect.TypeArray: connect.KindList}

// validate is ConnectSchema.validateValue.
func validate(s *connect.Schema, v *connect.Value) error {
	if v.Kind == connect.KindNull {
		if s == nil || !s.Optional {
			return errors.New("null value for a required field")
		}
		return nil
	}
	if s == nil {
		return errors.New("no schema")
	}
	if v.Kind != javaClassOf[s.Type] {
		return fmt.Errorf("invalid Java object for schema type %s", strings.ToUpper(s.Type.String()))
	}
	if s.Type == connect.TypeArray {
		for i := range v.List {
			if err := validate(s.Items, &v.List[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Result is what EventRouterDelegate's expansion leaves behind.
type Result uint8

const (
	Kept   Result = iota // parse or inference failed: payload and schema unchanged
	Done                 // payload is the struct, schema its schema
	Broken               // schema replaced (maybe by null), payload still the string
)

// Expand runs the EventRouter's expansion of a string payload.
func (x *Expander) Expand(payload []byte, field string) (Result, *connect.Schema, connect.Value) {
	if len(payload) == 0 || payload[0] != '{' && payload[0] != '[' {
		return Kept, nil, connect.Value{}
	}
	n, err := parseJSONTree(payload)
	if err != nil {
		return Kept, nil, connect.Value{}
	}
	s, err := x.schemaOf(&field, n)
	if err != nil {
		return Kept, nil, connect.Value{}
	}
	v, err := structOf(n, s)
	if err != nil {
		return Broken, s, connect.Value{}
	}
	return Done, s, v
}
