package publish

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/connector/lease"
	"github.com/pgoutbox/pgoutbox/connector/tracker"
	"github.com/pgoutbox/pgoutbox/connector/wal"
	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

// Transactional mode. Every record goes into a Kafka transaction of the
// slot's one transactional id; a record is done for the tracker (rule 1's
// "acked") only when its transaction committed. A new leader's
// InitProducerID bumps the id's epoch: from then on the old leader's
// produce requests and commits fail with PRODUCER_FENCED or
// INVALID_PRODUCER_EPOCH, and its open transaction is aborted, so a resumed
// zombie publishes nothing after the new leader started.
//
// Committing stops the pipeline: franz-go must not produce while ending a
// transaction (KIP-890), so each commit costs one flush (the acks of the
// transaction's last records) and one EndTxn round trip. When to commit
// trades latency against that stall:
//   - at once when the stream has nothing more to hand over, under light
//     load: latency is one commit;
//   - under load (the stream's channel at least half full when the last
//     commit ended), not before the transaction is four times as old as
//     that commit took: at most a fifth of the time goes to committing,
//     whatever the commit costs;
//   - always at TxnInterval after the transaction's first record, or once it
//     holds TxnMaxRecords records (bounded memory: the records are kept
//     until their transaction commits).
//
// A PostgreSQL transaction may span several Kafka transactions: the tracker
// confirms its end only once all are committed.

// ErrFenced is returned when this producer may no longer publish: Kafka
// fenced its transactional id (a newer leader initialised it), or the
// lease's deadline passed. It wraps lease.ErrLost.
var ErrFenced = fmt.Errorf("this instance may no longer publish: %w", lease.ErrLost)

// isFenced reports Kafka's answers to a producer whose epoch is not the
// newest: another producer initialised the same transactional id.
func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// Poison remembers records Kafka refused on their own account inside a
// transaction (the broker's size limit below ours, say). Such a record
// aborts its whole transaction; the session then restarts from the
// confirmed position, and when the record is read again it goes to the dead
// letters instead of into a transaction. It outlives sessions; safe for
// concurrent use.
type Poison struct {
	mu sync.Mutex
	m  map[string]error
	n  atomic.Int64 // len(m), read without the lock on every record
}

// maxPoison bounds the memory: poison is rare, and forgetting an entry only
// costs one more aborted transaction.
const maxPoison = 10000

func (ps *Poison) add(key string, err error) {
	if ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil || len(ps.m) >= maxPoison {
		ps.m = map[string]error{}
	}
	ps.m[key] = err
	ps.n.Store(int64(len(ps.m)))
}

// lookup returns why the record of row for topic is poison, if it is. The
// key is built only when something is poison at all.
func (ps *Poison) lookup(topic string, id rowID) error {
	if ps == nil || ps.n.Load() == 0 {
		return nil
	}
	key := poisonKey(topic, id)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[key]
}

// rowID identifies an outbox row across sessions: its place in the WAL
// (its transaction's commit LSN, its own LSN, and its ordinal among the
// events at that position: the rows of a snapshot all have LSN 0 and the
// snapshot's LSN as commit LSN, the rows of one multi-insert (COPY) share
// an LSN) and a hash of its event id (the column table.field.event.id
// names). Reading the WAL again gives the same events in the same order,
// and a snapshot is read in a fixed order, so a row has the same rowID in
// every session; two rows never share one.
type rowID struct {
	commit, lsn uint64
	ord         uint32
	id          uint64
}

// identify returns the rowID of the next event, row. It must see every
// event, in order: the ordinal counts the events at one position.
func (p *Producer) identify(row *route.Row) rowID {
	if row == nil {
		return rowID{}
	}
	src := &row.Source
	if src.CommitLSN == p.at.commit && src.LSN == p.at.lsn {
		p.at.ord++
	} else {
		p.at = rowID{commit: src.CommitLSN, lsn: src.LSN}
	}
	id := p.at
	// FNV-1a, inline: no allocation per record.
	h := uint64(14695981039346656037)
	if c := row.Lookup(p.idField); c != nil && !c.Null {
		for _, b := range c.Value {
			h ^= uint64(b)
			h *= 1099511628211
		}
	}
	id.id = h
	return id
}

// poisonKey identifies a record across sessions: its topic and its row.
func poisonKey(topic string, id rowID) string {
	b := make([]byte, 0, len(topic)+64)
	b = append(b, topic...)
	for _, v := range [...]uint64{id.commit, id.lsn, uint64(id.ord), id.id} {
		b = append(b, 0)
		b = strconv.AppendUint(b, v, 16)
	}
	return string(b)
}

// txnRec is what a record of the open transaction leaves behind once
// produced: enough to acknowledge it and to name it as poison, but not its
// row, which the garbage collector may take at once (a transaction holds up
// to OUTBOX_MAX_IN_FLIGHT records; a failed one is read again from the WAL).
type txnRec struct {
	txn      *tracker.Txn
	id       rowID
	commit   time.Time // the PostgreSQL commit time, for the latency metric
	topic    string
	intended string // for a DLQ record, the topic the event was meant for
	dlq      bool
	size     int
}

type txnState struct {
	open    bool
	started time.Time
	recs    []txnRec
	// failed holds the errors of the records whose promise reported one,
	// by their index in recs, under Producer.mu. Every record shares one
	// promise (txnPromise), so a record costs no closure; its context
	// carries its index (recIndex, from slab).
	failed  map[int]error
	promise func(*kgo.Record, error)
	slab    []recIndex
	timer   *time.Timer
	// linger is the age before which a transaction commits only at
	// TxnMaxRecords: zero under light load, four times the last commit's
	// duration under load.
	linger     time.Duration
	lastCommit time.Duration
}

// valid reports whether this instance may still publish.
func (p *Producer) valid() bool { return p.cfg.Valid == nil || p.cfg.Valid() }

// runTxn is Run in transactional mode.
func (p *Producer) runTxn(ctx context.Context, in <-chan wal.Event, onFatal func()) error {
	p.txn.timer = time.NewTimer(time.Hour)
	p.txn.timer.Stop()
	defer p.txn.timer.Stop()
	fail := func(err error) error {
		onFatal()
		p.abort()
		return err
	}
	for {
		var due <-chan time.Time
		if p.txn.open {
			due = p.txn.timer.C
		}
		select {
		case ev, ok := <-in:
			if !ok {
				if err := p.commit(ctx); err != nil {
					return fail(err)
				}
				return nil
			}
			if err := p.handle(ctx, ev); err != nil {
				return fail(err)
			}
			if p.txn.open && (len(p.txn.recs) >= p.cfg.TxnMaxRecords || len(in) == 0 && time.Since(p.txn.started) >= p.txn.linger) {
				if err := p.commit(ctx); err != nil {
					return fail(err)
				}
				p.adapt(in)
			}
		case <-due:
			if err := p.commit(ctx); err != nil {
				return fail(err)
			}
			p.adapt(in)
		case <-ctx.Done():
			// The lease is lost (or the graceful stop ran out of time):
			// publish nothing more; abort what is open.
			p.abort()
			return ctx.Err()
		}
	}
}

// sendTxn produces rec in the open transaction (opening one if needed).
// intended is the topic a DLQ record's event was meant for.
func (p *Producer) sendTxn(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, intended string, dlq bool) error {
	if !p.valid() {
		return fmt.Errorf("%w (the leader lease's deadline passed)", ErrFenced)
	}
	size := recordSize(rec)
	if cause := p.cfg.Poison.lookup(rec.Topic, id); cause != nil {
		if !dlq && errors.Is(cause, kerr.InvalidTopicException) {
			return p.deadLetter(ctx, ev, id, rec.Topic, &route.Error{Class: route.ClassInvalidTopic, Msg: "Kafka rejected the topic", Err: cause})
		}
		if !dlq {
			intended = rec.Topic
		}
		return p.deadLetterTable(ctx, ev, id, intended, &route.Error{Class: route.ClassTooLarge, Msg: "Kafka rejected the record", Err: cause})
	}
	if !p.txn.open {
		if err := p.client.BeginTransaction(); err != nil {
			if isFenced(err) {
				return fmt.Errorf("%w: begin a Kafka transaction: %w", ErrFenced, err)
			}
			return fmt.Errorf("begin a Kafka transaction: %w", err)
		}
		p.txn.open = true
		p.txn.started = time.Now()
		if p.txn.linger > 0 {
			p.txn.timer.Reset(p.txn.linger)
		} else {
			p.txn.timer.Reset(p.cfg.TxnInterval)
		}
	}
	p.txn.recs = append(p.txn.recs, txnRec{txn: ev.Txn, id: id, commit: ev.Row.Source.CommitTime, topic: rec.Topic, intended: intended, dlq: dlq, size: size})
	if p.txn.promise == nil {
		p.txn.promise = p.txnPromise
	}
	if len(p.txn.slab) == 0 {
		p.txn.slab = make([]recIndex, 1024)
	}
	ri := &p.txn.slab[0]
	p.txn.slab = p.txn.slab[1:]
	*ri = recIndex{Context: ctx, i: len(p.txn.recs) - 1}
	rec.Context = ri
	p.client.Produce(ctx, rec, p.txn.promise)
	return nil
}

// recIndex is a record's context in a transaction: the context it was
// produced with, and its index in the transaction's records. They are cut
// from a shared slab, so a record costs no allocation of its own, and the
// records are not kept after Kafka acknowledged them.
type recIndex struct {
	context.Context
	i int
}

// txnPromise is the promise of every record produced in a transaction.
func (p *Producer) txnPromise(r *kgo.Record, err error) {
	if err == nil {
		return
	}
	i := -1 // not produced by sendTxn (cannot happen): fails the transaction
	if ri, ok := r.Context.(*recIndex); ok {
		i = ri.i
	}
	p.mu.Lock()
	if p.txn.failed == nil {
		p.txn.failed = map[int]error{}
	}
	p.txn.failed[i] = err
	p.mu.Unlock()
}

// loadMark is how many events waiting after a commit mean load.
const loadMark = 128

// adapt sets the next transaction's linger from the commit that just
// ended: events that piled up during it mean load. An event or two is a
// trickle, for which committing at once is cheapest in latency.
func (p *Producer) adapt(in <-chan wal.Event) {
	if len(in) < max(min(cap(in)/2, loadMark), 1) {
		p.txn.linger = 0
		return
	}
	p.txn.linger = min(4*p.txn.lastCommit, p.cfg.TxnInterval)
}

// commit flushes the open transaction and commits it, then marks its
// records done. Any failure leaves them undone: the session ends, and the
// next one (a new producer epoch, which aborts this transaction) reads them
// again from the confirmed position.
func (p *Producer) commit(ctx context.Context) error {
	if !p.txn.open {
		return nil
	}
	start := time.Now()
	p.txn.timer.Stop()
	if err := p.client.Flush(ctx); err != nil {
		return fmt.Errorf("flush the Kafka transaction: %w", err)
	}
	if err := p.recordErrors(); err != nil {
		return err
	}
	// Checked after the flush, right before the commit: a leader past its
	// deadline (a process resumed after a freeze) commits nothing. Kafka's
	// fencing covers the rest of the way.
	if !p.valid() {
		return fmt.Errorf("%w: the leader lease's deadline passed before the Kafka transaction committed; aborting it", ErrFenced)
	}
	err := p.client.EndTransaction(ctx, kgo.TryCommit)
	p.txn.open = false
	if err != nil {
		if isFenced(err) {
			return fmt.Errorf("%w: commit the Kafka transaction: %w", ErrFenced, err)
		}
		if isFatalKafka(err) {
			return &wal.FatalError{Msg: "Kafka refused the transaction; grant WRITE and DESCRIBE on transactional ids with the prefix outbox-connector-, or set OUTBOX_KAFKA_TRANSACTIONAL=false", Err: err}
		}
		return fmt.Errorf("commit the Kafka transaction: %w", err)
	}
	p.txn.lastCommit = time.Since(start)
	p.metrics.KafkaTxns.WithLabelValues("commit").Inc()
	p.metrics.KafkaTxnCommit.Observe(p.txn.lastCommit.Seconds())
	for i := range p.txn.recs {
		r := &p.txn.recs[i]
		if !r.dlq {
			p.published(r.topic).Inc()
			if p.cfg.Published != nil {
				p.cfg.Published.Add(1)
			}
			if ct := r.commit; !ct.IsZero() {
				p.metrics.CommitToAck.Observe(time.Since(ct).Seconds())
			}
		}
		r.txn.Done()
	}
	clear(p.txn.recs)
	p.txn.recs = p.txn.recs[:0]
	return nil
}

// recordErrors examines the records of the flushed transaction. A record at
// fault is remembered as poison, so that it goes to the dead letters when
// read again; any failure aborts the transaction.
func (p *Producer) recordErrors() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.txn.failed) == 0 {
		return nil
	}
	defer clear(p.txn.failed)
	first := p.txn.failed[-1]
	var largest *txnRec
	var largestErr error
	for i := range p.txn.recs {
		r := &p.txn.recs[i]
		err := p.txn.failed[i]
		switch {
		case err == nil:
			continue
		case isFenced(err):
			return fmt.Errorf("%w: produce in the Kafka transaction: %w", ErrFenced, err)
		case isFatalKafka(err):
			return &wal.FatalError{Msg: fmt.Sprintf("Kafka refused to accept records for topic %q; check the connector's Kafka credentials and ACLs (WRITE and DESCRIBE on the topics and the transactional id)", r.topic), Err: err}
		case errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.InvalidRecord):
			p.cfg.Poison.add(poisonKey(r.topic, r.id), err)
		case isRecordFault(err):
			// Too large for the broker (its limit is below ours): the
			// large records of the batch are at fault, not their neighbours.
			if r.size > p.cfg.MaxMessageBytes/2 {
				p.cfg.Poison.add(poisonKey(r.topic, r.id), err)
			}
			if largest == nil || r.size > largest.size {
				largest, largestErr = r, err
			}
		}
		if first == nil {
			first = err
		}
	}
	if largest != nil && largest.size <= p.cfg.MaxMessageBytes/2 {
		p.cfg.Poison.add(poisonKey(largest.topic, largest.id), largestErr)
	}
	if first != nil {
		p.log.Warn("a record of the Kafka transaction failed; aborting it and reading again from the confirmed position (records Kafka refused go to the dead letters)", "err", first)
		return fmt.Errorf("produce in the Kafka transaction: %w", first)
	}
	return nil
}

// abort ends the open transaction without committing, promptly, so that
// read_committed consumers are not held back until a new epoch aborts it.
// Errors do not matter: the session ends, and the next epoch aborts
// whatever is left.
func (p *Producer) abort() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.client.AbortBufferedRecords(ctx)
	if len(p.txn.recs) > 0 || p.txn.open {
		if err := p.client.EndTransaction(ctx, kgo.TryAbort); err == nil {
			p.metrics.KafkaTxns.WithLabelValues("abort").Inc()
		}
	}
	p.txn.open = false
	clear(p.txn.recs)
	p.txn.recs = p.txn.recs[:0]
	p.mu.Lock()
	clear(p.txn.failed)
	p.mu.Unlock()
}
