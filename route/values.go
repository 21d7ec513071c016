package route

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

// Debezium's logical schema names (io.debezium.data.*, io.debezium.time.*)
// for the PostgreSQL types an outbox column may have, as the PostgreSQL
// connector maps them with its defaults (time.precision.mode=adaptive,
// decimal.handling.mode=precise, binary.handling.mode=bytes).
const (
	jsonSchemaName       = "io.debezium.data.Json"
	uuidSchemaName       = "io.debezium.data.Uuid"
	xmlSchemaName        = "io.debezium.data.Xml"
	microTimestampName   = "io.debezium.time.MicroTimestamp"
	zonedTimestampName   = "io.debezium.time.ZonedTimestamp"
	dateSchemaName       = "io.debezium.time.Date"
	microTimeSchemaName  = "io.debezium.time.MicroTime"
	varScaleDecimalName  = "io.debezium.data.VariableScaleDecimal"
	timestampSchemaName  = "io.debezium.time.Timestamp"
	nanoTimestampName    = "io.debezium.time.NanoTimestamp"
	connectTimestampName = "org.apache.kafka.connect.data.Timestamp"
)

// colKind is how a PostgreSQL type becomes a Connect value.
type colKind uint8

const (
	kString colKind = iota
	kJSON
	kUUID
	kXML
	kBool
	kInt16
	kInt32
	kInt64
	kFloat32
	kFloat64
	kNumeric
	kBytea
	kTimestamp
	kTimestamptz
	kDate
	kTime
)

func kindOf(oid uint32) colKind {
	switch oid {
	case OIDJSON, OIDJSONB:
		return kJSON
	case OIDUUID:
		return kUUID
	case OIDXML:
		return kXML
	case OIDBool:
		return kBool
	case OIDInt2:
		return kInt16
	case OIDInt4:
		return kInt32
	case OIDInt8, OIDOID:
		return kInt64
	case OIDFloat4:
		return kFloat32
	case OIDFloat8:
		return kFloat64
	case OIDNumeric:
		return kNumeric
	case OIDBytea:
		return kBytea
	case OIDTimestamp:
		return kTimestamp
	case OIDTimestamptz:
		return kTimestamptz
	case OIDDate:
		return kDate
	case OIDTime:
		return kTime
	}
	// text, varchar, bpchar, name and the types Debezium maps to STRING.
	return kString
}

// isStringKind reports whether Debezium gives the column a STRING schema,
// which is what Struct.getString (route.by.field) insists on.
func isStringKind(k colKind) bool {
	switch k {
	case kString, kJSON, kUUID, kXML, kTimestamptz:
		return true
	}
	return false
}

// schemas of plain columns, [kind][optional]; built once.
var colSchemas [kTime + 1][2]*connect.Schema

// varScaleSchemas are io.debezium.data.VariableScaleDecimal's struct schema
// (VariableScaleDecimal.builder), [optional]: an unconstrained numeric.
var varScaleSchemas [2]*connect.Schema

func init() {
	mk := func(t connect.Type, name string) [2]*connect.Schema {
		var out [2]*connect.Schema
		for o := 0; o < 2; o++ {
			s := &connect.Schema{Type: t, Optional: o == 1}
			if name != "" {
				s.HasName, s.Name, s.HasVersion, s.Version = true, name, true, 1
			}
			out[o] = s
		}
		return out
	}
	colSchemas[kString] = mk(connect.TypeString, "")
	colSchemas[kJSON] = mk(connect.TypeString, jsonSchemaName)
	colSchemas[kUUID] = mk(connect.TypeString, uuidSchemaName)
	colSchemas[kXML] = mk(connect.TypeString, xmlSchemaName)
	colSchemas[kBool] = mk(connect.TypeBool, "")
	colSchemas[kInt16] = mk(connect.TypeInt16, "")
	colSchemas[kInt32] = mk(connect.TypeInt32, "")
	colSchemas[kInt64] = mk(connect.TypeInt64, "")
	colSchemas[kFloat32] = mk(connect.TypeFloat32, "")
	colSchemas[kFloat64] = mk(connect.TypeFloat64, "")
	colSchemas[kBytea] = mk(connect.TypeBytes, "")
	colSchemas[kTimestamp] = mk(connect.TypeInt64, microTimestampName)
	colSchemas[kTimestamptz] = mk(connect.TypeString, zonedTimestampName)
	colSchemas[kDate] = mk(connect.TypeInt32, dateSchemaName)
	colSchemas[kTime] = mk(connect.TypeInt64, microTimeSchemaName)
	for o := 0; o < 2; o++ {
		varScaleSchemas[o] = &connect.Schema{Type: connect.TypeStruct, Optional: o == 1, HasName: true, Name: varScaleDecimalName,
			HasVersion: true, Version: 1, Doc: "Variable scaled decimal",
			Fields: []connect.Field{{Name: "scale", Schema: colSchemas[kInt32][0]}, {Name: "value", Schema: colSchemas[kBytea][0]}}}
	}
}

// colSchema returns the Connect schema Debezium gives a column. optional is
// whether the column may be null; a null value proves it may, whatever
// RequiredColumns says (Debezium reads nullability from the catalog).
//
// A numeric column is, as Debezium's PostgresValueConverter.numericSchema
// has it with decimal.handling.mode=precise: declared numeric(p,s), a
// Decimal of scale s with connect.decimal.precision p; declared without
// precision, a VariableScaleDecimal. When the declaration is unknown
// (Column.HasTypeMod unset) it is a Decimal of the value's own scale,
// without precision.
func colSchema(c *Column, optional bool, v *connect.Value) *connect.Schema {
	if v != nil && v.Kind == connect.KindNull {
		optional = true
	}
	o := 0
	if optional {
		o = 1
	}
	k := kindOf(c.Type)
	if k == kNumeric {
		var params [][2]string
		if precision, scale, ok := numericPrecisionScale(c.TypeMod); c.HasTypeMod && ok {
			// Decimal.builder(scale) then the precision, in that order.
			params = [][2]string{{"scale", strconv.Itoa(int(scale))}, {connect.DecimalPrecisionParam, strconv.Itoa(int(precision))}}
		} else if c.HasTypeMod {
			return varScaleSchemas[o]
		} else {
			scale := int32(0)
			if v != nil && v.Kind == connect.KindDec {
				scale = v.Dec.Scale
			}
			params = [][2]string{{"scale", strconv.Itoa(int(scale))}}
		}
		return &connect.Schema{Type: connect.TypeBytes, Optional: optional, HasName: true, Name: connect.DecimalSchemaName, HasVersion: true, Version: 1, Params: params}
	}
	return colSchemas[k][o]
}

// colValue converts a column's text-format value to the Connect value
// Debezium's PostgreSQL connector produces for it.
func colValue(c *Column) (connect.Value, error) {
	if c.Null {
		return connect.Value{Kind: connect.KindNull}, nil
	}
	s := c.Value
	switch kindOf(c.Type) {
	case kBool:
		switch string(s) {
		case "t", "true":
			return connect.Value{Kind: connect.KindBool, Int: 1}, nil
		case "f", "false":
			return connect.Value{Kind: connect.KindBool}, nil
		}
	case kInt16, kInt32, kInt64:
		bits, kind := 64, connect.KindI64
		switch kindOf(c.Type) {
		case kInt16:
			bits, kind = 16, connect.KindI16
		case kInt32:
			bits, kind = 32, connect.KindI32
		}
		n, err := strconv.ParseInt(string(s), 10, bits)
		if err == nil {
			return connect.Value{Kind: kind, Int: n}, nil
		}
	case kFloat32, kFloat64:
		bits, kind := 64, connect.KindF64
		if kindOf(c.Type) == kFloat32 {
			bits, kind = 32, connect.KindF32
		}
		f, err := strconv.ParseFloat(string(s), bits)
		if err == nil {
			return connect.Value{Kind: kind, Float: f}, nil
		}
	case kNumeric:
		d, ok := connect.ParseDecimal(s)
		if !ok {
			break // NaN and ±Infinity too: decimal.handling.mode=precise fails on them
		}
		if !c.HasTypeMod {
			return connect.Value{Kind: connect.KindDec, Dec: d}, nil
		}
		if _, scale, ok := numericPrecisionScale(c.TypeMod); ok {
			// withScaleAdjustedIfNeeded: BigDecimal.setScale(scale), which
			// PostgreSQL's own output already has.
			if !d.SetScale(scale) {
				break
			}
			return connect.Value{Kind: connect.KindDec, Dec: d}, nil
		}
		// convertDecimal: stripTrailingZeros, then a negative scale (100
		// is 1E+2 stripped) back to 0.
		d.StripTrailingZeros()
		return connect.Value{Kind: connect.KindVarDec, Dec: d}, nil
	case kBytea:
		if b, ok := decodeBytea(s); ok {
			return connect.Value{Kind: connect.KindBytes, Bytes: b}, nil
		}
	case kTimestamp:
		if t, ok := parsePGTime(s, false); ok {
			return connect.Value{Kind: connect.KindI64, Int: t.UnixMicro()}, nil
		}
	case kTimestamptz:
		if t, ok := parsePGTime(s, true); ok {
			return connect.Value{Kind: connect.KindStr, Bytes: appendZonedTimestamp(nil, t.UTC())}, nil
		}
	case kDate:
		if t, ok := parsePGDate(s); ok {
			return connect.Value{Kind: connect.KindI32, Int: floorDiv(t.Unix(), 86400)}, nil
		}
	case kTime:
		if us, ok := parsePGTimeOfDay(s); ok {
			return connect.Value{Kind: connect.KindI64, Int: us}, nil
		}
	default:
		return connect.Value{Kind: connect.KindStr, Bytes: s}, nil
	}
	return connect.Value{}, fmt.Errorf("column %q: %q is not a valid value of type %d", c.Name, truncate(s, 64), c.Type)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// decodeBytea decodes bytea's text output: hex (\x...) or the escape format.
func decodeBytea(s []byte) ([]byte, bool) {
	if len(s) >= 2 && s[0] == '\\' && s[1] == 'x' {
		out := make([]byte, hex.DecodedLen(len(s)-2))
		if _, err := hex.Decode(out, s[2:]); err != nil {
			return nil, false
		}
		return out, true
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(s) && isOct(s[i+1]) && isOct(s[i+2]) && isOct(s[i+3]) && s[i+1] <= '3':
			out = append(out, (s[i+1]-'0')<<6|(s[i+2]-'0')<<3|(s[i+3]-'0'))
			i += 3
		default:
			return nil, false
		}
	}
	return out, true
}

func isOct(c byte) bool { return c >= '0' && c <= '7' }

// num reads n digits at s[i:].
func num(s []byte, i, n int) (int, bool) {
	if i+n > len(s) {
		return 0, false
	}
	v := 0
	for j := i; j < i+n; j++ {
		if s[j] < '0' || s[j] > '9' {
			return 0, false
		}
		v = v*10 + int(s[j]-'0')
	}
	return v, true
}

// parsePGDate parses "YYYY-MM-DD[ BC]" (years may have more digits).
func parsePGDate(s []byte) (time.Time, bool) {
	t, rest, ok := parseDatePart(s)
	if !ok {
		return time.Time{}, false
	}
	bc := false
	if string(rest) == " BC" {
		bc, rest = true, nil
	}
	if len(rest) != 0 {
		return time.Time{}, false
	}
	if bc {
		t = t.AddDate(1-2*t.Year(), 0, 0)
	}
	return t, true
}

func parseDatePart(s []byte) (time.Time, []byte, bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i < 4 || i > 7 || i+6 > len(s) || s[i] != '-' || s[i+3] != '-' {
		return time.Time{}, nil, false
	}
	y, _ := num(s, 0, i)
	mo, ok1 := num(s, i+1, 2)
	d, ok2 := num(s, i+4, 2)
	if !ok1 || !ok2 || mo < 1 || mo > 12 || d < 1 || d > 31 {
		return time.Time{}, nil, false
	}
	return time.Date(y, time.Month(mo), d, 0, 0, 0, 0, time.UTC), s[i+6:], true
}

// parsePGTime parses timestamp ("2019-05-03 13:31:34.344") and, with tz,
// timestamptz ("...+02", "+05:30", "+05:30:15") output in DateStyle ISO.
func parsePGTime(s []byte, tz bool) (time.Time, bool) {
	d, rest, ok := parseDatePart(s)
	if !ok || len(rest) < 9 || rest[0] != ' ' {
		return time.Time{}, false
	}
	us, n, ok := parseClock(rest[1:])
	if !ok {
		return time.Time{}, false
	}
	rest = rest[1+n:]
	off := 0
	if tz {
		if len(rest) < 3 || rest[0] != '+' && rest[0] != '-' {
			return time.Time{}, false
		}
		sign := 1
		if rest[0] == '-' {
			sign = -1
		}
		h, ok := num(rest, 1, 2)
		if !ok {
			return time.Time{}, false
		}
		off = h * 3600
		rest = rest[3:]
		for _, mul := range []int{60, 1} {
			if len(rest) >= 3 && rest[0] == ':' {
				v, ok := num(rest, 1, 2)
				if !ok {
					return time.Time{}, false
				}
				off += v * mul
				rest = rest[3:]
			}
		}
		off *= sign
	}
	bc := false
	if string(rest) == " BC" {
		bc, rest = true, nil
	}
	if len(rest) != 0 {
		return time.Time{}, false
	}
	if bc {
		d = d.AddDate(1-2*d.Year(), 0, 0)
	}
	t := d.Add(time.Duration(us) * time.Microsecond).Add(-time.Duration(off) * time.Second)
	return t, true
}

// parseClock parses "HH:MM:SS[.ffffff]" into microseconds of the day.
func parseClock(s []byte) (int64, int, bool) {
	if len(s) < 8 || s[2] != ':' || s[5] != ':' {
		return 0, 0, false
	}
	h, ok1 := num(s, 0, 2)
	m, ok2 := num(s, 3, 2)
	sec, ok3 := num(s, 6, 2)
	if !ok1 || !ok2 || !ok3 || h > 24 || m > 59 || sec > 60 {
		return 0, 0, false
	}
	us := (int64(h)*3600 + int64(m)*60 + int64(sec)) * 1e6
	n := 8
	if n < len(s) && s[n] == '.' {
		n++
		frac, digits := int64(0), 0
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			if digits < 6 {
				frac = frac*10 + int64(s[n]-'0')
				digits++
			}
			n++
		}
		if digits == 0 {
			return 0, 0, false
		}
		for ; digits < 6; digits++ {
			frac *= 10
		}
		us += frac
	}
	return us, n, true
}

func parsePGTimeOfDay(s []byte) (int64, bool) {
	us, n, ok := parseClock(s)
	return us, ok && n == len(s)
}

// appendZonedTimestamp formats t (UTC) as Debezium's ZonedTimestamp does
// for a timestamptz column: ISO-8601 with exactly six fraction digits (the
// column's default precision) and "Z".
func appendZonedTimestamp(dst []byte, t time.Time) []byte {
	y := t.Year()
	switch {
	case y > 9999:
		dst = append(dst, '+')
		dst = strconv.AppendInt(dst, int64(y), 10)
	case y < 0:
		dst = append(dst, '-')
		dst = appendPad(dst, -y, 4)
	default:
		dst = appendPad(dst, y, 4)
	}
	dst = append(dst, '-')
	dst = appendPad(dst, int(t.Month()), 2)
	dst = append(dst, '-')
	dst = appendPad(dst, t.Day(), 2)
	dst = append(dst, 'T')
	dst = appendPad(dst, t.Hour(), 2)
	dst = append(dst, ':')
	dst = appendPad(dst, t.Minute(), 2)
	dst = append(dst, ':')
	dst = appendPad(dst, t.Second(), 2)
	dst = append(dst, '.')
	dst = appendPad(dst, t.Nanosecond()/1000, 6)
	return append(dst, 'Z')
}

func appendPad(dst []byte, v, width int) []byte {
	var buf [20]byte
	s := strconv.AppendInt(buf[:0], int64(v), 10)
	for i := len(s); i < width; i++ {
		dst = append(dst, '0')
	}
	return append(dst, s...)
}
