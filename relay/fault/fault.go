// Package fault names the steps of a connector session between which the
// process may die or a step may fail (DESIGN rule 11), so that tests can fail
// or stop the connector at exactly one of them and check that the next start
// loses nothing.
//
// A Hook travels in the configuration of the component that runs the step
// (the relay, the producer, the stream): there is no global state, so
// parallel tests each inject their own faults. A nil Hook costs one
// comparison per step.
package fault

import (
	"errors"
	"fmt"
)

// Step is a named point in a session, reached just after (or, where the
// name says so, just before) the work it names.
type Step string

// The steps, in the order a first session reaches them.
const (
	// SlotIntent: the intent to create the slot (and owe its initial
	// snapshot) is recorded; the slot is not created yet.
	SlotIntent Step = "slot-intent"
	// SlotCreated: CREATE_REPLICATION_SLOT succeeded; nothing else is
	// recorded about the slot yet.
	SlotCreated Step = "slot-created"
	// SnapshotImported: the slot's exported snapshot is imported into the
	// snapshot transaction.
	SnapshotImported Step = "snapshot-imported"
	// StateWritten: the state row records the new slot's position.
	StateWritten Step = "state-written"
	// SnapshotRow: one snapshot row was handed to the producer.
	SnapshotRow Step = "snapshot-row"
	// SnapshotDone: every snapshot row is acked, before it is recorded.
	SnapshotDone Step = "snapshot-done"
	// BeforeKafkaCommit: a Kafka transaction is flushed, not yet committed.
	BeforeKafkaCommit Step = "before-kafka-commit"
	// AfterKafkaCommit: a Kafka transaction committed; its records are not
	// yet marked acked.
	AfterKafkaCommit Step = "after-kafka-commit"
	// BeforePromise: a state write (the promise) is about to be made.
	BeforePromise Step = "before-promise"
	// AfterPromise: a state write (the promise) was made.
	AfterPromise Step = "after-promise"
	// BeforeStatus: a standby status update is about to be sent.
	BeforeStatus Step = "before-status"
	// AfterStatus: a standby status update was sent.
	AfterStatus Step = "after-status"
)

// Steps lists every step, for tests that loop over them.
var Steps = []Step{
	SlotIntent, SlotCreated, SnapshotImported, StateWritten, SnapshotRow, SnapshotDone,
	BeforeKafkaCommit, AfterKafkaCommit, BeforePromise, AfterPromise, BeforeStatus, AfterStatus,
}

// Hook is called at every step; a non-nil error fails the step as if the
// work itself had failed. A hook may also end the process there.
type Hook func(Step) error

// At runs the hook for step s; a nil hook does nothing.
func (h Hook) At(s Step) error {
	if h == nil {
		return nil
	}
	if err := h(s); err != nil {
		return &Error{Step: s, Err: err}
	}
	return nil
}

// Error is a failure injected at a step.
type Error struct {
	Step Step
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("injected fault at %s: %v", e.Step, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether err is an injected fault.
func Is(err error) bool {
	var fe *Error
	return errors.As(err, &fe)
}
