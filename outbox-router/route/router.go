package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Config holds the router's options. Zero values are not defaults: start
// from DefaultConfig, which matches Debezium's EventRouter defaults.
type Config struct {
	// FieldEventID is table.field.event.id (default "id").
	FieldEventID string
	// FieldEventKey is table.field.event.key (default "aggregateid").
	FieldEventKey string
	// FieldPayload is table.field.event.payload (default "payload").
	FieldPayload string
	// RouteByField is route.by.field (default "aggregatetype").
	RouteByField string
	// TopicReplacement is route.topic.replacement (default
	// "outbox.event.${routedByValue}").
	TopicReplacement string
}

// DefaultConfig is Debezium's EventRouter with its defaults.
func DefaultConfig() Config {
	return Config{
		FieldEventID:     "id",
		FieldEventKey:    "aggregateid",
		FieldPayload:     "payload",
		RouteByField:     "aggregatetype",
		TopicReplacement: "outbox.event.${routedByValue}",
	}
}

// Router routes rows; it is safe for concurrent use.
type Router struct {
	cfg Config
}

// New validates cfg and returns a router.
func New(cfg Config) (*Router, error) {
	return &Router{cfg: cfg}, nil
}

// Route turns one row into a record, or returns an *Error saying why the row
// cannot be routed (the caller dead-letters it).
func (r *Router) Route(_ context.Context, row *Row) (*kgo.Record, error) {
	by := row.Lookup(r.cfg.RouteByField)
	if by == nil || by.Null {
		return nil, &Error{Class: ClassMissingField, Msg: fmt.Sprintf("column %q (route.by.field) is missing or null", r.cfg.RouteByField)}
	}
	topic := strings.ReplaceAll(r.cfg.TopicReplacement, "${routedByValue}", string(by.Value))
	if err := ValidTopic(topic); err != nil {
		return nil, err
	}
	rec := &kgo.Record{Topic: topic}
	if k := row.Lookup(r.cfg.FieldEventKey); k != nil && !k.Null {
		rec.Key = k.Value
	}
	if p := row.Lookup(r.cfg.FieldPayload); p != nil && !p.Null {
		rec.Value = p.Value
	}
	id := row.Lookup(r.cfg.FieldEventID)
	if id == nil || id.Null {
		return nil, &Error{Class: ClassMissingField, Msg: fmt.Sprintf("column %q (table.field.event.id) is missing or null", r.cfg.FieldEventID)}
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "id", Value: id.Value})
	if !row.Source.CommitTime.IsZero() {
		rec.Timestamp = row.Source.CommitTime
	}
	return rec, nil
}

// ErrorClass names why a row could not be routed; it is the DLQ header
// error.class and a metric label.
type ErrorClass string

// The error classes.
const (
	ClassMissingField   ErrorClass = "missing-field"
	ClassInvalidTopic   ErrorClass = "invalid-topic"
	ClassInvalidPayload ErrorClass = "invalid-payload"
	ClassSchema         ErrorClass = "schema"
	ClassTooLarge       ErrorClass = "record-too-large"
	ClassInvalidOp      ErrorClass = "invalid-op"
)

// Error is a row that cannot be routed: poison, to be dead-lettered whole.
type Error struct {
	Class ErrorClass
	Msg   string
	Err   error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Class, e.Msg, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Class, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// ValidTopic reports whether Kafka would accept name as a topic name.
func ValidTopic(name string) error {
	if name == "" || name == "." || name == ".." {
		return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name %q is not allowed", name)}
	}
	if len(name) > 249 {
		return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name of %d characters is longer than Kafka's 249", len(name))}
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &Error{Class: ClassInvalidTopic, Msg: fmt.Sprintf("topic name %q has a character Kafka rejects (%q); only [a-zA-Z0-9._-] are legal", name, c)}
		}
	}
	return nil
}

// DeadLetter builds the DLQ record for a row that could not be routed or
// produced: the original row as a JSON object of its columns' text values,
// with headers id, error, error.class, source.lsn and topic (the intended one).
func DeadLetter(row *Row, intended string, cause error, dlqTopic string) *kgo.Record {
	obj := make(map[string]any, len(row.Columns))
	var id []byte
	for _, c := range row.Columns {
		if c.Null {
			obj[c.Name] = nil
			continue
		}
		obj[c.Name] = string(c.Value)
		if c.Name == "id" {
			id = c.Value
		}
	}
	val, _ := json.Marshal(obj)
	class := "unknown"
	var re *Error
	if errors.As(cause, &re) {
		class = string(re.Class)
	}
	return &kgo.Record{
		Topic: dlqTopic,
		Key:   id,
		Value: val,
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: id},
			{Key: "error", Value: []byte(cause.Error())},
			{Key: "error.class", Value: []byte(class)},
			{Key: "source.lsn", Value: []byte(FormatLSN(row.Source.LSN))},
			{Key: "topic", Value: []byte(intended)},
		},
	}
}

// FormatLSN writes an LSN as PostgreSQL does (X/X).
func FormatLSN(lsn uint64) string {
	return fmt.Sprintf("%X/%X", uint32(lsn>>32), uint32(lsn))
}

// RowFromMessage decodes the content of a transactional logical decoding
// message with prefix "outbox" (a table-less outbox event): a JSON object
// {"id", "aggregatetype", "aggregateid", "type", "payload"}. payload is kept
// as its JSON text, like a jsonb column.
func RowFromMessage(content []byte, src Source) (*Row, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(content, &m); err != nil {
		return nil, &Error{Class: ClassInvalidPayload, Msg: "logical message content is not a JSON object", Err: err}
	}
	row := &Row{Source: src}
	for _, name := range []string{"id", "aggregatetype", "aggregateid", "type"} {
		raw, ok := m[name]
		col := Column{Name: name, Type: OIDText}
		if name == "id" {
			col.Type = OIDUUID
		}
		if !ok || string(raw) == "null" {
			col.Null = true
		} else {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, &Error{Class: ClassInvalidPayload, Msg: fmt.Sprintf("logical message field %q is not a string", name), Err: err}
			}
			col.Value = []byte(s)
		}
		row.Columns = append(row.Columns, col)
	}
	p := Column{Name: "payload", Type: OIDJSONB}
	if raw, ok := m["payload"]; !ok || string(raw) == "null" {
		p.Null = true
	} else {
		p.Value = []byte(raw)
	}
	row.Columns = append(row.Columns, p)
	return row, nil
}
