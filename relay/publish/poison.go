package publish

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/route"
)

// Records Kafka refuses.
//
// Kafka answers a produce request per partition: one error for a whole
// batch. franz-go (pkg/kgo/sink.go, handleReqRespBatch and finishBatch, as
// of v1.22) retries a batch whose error is retriable (kerr.IsRetriable,
// apart from CORRUPT_MESSAGE), without limit with our options. On any other
// error it fails the batch and, through recBuf.failAllRecords, every record
// buffered behind it for that partition, with the same error: with or
// without idempotency or transactions alike, since a partition's sequence
// numbers must stay contiguous. (An idempotent client also bumps its
// producer epoch, as the failed batch was written under its own.) So an
// error that belongs to one record reaches the promises of every record of
// its partition that was in flight, and franz-go does not say which one is
// at fault.
//
// Hence a verdict in two steps. Every record that failed that way becomes a
// suspect, remembered across sessions; the session ends (a transaction is
// aborted), and the next one reads again from the confirmed position. A
// suspect read again is produced alone, once everything before it is acked
// (committed): if Kafka takes it, it was innocent and is published, in its
// place; if Kafka refuses it again, alone, it is guilty and goes to the dead
// letters, whole, with the broker's error. An innocent record is never
// dead-lettered.

// verdict is what is known about a record Kafka refused.
type verdict struct {
	err    error // why Kafka refused it
	guilty bool  // refused when produced alone
	// alone counts refusals of the record produced alone with an error
	// that is not surely the record's (convictable): each ended its
	// session, so they are a backoff apart.
	alone int
}

// Poison remembers, across sessions, records Kafka refused: suspects (a
// batch holding them was refused) and the guilty (refused alone). Safe for
// concurrent use; the zero value is empty.
type Poison struct {
	mu sync.Mutex
	m  map[string]verdict
	n  atomic.Int64 // len(m), read without the lock on every record
}

// maxPoison bounds the memory the guilty take: forgetting one costs one
// more failed session (it fails in a batch again, is a suspect again, and
// is refused alone again). Suspects are never forgotten, or a refused batch
// of more records than the bound would never be resolved (the guilty one
// forgotten, produced in a batch again, forever): they are bounded by what
// is in flight when a batch fails, and each is resolved (acquitted or
// convicted) when it is read again.
const maxPoison = 10000

// set records v for key; it reports whether key was unknown.
func (ps *Poison) set(key string, v verdict) bool {
	if ps == nil {
		return true
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	old, known := ps.m[key]
	if known && old.guilty && !v.guilty {
		return false // a guilty record failing again with its batch stays guilty
	}
	if known && !v.guilty {
		// A suspect failing again keeps its count of refusals alone: in a
		// transaction, the one it is produced alone in fails through
		// recordErrors, which suspects it again before refusedAlone counts
		// the refusal; reset here, the count never reached
		// maxAloneRefusals and the line wedged.
		v.alone = old.alone
	}
	if ps.m == nil {
		ps.m = map[string]verdict{}
	}
	if len(ps.m) >= maxPoison && v.guilty {
		for k, old := range ps.m {
			if old.guilty {
				delete(ps.m, k)
			}
		}
	}
	ps.m[key] = v
	ps.n.Store(int64(len(ps.m)))
	return !known
}

// suspect remembers a record whose batch Kafka refused with err; it reports
// whether the record was not a suspect already (a suspect produced alone
// fails here again before it is convicted).
func (ps *Poison) suspect(key string, err error) bool { return ps.set(key, verdict{err: err}) }

// convict remembers a record Kafka refused alone.
func (ps *Poison) convict(key string, err error) { ps.set(key, verdict{err: err, guilty: true}) }

// maxAloneRefusals is how often a record produced alone may be refused with
// an error that is not surely its own before it is convicted all the same:
// the line must not wedge on an error Kafka gives for a reason we do not
// know, nor dead-letter an innocent record for one passing fault.
const maxAloneRefusals = 3

// refusedAlone records that the suspect of key was refused alone with err;
// it reports whether that convicts it: at once for an error that is surely
// the record's (convictable), else at the maxAloneRefusals-th time.
func (ps *Poison) refusedAlone(key string, err error) bool {
	if convictable(err) || ps == nil {
		return true
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	v := ps.m[key]
	if v.alone+1 >= maxAloneRefusals {
		return true
	}
	v.err, v.alone = err, v.alone+1
	if ps.m == nil {
		ps.m = map[string]verdict{}
	}
	ps.m[key] = v
	ps.n.Store(int64(len(ps.m)))
	return false
}

// convictable reports a refusal that is surely the record's own, whoever
// else shared its batch: Kafka's answers about a record's data (franz-go
// answers MESSAGE_TOO_LARGE itself for a record larger than a batch may be).
// CORRUPT_MESSAGE and UNKNOWN_SERVER_ERROR are not among them: a damaged
// request or a broker's passing trouble give them too.
func convictable(err error) bool {
	for _, e := range []error{kerr.InvalidTimestamp, kerr.InvalidRecord, kerr.MessageTooLarge,
		kerr.RecordListTooLarge, kerr.PolicyViolation, kerr.InvalidTopicException} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// acquit forgets a record Kafka took alone.
func (ps *Poison) acquit(key string) {
	if ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.m, key)
	ps.n.Store(int64(len(ps.m)))
}

// lookup returns what is known of the record of row id for topic. The key
// is built only when something is known at all.
func (ps *Poison) lookup(topic string, id rowID) (verdict, bool) {
	if ps == nil || ps.n.Load() == 0 {
		return verdict{}, false
	}
	key := poisonKey(topic, id)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	v, ok := ps.m[key]
	return v, ok
}

// rowID identifies an outbox row across sessions: its place in the WAL
// (its transaction's commit LSN and its own LSN; the rows of a snapshot
// all have LSN 0 and the snapshot's LSN as commit LSN, the rows of one
// multi-insert (COPY) share an LSN) and a hash of its event id (the column
// table.field.event.id names), or, for a row without one, of all its
// columns, and then its ordinal among the events at its position too.
//
// The event id, not the ordinal, tells apart the rows of one position in
// a poison key (poisonKey): a snapshot taken again after a failure reads
// the table as it is then, where rows before this one may be gone. The
// ordinal is what a row without an event id has; the WAL gives the same
// events in the same order when read again, and so does a snapshot of an
// unchanged table.
type rowID struct {
	commit, lsn uint64
	ord         uint32
	// seq is the row's index among the events of its transaction (from
	// 0): with commit, its place for the exactly-once position.
	seq  uint32
	id   uint64 // FNV-1a of the event id, or of every column
	byID bool   // id hashes an event id
}

// identify returns the rowID of the next event, row. It must see every
// event, in order: the ordinal counts the events at one position.
func (p *Producer) identify(row *route.Row) rowID {
	if row == nil {
		return rowID{}
	}
	src := &row.Source
	// The rows of a snapshot (LSN 0) have the slot's consistent point as
	// their commit LSN, which the first streamed transaction may have too:
	// it is another transaction, and its events count from 0.
	same := src.CommitLSN == p.at.commit && (src.LSN == 0) == (p.at.lsn == 0)
	switch {
	case same && src.LSN == p.at.lsn:
		p.at.ord++
		p.at.seq++
	case same:
		p.at = rowID{commit: src.CommitLSN, lsn: src.LSN, seq: p.at.seq + 1}
	default:
		p.at = rowID{commit: src.CommitLSN, lsn: src.LSN}
	}
	id := p.at
	// FNV-1a, inline: no allocation per record.
	h := uint64(14695981039346656037)
	add := func(b []byte) {
		for _, c := range b {
			h ^= uint64(c)
			h *= 1099511628211
		}
	}
	if c := row.Lookup(p.idField); c != nil && !c.Null {
		add(c.Value)
		id.byID = true
	} else {
		for i := range row.Columns {
			c := &row.Columns[i]
			add([]byte(c.Name))
			if c.Null {
				add([]byte{0})
			} else {
				add([]byte{1})
				add(c.Value)
			}
		}
	}
	id.id = h
	return id
}

// poisonKey identifies a record across sessions: its topic and its row
// (the ordinal only for a row without an event id: see rowID).
func poisonKey(topic string, id rowID) string {
	ord := uint64(id.ord)
	if id.byID {
		ord = 0
	}
	b := make([]byte, 0, len(topic)+64)
	b = append(b, topic...)
	for _, v := range [...]uint64{id.commit, id.lsn, ord, id.id} {
		b = append(b, 0)
		b = strconv.AppendUint(b, v, 16)
	}
	return string(b)
}

// fault is what a produce error means for the line. classify is the one
// place that decides it.
type fault uint8

const (
	faultNone      fault = iota
	faultStop            // the session is ending (shutdown, client closed, halted): read again, no verdict
	faultFenced          // another producer took the transactional id: the lease is lost
	faultFatal           // the deployment's (credentials, ACLs): stop, say why
	faultTransient       // Kafka or the client, not the record: read again after the relay's backoff
	faultRecord          // Kafka refused the record's batch for the data's sake: suspects
)

// producerState are non-retriable errors about the producer's state, not
// about a record's data: the session restarts with a new producer.
var producerState = map[int16]bool{
	kerr.OutOfOrderSequenceNumber.Code:     true,
	kerr.DuplicateSequenceNumber.Code:      true,
	kerr.UnknownProducerID.Code:            true,
	kerr.InvalidProducerIDMapping.Code:     true,
	kerr.InvalidTxnState.Code:              true,
	kerr.InvalidTransactionTimeout.Code:    true,
	kerr.TransactionCoordinatorFenced.Code: true,
	kerr.TransactionAbortable.Code:         true,
	kerr.UnsupportedVersion.Code:           true,
	kerr.UnsupportedForMessageFormat.Code:  true,
	kerr.InvalidRequiredAcks.Code:          true,
	// Not flagged retriable, but franz-go retries it (KIP-890): the
	// previous transaction's markers are still being written.
	kerr.ConcurrentTransactions.Code: true,
}

// classify decides what a record's produce error means. Kafka's own
// classification decides retriable against not (kerr.IsRetriable, the
// protocol's "retriable" flag): franz-go retries those itself, with its
// backoff and without limit under our options, so one that reaches a
// promise (a retry limit) is transient, read again after the relay's
// backoff, never the record's fault. CORRUPT_MESSAGE is the exception:
// flagged retriable, but franz-go does not retry it, and brokers answer it
// for a record's own faults too (a null key on a compacted topic, before
// INVALID_RECORD existed), so it is the record's; a record it hit by
// accident passes when produced alone. A non-retriable Kafka error is the
// record's (its batch's) unless it is about the deployment (fatal) or the
// producer's state; an error franz-go raises before sending (a partition
// the topic lacks, a record over the batch limit) is the record's too.
func classify(err error) fault {
	var ke *kerr.Error
	switch {
	case err == nil:
		return faultNone
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting):
		return faultStop
	case isFenced(err):
		return faultFenced
	case isFatalKafka(err):
		return faultFatal
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries), errors.Is(err, kgo.ErrMaxBuffered):
		return faultTransient
	case errors.Is(err, kerr.CorruptMessage):
		return faultRecord
	case errors.As(err, &ke):
		if kerr.IsRetriable(err) || producerState[ke.Code] {
			return faultTransient
		}
		return faultRecord
	case strings.Contains(err.Error(), "no usable partitions"):
		// kgo: no partition of the topic has a leader now.
		return faultTransient
	}
	return faultRecord
}

// ClassRefused is the dead-letter class of a record Kafka refused for its
// own account when produced alone (INVALID_TIMESTAMP, INVALID_RECORD,
// POLICY_VIOLATION, ...); the DLQ record's error header holds the broker's
// error.
const ClassRefused route.ErrorClass = "kafka-refused"

// refusedCause is the dead-letter cause of a record Kafka refused alone
// with err: too large ones belong in the table (rule 7), a topic Kafka
// rejects keeps its own class.
func refusedCause(err error) *route.Error {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return &route.Error{Class: route.ClassTooLarge, Msg: "Kafka refused the record as too large, produced alone", Err: err}
	case errors.Is(err, kerr.InvalidTopicException):
		return &route.Error{Class: route.ClassInvalidTopic, Msg: "Kafka rejected the topic", Err: err}
	}
	return &route.Error{Class: ClassRefused, Msg: "Kafka refused the record, produced alone", Err: err}
}

// dlqRefusedError is the dead-letter cause of an event whose DLQ record
// Kafka refused too, produced alone: the event goes to the table with both
// reasons. Its class (classOf, errors.As) is the original cause's, the
// reason the event is a dead letter at all.
type dlqRefusedError struct {
	cause error  // why the event is a dead letter
	topic string // the DLQ topic
	err   error  // Kafka's refusal of the DLQ record
}

func (e *dlqRefusedError) Error() string {
	return e.cause.Error() + "; Kafka refused its dead letter (DLQ topic " + strconv.Quote(e.topic) + ") too, produced alone: " + e.err.Error()
}

// Unwrap gives the original cause first, so that errors.As finds its class.
func (e *dlqRefusedError) Unwrap() []error { return []error{e.cause, e.err} }

// refusedError ends a Kafka transaction in which Kafka refused records for
// their own account; they are suspects now.
type refusedError struct {
	err error // the first record's error
	n   int   // records refused
}

func (e *refusedError) Error() string {
	return "Kafka refused " + strconv.Itoa(e.n) + " record(s) of the transaction: " + e.err.Error() +
		"; aborting it and reading again from the confirmed position, where each is produced alone"
}

func (e *refusedError) Unwrap() error { return e.err }
