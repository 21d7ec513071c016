// Package connect is a small model of Kafka Connect's data API (Schema,
// Struct, the Java class of each value) and its JsonConverter's output, byte
// for byte: JSON as Jackson writes it, numbers as Java's toString methods
// print them, decimals as BigDecimal does. It is enough to reproduce what
// Debezium's EventRouter builds and what the converters print, so that a
// record of ours equals Debezium's; route builds the values, this package
// writes them.
package connect

import (
	"encoding/base64"
	"strconv"
)

// A small model of Kafka Connect's data API (Schema, Struct), enough to
// reproduce what the EventRouter builds and what the converters print.

type Type uint8

const (
	TypeString Type = iota
	TypeBytes
	TypeBool
	TypeInt8
	TypeInt16
	TypeInt32
	TypeInt64
	TypeFloat32
	TypeFloat64
	TypeStruct
	TypeArray
)

var ctypeNames = [...]string{"string", "bytes", "boolean", "int8", "int16", "int32", "int64", "float", "double", "struct", "array"}

// DecimalSchemaName names Kafka Connect's Decimal logical type: bytes
// holding the unscaled value, its scale a schema parameter.
const DecimalSchemaName = "org.apache.kafka.connect.data.Decimal"

// DecimalPrecisionParam is the Decimal schema parameter Debezium adds for a
// declared precision (and Confluent's AvroData reads).
const DecimalPrecisionParam = "connect.decimal.precision"

// String is the type's name in a JSON schema (Schema.Type.getName()).
func (t Type) String() string { return ctypeNames[t] }

// Schema is a Connect Schema.
type Schema struct {
	Type       Type
	Optional   bool
	HasName    bool
	Name       string
	HasVersion bool
	Version    int32
	Doc        string
	Params     [][2]string
	Fields     []Field // TypeStruct
	Items      *Schema // TypeArray
	// Default is the schema's default value (Debezium's, from the
	// column's default expression), nil for none.
	Default *Value
}

type Field struct {
	Name   string
	Schema *Schema
}

func (s *Schema) FieldIndex(name string) int {
	for i := range s.Fields {
		if s.Fields[i].Name == name {
			return i
		}
	}
	return -1
}

func (s *Schema) HasParam(name string) bool {
	for _, p := range s.Params {
		if p[0] == name {
			return true
		}
	}
	return false
}

// Equal is ConnectSchema.equals.
func (s *Schema) Equal(o *Schema) bool {
	if s == o {
		return true
	}
	if s == nil || o == nil {
		return false
	}
	if s.Type != o.Type || s.Optional != o.Optional || s.HasName != o.HasName || s.Name != o.Name ||
		s.HasVersion != o.HasVersion || s.Version != o.Version || s.Doc != o.Doc || len(s.Params) != len(o.Params) ||
		len(s.Fields) != len(o.Fields) || !s.Items.Equal(o.Items) || (s.Default == nil) != (o.Default == nil) ||
		s.Default != nil && !s.Default.Equal(o.Default) {
		return false
	}
	for i := range s.Params {
		if s.Params[i] != o.Params[i] {
			return false
		}
	}
	for i := range s.Fields {
		if s.Fields[i].Name != o.Fields[i].Name || !s.Fields[i].Schema.Equal(o.Fields[i].Schema) {
			return false
		}
	}
	return true
}

// Equal is Object.equals of the two values (a BigDecimal's scale counts).
func (v *Value) Equal(o *Value) bool {
	if v.Kind != o.Kind || string(v.Bytes) != string(o.Bytes) || v.Int != o.Int || v.Float != o.Float || len(v.List) != len(o.List) {
		return false
	}
	if (v.Dec == nil) != (o.Dec == nil) || v.Dec != nil && (v.Dec.Scale != o.Dec.Scale || v.Dec.Unscaled.Cmp(&o.Dec.Unscaled) != 0) {
		return false
	}
	for i := range v.List {
		if !v.List[i].Equal(&o.List[i]) {
			return false
		}
	}
	return true
}

// Kind is the Java class of a Connect value.
type Kind uint8

const (
	KindNull Kind = iota
	KindStr
	KindBytes
	KindBool
	KindI16
	KindI32
	KindI64
	KindF32
	KindF64
	KindDec
	KindVarDec // a VariableScaleDecimal Struct: dec, its trailing zeros stripped
	KindStruct
	KindList
)

// Value is a Connect value.
type Value struct {
	Kind  Kind
	Bytes []byte // KindStr, KindBytes
	Int   int64  // KindI16, KindI32, KindI64, KindBool (0/1)
	Float float64
	Dec   *Decimal // KindDec, KindVarDec
	List  []Value  // KindStruct (in schema field order; unset fields are KindNull), KindList
}

// AppendSchemaJSON writes a schema as JsonConverter.asJsonSchema does; with
// field set, the struct-field form that ends in "field":name.
func AppendSchemaJSON(dst []byte, s *Schema, field string, isField bool) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, `{"type":"`...)
	dst = append(dst, ctypeNames[s.Type]...)
	dst = append(dst, '"')
	switch s.Type {
	case TypeStruct:
		dst = append(dst, `,"fields":[`...)
		for i, f := range s.Fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendSchemaJSON(dst, f.Schema, f.Name, true)
		}
		dst = append(dst, ']')
	case TypeArray:
		dst = append(dst, `,"items":`...)
		dst = AppendSchemaJSON(dst, s.Items, "", false)
	}
	dst = append(dst, `,"optional":`...)
	dst = strconv.AppendBool(dst, s.Optional)
	if s.HasName {
		dst = append(dst, `,"name":`...)
		dst = AppendJSONStr(dst, s.Name)
	}
	if s.HasVersion {
		dst = append(dst, `,"version":`...)
		dst = strconv.AppendInt(dst, int64(s.Version), 10)
	}
	if s.Doc != "" {
		dst = append(dst, `,"doc":`...)
		dst = AppendJSONStr(dst, s.Doc)
	}
	if len(s.Params) > 0 {
		dst = append(dst, `,"parameters":{`...)
		for i, p := range s.Params {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendJSONStr(dst, p[0])
			dst = append(dst, ':')
			dst = AppendJSONStr(dst, p[1])
		}
		dst = append(dst, '}')
	}
	if s.Default != nil {
		// After the parameters, as JsonConverter.asJsonSchema puts it.
		dst = append(dst, `,"default":`...)
		dst = AppendValueJSON(dst, s, s.Default)
	}
	if isField {
		dst = append(dst, `,"field":`...)
		dst = AppendJSONStr(dst, field)
	}
	return append(dst, '}')
}

// AppendValueJSON writes v as JsonConverter.convertToJson does (without the
// schema envelope). The schema drives logical types (Decimal as base64).
func AppendValueJSON(dst []byte, s *Schema, v *Value) []byte {
	switch v.Kind {
	case KindNull:
		if s != nil && s.Default != nil {
			// JsonConverter's replace.null.with.default (default true),
			// and Struct.get, which gives a field's default for null.
			return AppendValueJSON(dst, s, s.Default)
		}
		return append(dst, "null"...)
	case KindStr:
		return AppendJSONString(dst, v.Bytes)
	case KindBytes:
		return AppendBase64JSON(dst, v.Bytes)
	case KindBool:
		if v.Int != 0 {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case KindI16, KindI32, KindI64:
		return strconv.AppendInt(dst, v.Int, 10)
	case KindF32:
		return AppendJSONDouble(dst, v.Float, 32)
	case KindF64:
		return AppendJSONDouble(dst, v.Float, 64)
	case KindDec:
		if s != nil && s.HasName && s.Name == DecimalSchemaName {
			// decimal.format=BASE64, JsonConverter's default.
			return AppendBase64JSON(dst, TwosComplement(&v.Dec.Unscaled))
		}
		// A BigDecimal with no Decimal schema: Jackson writes it as a number.
		return AppendJavaBigDecimal(dst, v.Dec)
	case KindVarDec:
		return AppendVarDecimal(dst, v.Dec, AppendBase64JSON)
	case KindStruct:
		dst = append(dst, '{')
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			var fs *Schema
			if s != nil && i < len(s.Fields) {
				fs = s.Fields[i].Schema
				dst = AppendJSONStr(dst, s.Fields[i].Name)
			}
			dst = append(dst, ':')
			dst = AppendValueJSON(dst, fs, &v.List[i])
		}
		return append(dst, '}')
	case KindList:
		dst = append(dst, '[')
		var is *Schema
		if s != nil {
			is = s.Items
		}
		for i := range v.List {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendValueJSON(dst, is, &v.List[i])
		}
		return append(dst, ']')
	}
	return dst
}

// AppendEnvelopeJSON writes JsonConverter's schemas.enable=true form.
func AppendEnvelopeJSON(dst []byte, s *Schema, v *Value) []byte {
	dst = append(dst, `{"schema":`...)
	dst = AppendSchemaJSON(dst, s, "", false)
	dst = append(dst, `,"payload":`...)
	dst = AppendValueJSON(dst, s, v)
	return append(dst, '}')
}

// AppendValueString writes a scalar as Values.convertToString (Kafka
// Connect's SimpleHeaderConverter) prints it; bytes are base64 there. With
// rawBytes, bytes are written as they are (BinaryDataConverter), which is
// what the string key and value formats do.
func AppendValueString(dst []byte, v *Value, rawBytes bool) []byte {
	switch v.Kind {
	case KindStr:
		return append(dst, v.Bytes...)
	case KindBytes:
		if rawBytes {
			return append(dst, v.Bytes...)
		}
		return base64.StdEncoding.AppendEncode(dst, v.Bytes)
	case KindBool:
		return strconv.AppendBool(dst, v.Int != 0)
	case KindI16, KindI32, KindI64:
		return strconv.AppendInt(dst, v.Int, 10)
	case KindF32:
		return AppendJavaDouble(dst, v.Float, 32)
	case KindF64:
		return AppendJavaDouble(dst, v.Float, 64)
	case KindDec:
		return AppendJavaBigDecimal(dst, v.Dec)
	case KindVarDec:
		// Values.append of a Struct: {"scale":1,"value":"fQ=="}, the same
		// text as JSON for these two fields.
		return AppendVarDecimal(dst, v.Dec, AppendBase64JSON)
	case KindStruct, KindList:
		// Not reachable from a column; JSON is the closest readable form.
		return AppendValueJSON(dst, nil, v)
	}
	return dst
}

// AppendVarDecimal writes a VariableScaleDecimal Struct as JsonConverter
// does, {"scale":1,"value":"fQ=="}: the scale, then the unscaled value's
// bytes (BigInteger.toByteArray) written by bytesJSON.
func AppendVarDecimal(dst []byte, d *Decimal, bytesJSON func([]byte, []byte) []byte) []byte {
	dst = append(dst, `{"scale":`...)
	dst = strconv.AppendInt(dst, int64(d.Scale), 10)
	dst = append(dst, `,"value":`...)
	dst = bytesJSON(dst, TwosComplement(&d.Unscaled))
	return append(dst, '}')
}
