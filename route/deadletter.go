package route

import (
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/pgoutbox/pgoutbox/route/connect"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DeadLetter builds the DLQ record for a row that could not be routed or
// produced, with the event id taken from the column "id" (use the Router's
// DeadLetter when table.field.event.id names another column).
//
// The value is the original row as a JSON object of its columns' text
// values, in column order (null for SQL NULL; bytea in its \x hex text), so
// that nothing is lost and the row can be routed again. Headers:
//
//	id                 the event id (null when the row has none)
//	error              cause.Error()
//	error.class        the ErrorClass, or "unknown" for another error
//	source.lsn         the row's LSN, X/X
//	source.commit.lsn  its transaction's commit LSN, X/X
//	source.table       schema.table, empty for a logical message
//	column.types       JSON object: column name to PostgreSQL type OID
//	topic              the topic the record was meant for (may be empty)
//
// The key is the event id, so that a DLQ topic keeps one event's attempts
// together. DeadLetter never fails and never panics; a nil cause reads as
// "unknown error".
func DeadLetter(row *Row, intendedTopic string, cause error, dlqTopic string) *kgo.Record {
	return deadLetter(row, "id", intendedTopic, cause, dlqTopic)
}

// DeadLetter is the package's DeadLetter with the router's
// table.field.event.id.
func (r *Router) DeadLetter(row *Row, intendedTopic string, cause error, dlqTopic string) *kgo.Record {
	return deadLetter(row, r.cfg.FieldEventID, intendedTopic, cause, dlqTopic)
}

func deadLetter(row *Row, idField, intended string, cause error, dlqTopic string) *kgo.Record {
	if row == nil {
		row = &Row{}
	}
	size := 64
	for i := range row.Columns {
		size += len(row.Columns[i].Name) + len(row.Columns[i].Value) + 8
	}
	val := make([]byte, 0, size+size/8)
	types := make([]byte, 0, 16*len(row.Columns)+2)
	val = append(val, '{')
	types = append(types, '{')
	var id []byte
	for i, c := range row.Columns {
		if i > 0 {
			val = append(val, ',')
			types = append(types, ',')
		}
		val = connect.AppendJSONStr(val, c.Name)
		val = append(val, ':')
		types = connect.AppendJSONStr(types, c.Name)
		types = append(types, ':')
		types = strconv.AppendUint(types, uint64(c.Type), 10)
		if c.Null {
			val = append(val, "null"...)
			continue
		}
		val = connect.AppendJSONString(val, c.Value)
		if c.Name == idField && id == nil {
			id = append([]byte{}, c.Value...)
		}
	}
	val = append(val, '}')
	types = append(types, '}')
	class := "unknown"
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
		if c := ClassOf(cause); c != "" {
			class = string(c)
		}
	}
	return &kgo.Record{
		Topic:     dlqTopic,
		Key:       id,
		Value:     val,
		Partition: -1,
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: id},
			{Key: "error", Value: []byte(msg)},
			{Key: "error.class", Value: []byte(class)},
			{Key: "source.lsn", Value: []byte(pglogrepl.LSN(row.Source.LSN).String())},
			{Key: "source.commit.lsn", Value: []byte(pglogrepl.LSN(row.Source.CommitLSN).String())},
			{Key: "source.table", Value: []byte(row.Source.Table)},
			{Key: "column.types", Value: types},
			{Key: "topic", Value: []byte(intended)},
		},
	}
}
