package route

import (
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/pgoutbox/pgoutbox/route/connect"
)

// ColumnInfo is what the catalog says of a column beyond its type, as
// Debezium's PostgreSQL connector reads it when it builds a table's schema:
// whether the column is NOT NULL (a required field), and its default
// expression (pg_get_expr of pg_attrdef.adbin), which Debezium turns into
// the field schema's default value. The connector reads it per relation;
// a Column without one (a hand-built row, a Debezium change event) is
// required when RequiredColumns names it and has no default.
type ColumnInfo struct {
	NotNull    bool
	Default    string
	HasDefault bool

	once    sync.Once
	def     connect.Value
	defText string // def in PostgreSQL's text format
	hasDef  bool
	schemas [2]*connect.Schema // [optional], with the default
}

// The patterns of Debezium's PostgresDefaultValueConverter: a default that
// calls a function (nextval, now, gen_random_uuid, ...) or is one of the
// SQL current date/time keywords is generated, and Debezium puts a fixed
// placeholder of the type in the schema.
var (
	functionDefault = regexp.MustCompile(`^[(]?[A-Za-z0-9_.]+\((?:.+(?:, ?.+)*)?\)`)
	literalDefault  = regexp.MustCompile(`'([^']*(?:''[^']*)*)'`)
	currentDefaults = map[string]bool{"current_timestamp": true, "current_time": true, "current_date": true, "localtime": true, "localtimestamp": true}
)

// defaultPlaceholders are, per column kind Debezium has a default mapper
// for, the value it assumes for a generated default; a kind missing here
// (bytea, xml's and the other types Debezium has no mapper for) gets no
// default.
var defaultPlaceholders = map[colKind]string{
	kString: "", kJSON: "{}", kUUID: "00000000-0000-0000-0000-000000000000", kXML: "",
	kBool: "false", kInt16: "0", kInt32: "0", kInt64: "0", kFloat32: "0.0", kFloat64: "0.0", kNumeric: "0.0",
	kTimestamp: "1970-01-01", kTimestamptz: "1970-01-01", kDate: "1970-01-01", kTime: "00:00:00",
}

// defaultTypes are the string-kind type OIDs Debezium has a default mapper
// for (bpchar, varchar, text): another type read as text (name, an enum,
// citext, ...) gets none.
var defaultTypes = map[uint32]bool{OIDText: true, OIDVarchar: true, OIDBpchar: true}

// extractDefault is Debezium's extractDefault(value, placeholder): the
// placeholder for a generated default, else the quoted literal's text, else
// the expression as it is; null for NULL::type.
func extractDefault(expr, placeholder string) (string, bool) {
	if functionDefault.MatchString(expr) || currentDefaults[strings.ToLower(expr)] {
		return placeholder, true
	}
	if !strings.Contains(expr, "'") {
		if strings.HasPrefix(expr, "NULL::") {
			return "", false
		}
		return expr, true
	}
	m := literalDefault.FindStringSubmatch(expr)
	if m == nil {
		return "", false
	}
	return strings.ReplaceAll(m[1], "''", "'"), true
}

// defaultValue is the Connect value Debezium puts in the schema for column
// c's default expression, and false when it puts none: a type it has no
// mapper for, NULL, an expression it cannot parse, or a struct (an
// unconstrained numeric's VariableScaleDecimal; Debezium logs that it uses
// null instead).
func defaultValue(c *Column, expr string) (connect.Value, bool) {
	v, _, ok := defaultOf(c, expr)
	return v, ok
}

// defaultOf is defaultValue and the default in PostgreSQL's text format,
// which colValue reads as that value (the column's value where the row has
// NULL: Kafka Connect's Struct.get gives a field's default for null, and
// Debezium's EventRouter reads every column through it).
func defaultOf(c *Column, expr string) (connect.Value, string, bool) {
	k := kindOf(c.Type)
	placeholder, mapped := defaultPlaceholders[k]
	if !mapped || k == kString && !defaultTypes[c.Type] {
		return connect.Value{}, "", false
	}
	switch k {
	case kString, kJSON, kXML, kUUID, kBool, kInt16, kInt32, kInt64, kFloat32, kFloat64, kNumeric:
		// Trimmed first for the types Debezium trims (TRIM_DATA_TYPES).
		if k == kBool || k == kNumeric {
			expr = strings.TrimSpace(expr)
		}
	default:
		expr = strings.TrimSpace(expr)
	}
	text, ok := extractDefault(expr, placeholder)
	if !ok {
		return connect.Value{}, "", false
	}
	switch k {
	case kBool:
		// Boolean.parseBoolean: true only for "true", in any case.
		if strings.EqualFold(text, "true") {
			return connect.Value{Kind: connect.KindBool, Int: 1}, "true", true
		}
		return connect.Value{Kind: connect.KindBool}, "false", true
	case kInt16, kInt32, kInt64:
		// Short/Integer/Long.parseLong: an optional sign, then digits.
		bits := map[colKind]int{kInt16: 16, kInt32: 32, kInt64: 64}[k]
		n, err := strconv.ParseInt(strings.TrimPrefix(text, "+"), 10, bits)
		if err != nil || text == "" {
			return connect.Value{}, "", false
		}
		text = strconv.FormatInt(n, 10)
	case kFloat32, kFloat64:
		if _, err := strconv.ParseFloat(text, 64); err != nil {
			return connect.Value{}, "", false
		}
	case kNumeric:
		d, ok := connect.ParseDecimal([]byte(text))
		if !ok {
			return connect.Value{}, "", false
		}
		_, scale, constrained := numericPrecisionScale(c.TypeMod)
		if !c.HasTypeMod || !constrained {
			// A VariableScaleDecimal is a struct, which Kafka Connect
			// cannot take as a default (KAFKA-12694): Debezium uses none.
			return connect.Value{}, "", false
		}
		// withScaleAdjustedIfNeeded raises the scale; a default of a
		// greater scale does not fit the Decimal schema, and Debezium's
		// conversion fails: no default.
		if d.Scale > scale || !d.SetScale(scale) {
			return connect.Value{}, "", false
		}
		return connect.Value{Kind: connect.KindDec, Dec: d}, text, true
	case kTimestamptz:
		// toOffsetDateTime of a date alone is its midnight, UTC.
		if len(text) == len("1970-01-01") {
			text += " 00:00:00+00"
		}
	case kTimestamp:
		if len(text) == len("1970-01-01") {
			text += " 00:00:00"
		}
	}
	v, err := colValue(&Column{Name: c.Name, Type: c.Type, TypeMod: c.TypeMod, HasTypeMod: c.HasTypeMod, Value: []byte(text)})
	if err != nil {
		return connect.Value{}, "", false
	}
	return v, text, true
}

// withDefault returns s, the column's schema, with the column's default,
// once computed per ColumnInfo.
func (info *ColumnInfo) withDefault(c *Column, s *connect.Schema) *connect.Schema {
	info.compute(c)
	if !info.hasDef {
		return s
	}
	if s.Optional {
		return info.schemas[1]
	}
	return info.schemas[0]
}

// defaultText is the column's default in PostgreSQL's text format, when
// Debezium has one.
func (info *ColumnInfo) defaultText(c *Column) (string, bool) {
	info.compute(c)
	return info.defText, info.hasDef
}

// compute works out the default and the schemas with it, once per
// ColumnInfo (a relation's columns: their type and modifier are fixed).
func (info *ColumnInfo) compute(c *Column) {
	info.once.Do(func() {
		if info.HasDefault {
			info.def, info.defText, info.hasDef = defaultOf(c, info.Default)
		}
		for o := range info.schemas {
			base := colSchema(c, o == 1, nil)
			if !info.hasDef {
				info.schemas[o] = base
				continue
			}
			ws := *base
			ws.Default = &info.def
			info.schemas[o] = &ws
		}
	})
}

// withDefaults returns row, or a copy of it whose NULL columns that have a
// default (Column.Info) hold it: Kafka Connect's Struct.get gives a field's
// default for null, and Debezium's EventRouter reads every column through
// it (the payload, the id, the key, headers, envelope fields, the
// partition, the timestamp), before any converter. The row is the caller's
// and is not changed.
func withDefaults(row *Row) *Row {
	var cp *Row
	for i := range row.Columns {
		c := &row.Columns[i]
		if !c.Null || c.Info == nil || !c.Info.HasDefault {
			continue
		}
		text, ok := c.Info.defaultText(c)
		if !ok {
			continue
		}
		if cp == nil {
			cp = &Row{Op: row.Op, Source: row.Source, Columns: append([]Column(nil), row.Columns...)}
		}
		cp.Columns[i].Null, cp.Columns[i].Value = false, []byte(text)
	}
	if cp == nil {
		return row
	}
	return cp
}
