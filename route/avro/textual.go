package avro

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// This file turns plain JSON (an outbox payload) into Avro's JSON encoding,
// where a value of a union names its branch ({"long": 7}), by walking the
// JSON with the schema; goavro's codec then reads the Avro JSON. goavro's
// own reading of plain JSON ("standard JSON") is wrong for us: for a number
// in a union it tries the branches in alphabetical order, so
// ["null","long","double"] reads 7 as the double 7.0 and 9007199254740993 as
// 9007199254740992.0, silently. Here a union takes the first branch, in the
// schema's order, that holds the value exactly: an integer literal an int
// or a long it fits, else a float or double that represents it exactly; a
// literal with a fraction or an exponent a double (the value every JSON
// reader takes it for) or a float that represents that double exactly. A
// value no branch holds exactly is an error, never a rounded value.
//
// Leaves keep their JSON text as it was (an Avro bytes string is one code
// point per byte, which re-encoding would change), and a double that an
// integer literal cannot be exactly is refused outside unions too.

// node is a parsed Avro schema.
type node struct {
	kind    string // a primitive, "record", "enum", "array", "map", "fixed", "union"
	logical string
	name    string  // the full name of a named type
	fields  []field // record
	symbols []string
	items   *node // array items, map values
	members []*node
	branch  string // goavro's name of the node as a union member
}

type field struct {
	name  string
	gname string // goavro's name of it (see codecName)
	n     *node
	def   bool // has a default
}

var primitives = map[string]bool{"null": true, "boolean": true, "int": true, "long": true, "float": true, "double": true, "bytes": true, "string": true}

// goavroLogical are the primitive logical types goavro compiles, named
// "<type>.<logicalType>" as union members; it drops any other.
var goavroLogical = map[string]bool{"long.timestamp-millis": true, "long.timestamp-micros": true, "int.time-millis": true, "long.time-micros": true, "int.date": true, "bytes.decimal": true, "string.validated-string": true}

type schemaParser struct{ named map[string]*node }

// parseSchema parses an Avro schema's JSON text.
func parseSchema(text string) (*node, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	p := &schemaParser{named: map[string]*node{}}
	return p.parse(v, names{})
}

// names are the enclosing namespace as Avro has it and as goavro has it:
// goavro takes an explicit empty namespace ("namespace": "", which Avro's
// Schema.toString prints for a record of no namespace inside one of a
// namespace, as an expanded payload in an envelope) for none, and keeps the
// enclosing one; its union branches are named by its full names.
type names struct{ avro, goavro string }

// namespaceOf is the namespace of a full name.
func namespaceOf(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[:i]
	}
	return ""
}

func fullName(name, namespace string) string {
	if strings.Contains(name, ".") || namespace == "" {
		return name
	}
	return namespace + "." + name
}

func (p *schemaParser) parse(v any, ns names) (*node, error) {
	switch s := v.(type) {
	case string:
		if primitives[s] {
			return &node{kind: s, branch: s}, nil
		}
		if n := p.named[fullName(s, ns.avro)]; n != nil {
			return n, nil
		}
		if n := p.named[s]; n != nil {
			return n, nil
		}
		return nil, fmt.Errorf("unknown type %q", s)
	case []any:
		n := &node{kind: "union", branch: "union"}
		for _, m := range s {
			mn, err := p.parse(m, ns)
			if err != nil {
				return nil, err
			}
			n.members = append(n.members, mn)
		}
		return n, nil
	case map[string]any:
		return p.parseMap(s, ns)
	}
	return nil, fmt.Errorf("a schema is a string, an array or an object, not %T", v)
}

func (p *schemaParser) parseMap(m map[string]any, ns names) (*node, error) {
	t, ok := m["type"].(string)
	if !ok {
		// {"type": {...}} or {"type": [...]}: the inner schema.
		return p.parse(m["type"], ns)
	}
	lt, _ := m["logicalType"].(string)
	if lt == "decimal" && !validDecimal(m) {
		// Avro's legacy decimal (AvroData writes one when the scale is
		// negative or above the precision): plain bytes to Avro, and in
		// the codec (codecText).
		lt = ""
	}
	name, _ := m["name"].(string)
	if space, ok := m["namespace"].(string); ok && !strings.Contains(name, ".") {
		ns.avro = space
		if space != "" {
			ns.goavro = space
		}
	}
	switch t {
	case "record", "error", "enum", "fixed":
		full, gfull := fullName(name, ns.avro), fullName(name, ns.goavro)
		ns.avro, ns.goavro = namespaceOf(full), namespaceOf(gfull)
		n := &node{kind: t, logical: lt, name: full, branch: codecFullName(gfull)}
		if t == "error" {
			n.kind = "record"
		}
		p.named[full] = n
		switch t {
		case "enum":
			syms, _ := m["symbols"].([]any)
			for _, s := range syms {
				if str, ok := s.(string); ok {
					n.symbols = append(n.symbols, str)
				}
			}
		case "record", "error":
			fs, _ := m["fields"].([]any)
			for _, f := range fs {
				fm, ok := f.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("record %q: a field is not an object", full)
				}
				fname, _ := fm["name"].(string)
				fn, err := p.parse(fm["type"], ns)
				if err != nil {
					return nil, fmt.Errorf("record %q field %q: %w", full, fname, err)
				}
				_, def := fm["default"]
				n.fields = append(n.fields, field{name: fname, gname: codecName(fname), n: fn, def: def})
			}
		}
		return n, nil
	case "array", "map":
		key := "items"
		if t == "map" {
			key = "values"
		}
		in, err := p.parse(m[key], ns)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t, err)
		}
		return &node{kind: t, items: in, branch: t}, nil
	}
	if !primitives[t] {
		// A named type referred to as {"type": "Name"}.
		return p.parse(t, ns)
	}
	n := &node{kind: t, logical: lt, branch: t}
	if lt != "" && goavroLogical[t+"."+lt] {
		n.branch = t + "." + lt
		if t == "bytes" && lt == "decimal" && name != "" {
			n.branch = codecFullName(fullName(name, ns.goavro))
		}
	}
	return n, nil
}

// kindOf is the JSON kind of a value's text: '{', '[', '"', 't' (true or
// false), 'n' or '0' (a number).
func kindOf(raw []byte) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; c {
	case '{', '[', '"', 'n':
		return c
	case 't', 'f':
		return 't'
	}
	return '0'
}

// appendAvroText writes raw, plain JSON, as Avro's JSON encoding of n.
func appendAvroText(dst []byte, n *node, raw []byte) ([]byte, error) {
	switch n.kind {
	case "union":
		m, err := pick(n, raw)
		if err != nil {
			return dst, err
		}
		if m.kind == "null" {
			return append(dst, "null"...), nil
		}
		dst = append(dst, '{')
		dst = appendJSONString(dst, m.branch)
		dst = append(dst, ':')
		dst, err = appendAvroText(dst, m, raw)
		return append(dst, '}'), err
	case "record":
		if kindOf(raw) != '{' {
			return append(dst, raw...), nil // goavro says what is wrong
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return dst, err
		}
		dst = append(dst, '{')
		first := true
		known := make(map[string]bool, len(n.fields))
		for _, f := range n.fields {
			known[f.name] = true
			v, ok := obj[f.name]
			if !ok {
				continue // goavro takes the default or says it is missing
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = appendJSONString(dst, f.gname)
			dst = append(dst, ':')
			var err error
			if dst, err = appendAvroText(dst, f.n, v); err != nil {
				return dst, fmt.Errorf("field %q: %w", f.name, err)
			}
		}
		for k, v := range obj {
			if known[k] {
				continue
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			// Renamed as a field would be, so that an unknown key cannot
			// pass for a renamed field (goavro says it is unknown).
			dst = appendJSONString(dst, codecName(k))
			dst = append(dst, ':')
			dst = append(dst, v...)
		}
		return append(dst, '}'), nil
	case "array":
		if kindOf(raw) != '[' {
			return append(dst, raw...), nil
		}
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return dst, err
		}
		dst = append(dst, '[')
		for i, it := range items {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendAvroText(dst, n.items, it); err != nil {
				return dst, fmt.Errorf("item %d: %w", i, err)
			}
		}
		return append(dst, ']'), nil
	case "map":
		if kindOf(raw) != '{' {
			return append(dst, raw...), nil
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return dst, err
		}
		dst = append(dst, '{')
		first := true
		for k, v := range obj {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendAvroText(dst, n.items, v); err != nil {
				return dst, fmt.Errorf("key %q: %w", k, err)
			}
		}
		return append(dst, '}'), nil
	case "float", "double":
		if kindOf(raw) == '0' && !holds(n.kind, raw) {
			return dst, fmt.Errorf("the number %s cannot be a %s exactly", bytes.TrimSpace(raw), n.kind)
		}
	}
	return append(dst, bytes.TrimSpace(raw)...), nil
}

// pick is the union member raw goes into.
func pick(n *node, raw []byte) (*node, error) {
	k := kindOf(raw)
	var want []string
	switch k {
	case 'n':
		want = []string{"null"}
	case 't':
		want = []string{"boolean"}
	case '[':
		want = []string{"array"}
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		for _, m := range n.members {
			if m.kind == "string" {
				return m, nil
			}
		}
		for _, m := range n.members {
			if m.kind == "enum" && contains(m.symbols, s) {
				return m, nil
			}
		}
		want = []string{"bytes", "fixed"}
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, err
		}
		for _, m := range n.members {
			if m.kind == "record" && fits(m, obj) {
				return m, nil
			}
		}
		want = []string{"map", "record"} // the first record says what is missing
	case '0':
		text := bytes.TrimSpace(raw)
		integer := !bytes.ContainsAny(text, ".eE")
		if integer {
			for _, m := range n.members {
				if (m.kind == "int" || m.kind == "long") && holds(m.kind, text) {
					return m, nil
				}
			}
		}
		for _, m := range n.members {
			if (m.kind == "double" || m.kind == "float") && holds(m.kind, text) {
				return m, nil
			}
		}
		return nil, fmt.Errorf("no branch of the union %s holds the number %s exactly", members(n), text)
	}
	for _, m := range n.members {
		if contains(want, m.kind) {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no branch of the union %s takes %s", members(n), abbreviate(raw))
}

// fits: obj has every field of record m that has no default, and no key
// m lacks.
func fits(m *node, obj map[string]json.RawMessage) bool {
	seen := 0
	for _, f := range m.fields {
		if _, ok := obj[f.name]; ok {
			seen++
		} else if !f.def {
			return false
		}
	}
	return seen == len(obj)
}

// holds reports whether the Avro numeric type kind represents the JSON
// number text exactly (a fraction or exponent literal: as the double it
// denotes).
func holds(kind string, text []byte) bool {
	s := string(bytes.TrimSpace(text))
	integer := !strings.ContainsAny(s, ".eE")
	switch kind {
	case "int", "long":
		if !integer {
			return false
		}
		i, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return false
		}
		if kind == "int" {
			return i.IsInt64() && i.Int64() >= math.MinInt32 && i.Int64() <= math.MaxInt32
		}
		return i.IsInt64()
	}
	var f float64
	if integer {
		i, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return false
		}
		bf := new(big.Float).SetInt(i)
		var acc big.Accuracy
		f, acc = bf.Float64()
		if acc != big.Exact || math.IsInf(f, 0) {
			return false
		}
	} else {
		var err error
		if f, err = strconv.ParseFloat(s, 64); err != nil {
			return false // not a number, or out of a double's range
		}
	}
	if kind == "float" {
		return !math.IsInf(float64(float32(f)), 0) && float64(float32(f)) == f
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func members(n *node) string {
	names := make([]string, len(n.members))
	for i, m := range n.members {
		names[i] = m.branch
	}
	return "[" + strings.Join(names, ",") + "]"
}

func abbreviate(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 40 {
		return string(raw[:40]) + "…"
	}
	return string(raw)
}

func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// The codec goavro compiles is made from a copy of the schema's text
// (codecText) that changes nothing of the bytes written, only what goavro
// refuses where Avro's Java library does not:
//   - names: Avro 1.12 takes any letter (Character.isLetter: "prénom",
//     "Commande_été"), goavro ASCII ones only; each name part that goavro
//     would refuse is renamed (codecName), in the codec and in the JSON it
//     reads, and Avro's binary encoding does not carry names;
//   - a legacy decimal (scale negative or above the precision: AvroData's
//     fallback) loses its logicalType, which goavro refuses: plain bytes,
//     as Avro reads it;
//   - the default of a field whose union begins with a decimal (a string
//     of one character per byte, as AvroData writes it) is dropped: goavro
//     cannot read it there; the values written here never miss such a
//     field (derived schemas' fields are all written), and a given schema
//     with one keeps it.

// codecName is goavro's name for a name part: itself when goavro takes it,
// else "u_" and the hex of its UTF-8 bytes; a name that begins with "u_"
// is renamed too, so that no two names (or a JSON key and a renamed name)
// become one.
func codecName(part string) string {
	if asciiName(part) && !strings.HasPrefix(part, "u_") {
		return part
	}
	return "u_" + hex.EncodeToString([]byte(part))
}

// codecFullName is codecName of every part of a full name.
func codecFullName(full string) string {
	if asciiName(strings.ReplaceAll(full, ".", "_")) && !strings.HasPrefix(full, "u_") && !strings.Contains(full, ".u_") {
		return full
	}
	parts := strings.Split(full, ".")
	for i, p := range parts {
		if p != "" {
			parts[i] = codecName(p)
		}
	}
	return strings.Join(parts, ".")
}

// asciiName is goavro's (and Avro's, before 1.12) name rule.
func asciiName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// validDecimal reports whether a decimal's scale is in [0, precision], as
// Avro's LogicalTypes.decimal requires.
func validDecimal(m map[string]any) bool {
	num := func(key string) (int64, bool) {
		switch v := m[key].(type) {
		case json.Number:
			n, err := v.Int64()
			return n, err == nil
		case float64:
			return int64(v), true
		}
		return 0, false
	}
	precision, ok := num("precision")
	if !ok || precision < 1 {
		return false
	}
	scale, ok := num("scale")
	if !ok {
		scale = 0
	}
	return scale >= 0 && scale <= precision
}

// codecText is the text goavro compiles for a schema (see codecName).
func codecText(text string) (string, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", err
	}
	changed := false
	var walk func(v any) any
	walk = func(v any) any {
		switch s := v.(type) {
		case string:
			if !primitives[s] {
				if c := codecFullName(s); c != s {
					changed = true
					return c
				}
			}
			return s
		case []any:
			for i := range s {
				s[i] = walk(s[i])
			}
			return s
		case map[string]any:
			if lt, _ := s["logicalType"].(string); lt == "decimal" && !validDecimal(s) {
				delete(s, "logicalType")
				changed = true
			}
			for _, k := range []string{"name", "namespace"} {
				if n, ok := s[k].(string); ok && n != "" {
					if c := codecFullName(n); c != n {
						s[k] = c
						changed = true
					}
				}
			}
			if t, ok := s["type"]; ok {
				s["type"] = walk(t)
			}
			for _, k := range []string{"items", "values"} {
				if it, ok := s[k]; ok {
					s[k] = walk(it)
				}
			}
			if fs, ok := s["fields"].([]any); ok {
				for _, f := range fs {
					fm, ok := f.(map[string]any)
					if !ok {
						continue
					}
					if n, ok := fm["name"].(string); ok {
						if c := codecName(n); c != n {
							fm["name"] = c
							changed = true
						}
					}
					fm["type"] = walk(fm["type"])
					if _, ok := fm["default"]; ok && decimalFirst(fm["type"]) {
						delete(fm, "default")
						changed = true
					}
				}
			}
			return s
		}
		return v
	}
	v = walk(v)
	if !changed {
		return text, nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// decimalFirst reports whether a field's type is a union whose first
// member (which a default is of) is a decimal: goavro cannot read a
// default there (it takes one for a decimal field that is no union).
func decimalFirst(t any) bool {
	u, ok := t.([]any)
	if !ok || len(u) == 0 {
		return false
	}
	m, ok := u[0].(map[string]any)
	if !ok {
		return false
	}
	if inner, ok := m["type"].(map[string]any); ok {
		m = inner
	}
	lt, _ := m["logicalType"].(string)
	return lt == "decimal"
}
