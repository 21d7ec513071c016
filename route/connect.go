package route

import (
	"encoding/base64"
	"strconv"
)

// A small model of Kafka Connect's data API (Schema, Struct), enough to
// reproduce what the EventRouter builds and what the converters print.

type ctype uint8

const (
	tString ctype = iota
	tBytes
	tBool
	tInt8
	tInt16
	tInt32
	tInt64
	tFloat32
	tFloat64
	tStruct
	tArray
)

var ctypeNames = [...]string{"string", "bytes", "boolean", "int8", "int16", "int32", "int64", "float", "double", "struct", "array"}

// cschema is a Connect Schema.
type cschema struct {
	typ        ctype
	optional   bool
	hasName    bool
	name       string
	hasVersion bool
	version    int32
	doc        string
	params     [][2]string
	fields     []cfield // tStruct
	items      *cschema // tArray
}

type cfield struct {
	name   string
	schema *cschema
}

func (s *cschema) field(name string) int {
	for i := range s.fields {
		if s.fields[i].name == name {
			return i
		}
	}
	return -1
}

func (s *cschema) hasParam(name string) bool {
	for _, p := range s.params {
		if p[0] == name {
			return true
		}
	}
	return false
}

// equal is ConnectSchema.equals.
func (s *cschema) equal(o *cschema) bool {
	if s == o {
		return true
	}
	if s == nil || o == nil {
		return false
	}
	if s.typ != o.typ || s.optional != o.optional || s.hasName != o.hasName || s.name != o.name ||
		s.hasVersion != o.hasVersion || s.version != o.version || s.doc != o.doc || len(s.params) != len(o.params) ||
		len(s.fields) != len(o.fields) || !s.items.equal(o.items) {
		return false
	}
	for i := range s.params {
		if s.params[i] != o.params[i] {
			return false
		}
	}
	for i := range s.fields {
		if s.fields[i].name != o.fields[i].name || !s.fields[i].schema.equal(o.fields[i].schema) {
			return false
		}
	}
	return true
}

// dkind is the Java class of a Connect value.
type dkind uint8

const (
	dNull dkind = iota
	dStr
	dBytes
	dBool
	dI16
	dI32
	dI64
	dF32
	dF64
	dDec
	dVarDec // a VariableScaleDecimal Struct: dec, its trailing zeros stripped
	dStruct
	dList
)

// dval is a Connect value.
type dval struct {
	kind dkind
	b    []byte // dStr, dBytes
	i    int64  // dI16, dI32, dI64, dBool (0/1)
	f    float64
	dec  *decimal // dDec, dVarDec
	list []dval   // dStruct (in schema field order; unset fields are dNull), dList
}

// appendSchemaJSON writes a schema as JsonConverter.asJsonSchema does; with
// field set, the struct-field form that ends in "field":name.
func appendSchemaJSON(dst []byte, s *cschema, field string, isField bool) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, `{"type":"`...)
	dst = append(dst, ctypeNames[s.typ]...)
	dst = append(dst, '"')
	switch s.typ {
	case tStruct:
		dst = append(dst, `,"fields":[`...)
		for i, f := range s.fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSchemaJSON(dst, f.schema, f.name, true)
		}
		dst = append(dst, ']')
	case tArray:
		dst = append(dst, `,"items":`...)
		dst = appendSchemaJSON(dst, s.items, "", false)
	}
	dst = append(dst, `,"optional":`...)
	dst = strconv.AppendBool(dst, s.optional)
	if s.hasName {
		dst = append(dst, `,"name":`...)
		dst = appendJSONStr(dst, s.name)
	}
	if s.hasVersion {
		dst = append(dst, `,"version":`...)
		dst = strconv.AppendInt(dst, int64(s.version), 10)
	}
	if s.doc != "" {
		dst = append(dst, `,"doc":`...)
		dst = appendJSONStr(dst, s.doc)
	}
	if len(s.params) > 0 {
		dst = append(dst, `,"parameters":{`...)
		for i, p := range s.params {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONStr(dst, p[0])
			dst = append(dst, ':')
			dst = appendJSONStr(dst, p[1])
		}
		dst = append(dst, '}')
	}
	if isField {
		dst = append(dst, `,"field":`...)
		dst = appendJSONStr(dst, field)
	}
	return append(dst, '}')
}

// appendValueJSON writes v as JsonConverter.convertToJson does (without the
// schema envelope). The schema drives logical types (Decimal as base64).
func appendValueJSON(dst []byte, s *cschema, v *dval) []byte {
	switch v.kind {
	case dNull:
		return append(dst, "null"...)
	case dStr:
		return appendJSONString(dst, v.b)
	case dBytes:
		return appendBase64JSON(dst, v.b)
	case dBool:
		if v.i != 0 {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case dI16, dI32, dI64:
		return strconv.AppendInt(dst, v.i, 10)
	case dF32:
		return appendJSONDouble(dst, v.f, 32)
	case dF64:
		return appendJSONDouble(dst, v.f, 64)
	case dDec:
		if s != nil && s.hasName && s.name == decimalSchemaName {
			// decimal.format=BASE64, JsonConverter's default.
			return appendBase64JSON(dst, twosComplement(&v.dec.unscaled))
		}
		// A BigDecimal with no Decimal schema: Jackson writes it as a number.
		return appendJavaBigDecimal(dst, v.dec)
	case dVarDec:
		return appendVarDecimal(dst, v.dec, appendBase64JSON)
	case dStruct:
		dst = append(dst, '{')
		for i := range v.list {
			if i > 0 {
				dst = append(dst, ',')
			}
			var fs *cschema
			if s != nil && i < len(s.fields) {
				fs = s.fields[i].schema
				dst = appendJSONStr(dst, s.fields[i].name)
			}
			dst = append(dst, ':')
			dst = appendValueJSON(dst, fs, &v.list[i])
		}
		return append(dst, '}')
	case dList:
		dst = append(dst, '[')
		var is *cschema
		if s != nil {
			is = s.items
		}
		for i := range v.list {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValueJSON(dst, is, &v.list[i])
		}
		return append(dst, ']')
	}
	return dst
}

// appendEnvelopeJSON writes JsonConverter's schemas.enable=true form.
func appendEnvelopeJSON(dst []byte, s *cschema, v *dval) []byte {
	dst = append(dst, `{"schema":`...)
	dst = appendSchemaJSON(dst, s, "", false)
	dst = append(dst, `,"payload":`...)
	dst = appendValueJSON(dst, s, v)
	return append(dst, '}')
}

// appendValueString writes a scalar as Values.convertToString (Kafka
// Connect's SimpleHeaderConverter) prints it; bytes are base64 there. With
// rawBytes, bytes are written as they are (BinaryDataConverter), which is
// what the string key and value formats do.
func appendValueString(dst []byte, v *dval, rawBytes bool) []byte {
	switch v.kind {
	case dStr:
		return append(dst, v.b...)
	case dBytes:
		if rawBytes {
			return append(dst, v.b...)
		}
		return base64.StdEncoding.AppendEncode(dst, v.b)
	case dBool:
		return strconv.AppendBool(dst, v.i != 0)
	case dI16, dI32, dI64:
		return strconv.AppendInt(dst, v.i, 10)
	case dF32:
		return appendJavaDouble(dst, v.f, 32)
	case dF64:
		return appendJavaDouble(dst, v.f, 64)
	case dDec:
		return appendJavaBigDecimal(dst, v.dec)
	case dVarDec:
		// Values.append of a Struct: {"scale":1,"value":"fQ=="}, the same
		// text as JSON for these two fields.
		return appendVarDecimal(dst, v.dec, appendBase64JSON)
	case dStruct, dList:
		// Not reachable from a column; JSON is the closest readable form.
		return appendValueJSON(dst, nil, v)
	}
	return dst
}

// appendVarDecimal writes a VariableScaleDecimal Struct as JsonConverter
// does, {"scale":1,"value":"fQ=="}: the scale, then the unscaled value's
// bytes (BigInteger.toByteArray) written by bytesJSON.
func appendVarDecimal(dst []byte, d *decimal, bytesJSON func([]byte, []byte) []byte) []byte {
	dst = append(dst, `{"scale":`...)
	dst = strconv.AppendInt(dst, int64(d.scale), 10)
	dst = append(dst, `,"value":`...)
	dst = bytesJSON(dst, twosComplement(&d.unscaled))
	return append(dst, '}')
}
