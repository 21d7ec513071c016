package route

import (
	"errors"
	"fmt"
	"log/slog"
)

// ErrorClass names why a row could not be routed; it is the DLQ header
// error.class and a metric label. The class, not the message, tells the
// caller what to do with the row (see Skip, Fatal and Retryable).
type ErrorClass string

// The error classes.
//
// How a caller handles each (the connector does exactly this):
//
//   - ClassSkipped: not a failure. Debezium drops this row too (a delete, or
//     an update under table.op.invalid.behavior=warn|error); log it at
//     (*Error).Level and move on. errors.Is(err, ErrSkip) also reports it.
//   - ClassInvalidOp: table.op.invalid.behavior=fatal saw an update; stop,
//     as Debezium stops the connector.
//   - ClassRegistry: the schema registry could not be reached; the row is
//     fine, retry later (Retryable). Never dead-letter for this.
//   - ClassSchemaRejected: the registry answered and refused the value's
//     schema (incompatible with the subject, or not registered while
//     auto.register.schemas is off); the row is fine and waits, retried,
//     until an operator changes the registry (Retryable), as Debezium's
//     task stops. Never dead-letter for this.
//   - every other class: the row is poison; dead-letter it whole
//     (DeadLetter) and carry on.
const (
	ClassMissingField   ErrorClass = "missing-field"
	ClassInvalidTopic   ErrorClass = "invalid-topic"
	ClassInvalidPayload ErrorClass = "invalid-payload"
	ClassSchema         ErrorClass = "schema"
	ClassTooLarge       ErrorClass = "record-too-large"
	ClassInvalidOp      ErrorClass = "invalid-op"
	ClassSkipped        ErrorClass = "skipped"
	ClassRegistry       ErrorClass = "registry-unavailable"
	ClassSchemaRejected ErrorClass = "schema-rejected"
)

// Skip reports whether rows of this class are dropped on purpose, as
// Debezium drops them.
func (c ErrorClass) Skip() bool { return c == ClassSkipped }

// Fatal reports whether the pipeline must stop (the operator asked for it
// with table.op.invalid.behavior=fatal).
func (c ErrorClass) Fatal() bool { return c == ClassInvalidOp }

// Retryable reports whether the same row may route on a later attempt: only
// when something outside the row (the schema registry) failed.
func (c ErrorClass) Retryable() bool { return c == ClassRegistry || c == ClassSchemaRejected }

// Poison reports whether the row itself cannot be routed and belongs in the
// dead-letter queue.
func (c ErrorClass) Poison() bool { return !c.Skip() && !c.Fatal() && !c.Retryable() }

// ErrSkip is wrapped by every *Error of class ClassSkipped, so that
// errors.Is(err, route.ErrSkip) tells a deliberate skip from a failure.
var ErrSkip = errors.New("row skipped as Debezium's EventRouter skips it")

// Error is a row that cannot be routed. Route returns no other error type.
type Error struct {
	Class ErrorClass
	Msg   string
	Err   error
	// Intended is the topic the row was routed to when the error arose
	// after routing (a value that does not fit the topic's schema); empty
	// otherwise.
	Intended string
	// Level is the log level Debezium uses for this case: Warn or Error for
	// an update under table.op.invalid.behavior=warn|error, Debug for an
	// ignored delete, Error otherwise.
	Level slog.Level
}

func (e *Error) Error() string {
	if e.Err != nil && e.Err != ErrSkip {
		return fmt.Sprintf("%s: %s: %v", e.Class, e.Msg, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Class, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Topic is the topic the row was meant for, when known (Intended).
func (e *Error) Topic() string { return e.Intended }

// ClassOf returns the class of a routing error, or "" when err is nil or not
// an *Error.
func ClassOf(err error) ErrorClass {
	var re *Error
	if errors.As(err, &re) {
		return re.Class
	}
	return ""
}

// IsRetryable reports whether err is a routing error worth retrying as is
// (class ClassRegistry or ClassSchemaRejected).
func IsRetryable(err error) bool { return ClassOf(err).Retryable() }

func errorf(class ErrorClass, err error, format string, args ...any) *Error {
	return &Error{Class: class, Msg: fmt.Sprintf(format, args...), Err: err, Level: slog.LevelError}
}
