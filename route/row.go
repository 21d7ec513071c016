// Package route turns outbox rows into Kafka records the way Debezium's
// Outbox Event Router (io.debezium.transforms.outbox.EventRouter) does, so
// that consumers moving from Debezium notice nothing. The connector uses it
// in-process; the outbox-router binary uses it on Debezium change events.
package route

import (
	"time"
)

// Well-known PostgreSQL type OIDs of the columns an outbox row may carry.
const (
	OIDBool        uint32 = 16
	OIDBytea       uint32 = 17
	OIDName        uint32 = 19
	OIDInt8        uint32 = 20
	OIDInt2        uint32 = 21
	OIDInt4        uint32 = 23
	OIDText        uint32 = 25
	OIDOID         uint32 = 26
	OIDJSON        uint32 = 114
	OIDXML         uint32 = 142
	OIDFloat4      uint32 = 700
	OIDFloat8      uint32 = 701
	OIDBpchar      uint32 = 1042
	OIDVarchar     uint32 = 1043
	OIDDate        uint32 = 1082
	OIDTime        uint32 = 1083
	OIDTimestamp   uint32 = 1114
	OIDTimestamptz uint32 = 1184
	OIDNumeric     uint32 = 1700
	OIDUUID        uint32 = 2950
	OIDJSONB       uint32 = 3802
)

// Op is the kind of change a row comes from. The zero value is an insert,
// which is all the connector's insert-only publication delivers; the
// outbox-router's Debezium mode also sees the others.
type Op uint8

// The operations, with Debezium's op codes.
const (
	OpInsert Op = iota // "c"; also a logical-decoding message
	OpRead             // "r", a snapshot read: routed like an insert
	OpUpdate           // "u": handled by table.op.invalid.behavior
	OpDelete           // "d": always skipped (outbox cleanup)
)

// String returns Debezium's op code.
func (o Op) String() string {
	switch o {
	case OpInsert:
		return "c"
	case OpRead:
		return "r"
	case OpUpdate:
		return "u"
	case OpDelete:
		return "d"
	}
	return "?"
}

// Column is one column of an outbox row as pgoutput delivers it: the value in
// PostgreSQL's text output format (bytea as \x hex) and the column's type OID.
type Column struct {
	Name string
	Type uint32
	// TypeMod is the column's type modifier as PostgreSQL reports it
	// (pg_attribute.atttypmod, in pgoutput's Relation message and in a
	// query's RowDescription), meaningful only when HasTypeMod is set: -1
	// when the type was declared without one, ((precision<<16)|scale)+4 for
	// numeric(precision, scale) (see NumericTypeMod). Debezium maps an
	// unconstrained numeric to io.debezium.data.VariableScaleDecimal and a
	// numeric(p,s) to a Decimal of scale s and precision p.
	TypeMod int32
	// HasTypeMod says TypeMod is known. The zero value, unknown, keeps a
	// numeric column a Decimal of the value's own scale, without precision.
	HasTypeMod bool
	Null       bool
	Value      []byte
	// Info is what the catalog says of the column (NOT NULL, default),
	// shared by the rows of one relation; nil when unknown.
	Info *ColumnInfo
}

// NoTypeMod is the TypeMod of a column declared without a modifier.
const NoTypeMod int32 = -1

// NumericTypeMod is PostgreSQL's type modifier of numeric(precision, scale)
// (make_numeric_typmod: a negative scale, PostgreSQL 15+, keeps 11 bits).
func NumericTypeMod(precision, scale int) int32 {
	return int32(precision<<16|scale&0x7ff) + 4
}

// numericPrecisionScale decodes a numeric column's type modifier as the
// PostgreSQL JDBC driver does (TypeInfoCache.getPrecision/getScale), which
// is what Debezium's schema reads; ok is false for an unconstrained numeric.
func numericPrecisionScale(typmod int32) (precision, scale int32, ok bool) {
	if typmod < 4 {
		return 0, 0, false
	}
	precision, scale = int32(uint32(typmod-4)>>16), (typmod-4)&0xffff
	// Debezium's isVariableScaleDecimal: no length and scale 0.
	return precision, scale, precision != 0 || scale != 0
}

// Source says where a row came from; it feeds the dead-letter headers and
// the names of schemas in the JSON-with-schema and envelope encodings.
type Source struct {
	// LSN is the position of the row's change (or message) in the WAL.
	LSN uint64
	// CommitLSN is the end LSN of the row's transaction.
	CommitLSN uint64
	// CommitTime is when the row's transaction committed.
	CommitTime time.Time
	// Table is "schema.table", empty for a logical decoding message.
	Table string
	// Message is true for a pg_logical_emit_message event.
	Message bool
	// ProcessedTime is Debezium's envelope ts_ms, the time the change was
	// processed, when the row comes from a Debezium change event. Zero means
	// "now": the router stamps the record with its clock, as Debezium does.
	ProcessedTime time.Time
}

// Row is one outbox insert (or one logical-message event) to route.
type Row struct {
	Columns []Column
	Source  Source
	// Op is the change kind; the zero value is an insert.
	Op Op
}

// Lookup returns the column called name, or nil.
func (r *Row) Lookup(name string) *Column {
	for i := range r.Columns {
		if r.Columns[i].Name == name {
			return &r.Columns[i]
		}
	}
	return nil
}
