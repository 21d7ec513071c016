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
	OIDInt8        uint32 = 20
	OIDInt2        uint32 = 21
	OIDInt4        uint32 = 23
	OIDText        uint32 = 25
	OIDJSON        uint32 = 114
	OIDVarchar     uint32 = 1043
	OIDTimestamp   uint32 = 1114
	OIDTimestamptz uint32 = 1184
	OIDUUID        uint32 = 2950
	OIDJSONB       uint32 = 3802
)

// Column is one column of an outbox row as pgoutput delivers it: the value in
// PostgreSQL's text output format (bytea as \x hex) and the column's type OID.
type Column struct {
	Name  string
	Type  uint32
	Null  bool
	Value []byte
}

// Source says where a row came from; it feeds the dead-letter headers and,
// when no timestamp column is configured, the record timestamp.
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
}

// Row is one outbox insert (or one logical-message event) to route.
type Row struct {
	Columns []Column
	Source  Source
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
