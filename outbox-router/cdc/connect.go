package cdc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/route"
)

// connectType is a Kafka Connect schema as far as a column needs it: the
// Connect type ("int64", "string", "bytes", "struct", ...), the logical
// (semantic) name Debezium gives it, and its parameters. The JSON converter
// carries these as "type"/"name"/"parameters"; Confluent's AvroConverter as
// the Avro type plus "connect.type", "connect.name" and "connect.parameters".
type connectType struct {
	Type   string
	Name   string
	Params map[string]string
}

// Debezium's and Kafka Connect's logical names for the PostgreSQL types an
// outbox column may have (Debezium's PostgreSQL connector documentation,
// "How Debezium PostgreSQL connectors map data types"; the defaults
// time.precision.mode=adaptive, decimal.handling.mode=precise,
// binary.handling.mode=bytes, and time.precision.mode=connect for the
// org.apache.kafka.connect.data ones).
const (
	nameJSON            = "io.debezium.data.Json"
	nameUUID            = "io.debezium.data.Uuid"
	nameXML             = "io.debezium.data.Xml"
	nameZonedTimestamp  = "io.debezium.time.ZonedTimestamp"
	nameMicroTimestamp  = "io.debezium.time.MicroTimestamp"
	nameMilliTimestamp  = "io.debezium.time.Timestamp"
	nameNanoTimestamp   = "io.debezium.time.NanoTimestamp"
	nameDate            = "io.debezium.time.Date"
	nameMicroTime       = "io.debezium.time.MicroTime"
	nameMilliTime       = "io.debezium.time.Time"
	nameNanoTime        = "io.debezium.time.NanoTime"
	nameVarScaleDecimal = "io.debezium.data.VariableScaleDecimal"
	nameDecimal         = "org.apache.kafka.connect.data.Decimal"
	nameConnectTime     = "org.apache.kafka.connect.data.Time"
	nameConnectDate     = "org.apache.kafka.connect.data.Date"
	nameConnectTS       = "org.apache.kafka.connect.data.Timestamp"
)

// oidOf is the PostgreSQL type a Connect schema stands for, so that the
// router treats the column as it treats the same column read from pgoutput.
// Types the router has no special handling for are text.
func oidOf(t connectType) uint32 {
	switch t.Name {
	case nameJSON:
		return route.OIDJSONB
	case nameUUID:
		return route.OIDUUID
	case nameXML:
		return route.OIDXML
	case nameZonedTimestamp:
		return route.OIDTimestamptz
	case nameMicroTimestamp, nameMilliTimestamp, nameNanoTimestamp, nameConnectTS:
		return route.OIDTimestamp
	case nameDate, nameConnectDate:
		return route.OIDDate
	case nameMicroTime, nameMilliTime, nameNanoTime, nameConnectTime:
		return route.OIDTime
	case nameDecimal, nameVarScaleDecimal:
		return route.OIDNumeric
	}
	if t.Name != "" && t.Type != "bytes" {
		// Another logical type (io.debezium.data.Enum, ZonedTime,
		// MicroDuration, Bits, geometry, ...): pgoutput would give the
		// router the column's text; say text.
		return route.OIDText
	}
	switch t.Type {
	case "int8", "int16":
		return route.OIDInt2
	case "int32":
		return route.OIDInt4
	case "int64":
		return route.OIDInt8
	case "float32":
		return route.OIDFloat4
	case "float64":
		return route.OIDFloat8
	case "boolean":
		return route.OIDBool
	case "bytes":
		return route.OIDBytea
	}
	return route.OIDText
}

// typeMod is the PostgreSQL type modifier Debezium's schema tells of a
// numeric column, so that the router gives the column the same schema: a
// VariableScaleDecimal is an unconstrained numeric; a Decimal with
// connect.decimal.precision (Debezium adds it for numeric(p,s)) is
// numeric(p,s). A Decimal without precision (another producer) leaves the
// declaration unknown.
func typeMod(t connectType) (int32, bool) {
	switch t.Name {
	case nameVarScaleDecimal:
		return route.NoTypeMod, true
	case nameDecimal:
		p, err1 := strconv.Atoi(t.Params["connect.decimal.precision"])
		s, err2 := strconv.Atoi(t.Params["scale"])
		// PostgreSQL's bounds: precision 1 to 1000, scale -1000 to 1000.
		if err1 != nil || err2 != nil || p < 1 || p > maxScale || checkScale(s) != nil {
			return 0, false
		}
		return route.NumericTypeMod(p, s), true
	}
	return 0, false
}

// decimalValue is a Connect Decimal or VariableScaleDecimal: the unscaled
// value and the scale.
type decimalValue struct {
	unscaled *big.Int
	scale    int
}

// rawJSON is a value kept as its JSON text (a struct, array or map the
// router has no type for).
type rawJSON []byte

// column turns one decoded Connect value into a route.Column with the value
// in PostgreSQL's text output format, which is what the router reads (and
// what pgoutput would have given it for the same row). v is nil, bool,
// int64, float64, string, []byte, decimalValue or rawJSON.
func column(name string, t connectType, v any) (route.Column, error) {
	c := route.Column{Name: name, Type: oidOf(t)}
	c.TypeMod, c.HasTypeMod = typeMod(t)
	if v == nil {
		c.Null = true
		return c, nil
	}
	bad := func() (route.Column, error) {
		return route.Column{}, fmt.Errorf("column %q: a %T value does not fit its schema (type %s, name %q)", name, v, t.Type, t.Name)
	}
	switch c.Type {
	case route.OIDTimestamp:
		n, ok := v.(int64)
		if !ok {
			return bad()
		}
		var ts time.Time
		switch t.Name {
		case nameMicroTimestamp:
			ts = time.UnixMicro(n)
		case nameNanoTimestamp:
			ts = time.Unix(0, n)
		default:
			ts = time.UnixMilli(n)
		}
		c.Value = ts.UTC().AppendFormat(nil, "2006-01-02 15:04:05.999999")
		return c, nil
	case route.OIDTimestamptz:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			// Not an instant Go can read (PostgreSQL's infinity, a year
			// past 9999): keep Debezium's text; the router treats it as text.
			c.Type, c.Value = route.OIDText, []byte(s)
			return c, nil
		}
		c.Value = append(ts.UTC().AppendFormat(nil, "2006-01-02 15:04:05.999999"), "+00"...)
		return c, nil
	case route.OIDDate:
		n, ok := v.(int64)
		if !ok {
			return bad()
		}
		c.Value = time.Unix(n*86400, 0).UTC().AppendFormat(nil, "2006-01-02")
		return c, nil
	case route.OIDTime:
		n, ok := v.(int64)
		if !ok {
			return bad()
		}
		switch t.Name {
		case nameMicroTime:
		case nameNanoTime:
			n /= 1000
		default:
			n *= 1000
		}
		c.Value = appendClock(nil, n)
		return c, nil
	case route.OIDNumeric:
		d, ok := v.(decimalValue)
		if !ok {
			return bad()
		}
		c.Value = appendDecimal(nil, d)
		return c, nil
	}
	switch x := v.(type) {
	case bool:
		if c.Type != route.OIDBool {
			return bad()
		}
		c.Value = []byte{'f'}
		if x {
			c.Value[0] = 't'
		}
	case int64:
		switch c.Type {
		case route.OIDInt2, route.OIDInt4, route.OIDInt8, route.OIDText:
		default:
			return bad()
		}
		c.Value = strconv.AppendInt(nil, x, 10)
	case float64:
		bits := 64
		switch c.Type {
		case route.OIDFloat4:
			bits = 32
		case route.OIDFloat8, route.OIDText:
		default:
			return bad()
		}
		c.Value = appendFloat(nil, x, bits)
	case string:
		switch c.Type {
		case route.OIDText, route.OIDJSONB, route.OIDUUID, route.OIDXML:
		default:
			return bad()
		}
		c.Value = []byte(x)
	case []byte:
		if c.Type != route.OIDBytea {
			return bad()
		}
		c.Value = make([]byte, 2+hex.EncodedLen(len(x)))
		c.Value[0], c.Value[1] = '\\', 'x'
		hex.Encode(c.Value[2:], x)
	case rawJSON:
		c.Type, c.Value = route.OIDText, append([]byte(nil), x...)
	default:
		return bad()
	}
	return c, nil
}

// appendClock writes microseconds since midnight as PostgreSQL's time
// output, HH:MM:SS[.ffffff] (24:00:00 is a valid time).
func appendClock(dst []byte, us int64) []byte {
	if us < 0 {
		us = 0
	}
	sec, frac := us/1e6, us%1e6
	dst = fmt.Appendf(dst, "%02d:%02d:%02d", sec/3600, sec/60%60, sec%60)
	if frac != 0 {
		f := fmt.Appendf(nil, ".%06d", frac)
		for f[len(f)-1] == '0' {
			f = f[:len(f)-1]
		}
		dst = append(dst, f...)
	}
	return dst
}

// appendFloat writes a float as PostgreSQL prints float4/float8 (shortest
// text that reads back exactly; Infinity, -Infinity, NaN).
func appendFloat(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bits)
}

// appendDecimal writes unscaled × 10^-scale as numeric text.
func appendDecimal(dst []byte, d decimalValue) []byte {
	s := d.unscaled.String()
	neg := s[0] == '-'
	if neg {
		s = s[1:]
		dst = append(dst, '-')
	}
	if d.scale <= 0 {
		dst = append(dst, s...)
		for i := 0; i < -d.scale; i++ {
			dst = append(dst, '0')
		}
		return dst
	}
	for len(s) <= d.scale {
		s = "0" + s
	}
	dst = append(dst, s[:len(s)-d.scale]...)
	dst = append(dst, '.')
	return append(dst, s[len(s)-d.scale:]...)
}

// unscaledFromBytes reads Connect's Decimal bytes: the unscaled value,
// big-endian two's complement.
func unscaledFromBytes(b []byte) *big.Int {
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(len(b))*8))
	}
	return n
}

// maxScale bounds a decimal's scale (PostgreSQL allows -1000 to 1000), so
// that a hostile schema or event cannot make the decoder write or compute
// numbers of millions of digits.
const maxScale = 1000

func checkScale(scale int) error {
	if scale < -maxScale || scale > maxScale {
		return fmt.Errorf("decimal scale %d out of range [-%d, %d]", scale, maxScale, maxScale)
	}
	return nil
}

// scaleParam is the "scale" parameter of a Decimal schema.
func scaleParam(t connectType) (int, error) {
	s, ok := t.Params["scale"]
	if !ok {
		return 0, fmt.Errorf("%s schema without a scale parameter", t.Name)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s schema: scale %q: %w", t.Name, s, err)
	}
	return n, checkScale(n)
}

// jsonColumn decodes one "after" field written by Kafka Connect's
// JsonConverter (schemas enabled) with its schema: integers and floats as
// JSON numbers, bytes as base64, Decimal as base64 of the unscaled bytes
// (decimal.format=BASE64, the default) or a number (NUMERIC), structs as
// objects.
func jsonColumn(name string, t connectType, raw json.RawMessage) (route.Column, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return column(name, t, nil)
	}
	var v any
	var err error
	switch t.Type {
	case "int8", "int16", "int32", "int64":
		var n int64
		n, err = strconv.ParseInt(string(raw), 10, 64)
		v = n
	case "float32", "float64":
		var f float64
		f, err = strconv.ParseFloat(string(raw), 64)
		v = f
	case "boolean":
		var b bool
		err = json.Unmarshal(raw, &b)
		v = b
	case "string":
		var s string
		err = json.Unmarshal(raw, &s)
		v = s
	case "bytes":
		if t.Name == nameDecimal {
			v, err = jsonDecimal(t, raw)
			break
		}
		var b []byte // encoding/json reads base64 into []byte
		err = json.Unmarshal(raw, &b)
		v = b
	case "struct":
		if t.Name == nameVarScaleDecimal {
			var s struct {
				Scale *int   `json:"scale"`
				Value []byte `json:"value"`
			}
			err = json.Unmarshal(raw, &s)
			if err == nil && s.Scale == nil {
				err = fmt.Errorf("%s without a scale", nameVarScaleDecimal)
			}
			if err == nil {
				err = checkScale(*s.Scale)
			}
			if err == nil {
				v = decimalValue{unscaled: unscaledFromBytes(s.Value), scale: *s.Scale}
			}
			break
		}
		v = rawJSON(raw)
	default:
		v = rawJSON(raw)
	}
	if err != nil {
		return route.Column{}, fmt.Errorf("column %q (%s): %w", name, t.Type, err)
	}
	return column(name, t, v)
}

func jsonDecimal(t connectType, raw json.RawMessage) (any, error) {
	scale, err := scaleParam(t)
	if err != nil {
		return nil, err
	}
	if raw[0] == '"' {
		var b []byte
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		return decimalValue{unscaled: unscaledFromBytes(b), scale: scale}, nil
	}
	// decimal.format=NUMERIC: the number as JSON; rescale it exactly. An
	// exponent is bounded first: big.Rat would expand 1e999999999.
	if i := bytes.IndexAny(raw, "eE"); i >= 0 {
		if e, err := strconv.Atoi(strings.TrimPrefix(string(raw[i+1:]), "+")); err != nil || e < -2*maxScale || e > 2*maxScale {
			return nil, fmt.Errorf("decimal %q: exponent out of range", raw)
		}
	}
	r, ok := new(big.Rat).SetString(string(raw))
	if !ok {
		return nil, fmt.Errorf("%q is not a decimal number", raw)
	}
	return ratDecimal(r, scale)
}

// ratDecimal turns an exact rational with at most scale decimals into a
// decimalValue.
func ratDecimal(r *big.Rat, scale int) (decimalValue, error) {
	pow := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(scale))), nil))
	if scale < 0 {
		pow.Inv(pow)
	}
	m := new(big.Rat).Mul(r, pow)
	if !m.IsInt() {
		return decimalValue{}, fmt.Errorf("%s has more than %d decimals", r.FloatString(scale+4), scale)
	}
	return decimalValue{unscaled: new(big.Int).Set(m.Num()), scale: scale}, nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
