package publish

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	faultstep "github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
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

// ErrFenced is lease.ErrFenced: this producer may no longer publish, Kafka
// fenced its transactional id (a newer leader initialised it) or the
// lease's deadline passed.
var ErrFenced = lease.ErrFenced

// isFenced reports Kafka's answers to a producer whose epoch is not the
// newest: another producer initialised the same transactional id.
func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
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
	span     trace.Span // the relay span (Config.Tracer), or nil
}

type txnState struct {
	open    bool
	started time.Time
	recs    []txnRec
	// lanes are the transactional clients: lanes[0] the producer's client,
	// lanes[1] Config.Pipeline (nil: none); cur is the open transaction's.
	lanes [2]lane
	cur   int
	// pending is the commit in flight on the other lane (pipelined), or
	// nil; spare is a finished commit's records slice, for reuse.
	pending *pendingCommit
	spare   []txnRec
	// failed holds the errors of the records whose promise reported one,
	// by their index in recs, under Producer.mu. Every record shares one
	// promise (txnPromise), so a record costs no closure; its context
	// carries its index (recIndex, from slab).
	failed  map[int]error
	bad     atomic.Bool // a record failed: the transaction is lost
	promise func(*kgo.Record, error)
	slab    []recIndex
	timer   *time.Timer
	// linger is the age before which a transaction commits only at
	// TxnMaxRecords: zero under light load, four times the last commit's
	// duration under load.
	linger     time.Duration
	lastCommit time.Duration
	// lastFlush is how long the last commit's flush took: pipelined, the
	// only part of a commit that stops the line.
	lastFlush time.Duration
}

// lane is one transactional client and its failure watch (nil without
// one), which tells whether franz-go ended a commit as an abort
// (endCommit).
type lane struct {
	client *kgo.Client
	watch  *failureWatch
}

// pendingCommit is a Kafka transaction flushed and checked, whose EndTxn
// runs on its lane while the other lane takes the next transaction.
type pendingCommit struct {
	lane  lane
	recs  []txnRec
	start time.Time
	done  chan error // the commit's result, once
}

// pipelined reports whether commits overlap the next transaction.
func (p *Producer) pipelined() bool { return p.txn.lanes[1].client != nil }

// txnClient is the client of the open (or next) transaction.
func (p *Producer) txnClient() *kgo.Client { return p.txn.lanes[p.txn.cur].client }

// valid reports whether this instance may still publish.
func (p *Producer) valid() bool { return p.cfg.Valid == nil || p.cfg.Valid() }

// runTxn is Run in transactional mode.
func (p *Producer) runTxn(ctx context.Context, in <-chan wal.Event, onFatal func()) error {
	p.txn.lanes[0].client = p.client
	p.txn.lanes[1].client = p.cfg.Pipeline
	for i := range p.txn.lanes {
		if cl := p.txn.lanes[i].client; cl != nil {
			p.txn.lanes[i].watch, _ = cl.OptValue(kgo.WithLogger).(*failureWatch)
		}
	}
	p.txn.timer = time.NewTimer(time.Hour)
	p.txn.timer.Stop()
	defer p.txn.timer.Stop()
	fail := func(err error) error {
		onFatal()
		// A commit in flight may have failed for a graver reason (the
		// second transactional id fenced or refused).
		return p.graver(err, p.abort())
	}
	for {
		var due <-chan time.Time
		if p.txn.open {
			due = p.txn.timer.C
		}
		var settled <-chan error
		if p.txn.pending != nil {
			settled = p.txn.pending.done
		}
		select {
		case err := <-settled:
			// The commit in flight ended. Pipelined, the next begins at
			// once when events wait in the open transaction: commits
			// follow each other with no interval that idles.
			if err := p.finish(p.txn.pending, err); err != nil {
				return fail(err)
			}
			if p.txn.open && p.due(in) {
				if err := p.startCommit(ctx); err != nil {
					return fail(err)
				}
				p.adapt(in)
			}
		case ev, ok := <-in:
			if !ok {
				if p.unfinished() {
					// The stream stopped inside a PostgreSQL transaction
					// (a graceful stop's grace ran out, or it failed):
					// nothing of that transaction can be confirmed, the
					// next session reads it again whole. Committed, what
					// of it is open here would be published twice;
					// aborted, it is not, and nothing is lost: what else
					// the Kafka transaction holds is undone too and read
					// again. (What earlier Kafka transactions committed of
					// it is not published again: the position they carried
					// counts those events, and the next session skips them.)
					p.log.Info("the stream stopped inside a PostgreSQL transaction; aborting the open Kafka transaction, which the next session writes again")
					err := p.graver(p.settle(), p.abort())
					if err != nil {
						onFatal()
					}
					return err
				}
				if err := p.commit(ctx); err != nil {
					return fail(err)
				}
				return nil
			}
			if err := p.handle(ctx, ev); err != nil {
				return fail(err)
			}
			switch {
			case !p.txn.open:
			case p.pipelined() && len(p.txn.recs) >= p.cfg.TxnMaxRecords:
				// Bounded memory: wait for the commit in flight.
				if err := p.settle(); err != nil {
					return fail(err)
				}
				fallthrough
			case p.pipelined() && p.txn.pending == nil && p.due(in):
				if err := p.startCommit(ctx); err != nil {
					return fail(err)
				}
				p.adapt(in)
			case p.pipelined():
			case len(p.txn.recs) >= p.cfg.TxnMaxRecords || len(in) == 0 && time.Since(p.txn.started) >= p.txn.linger:
				if err := p.commit(ctx); err != nil {
					return fail(err)
				}
				p.adapt(in)
			}
		case <-due:
			if p.pipelined() {
				// A commit in flight: the open transaction commits
				// when it ends (settled). None: at once.
				if p.txn.pending == nil {
					if err := p.startCommit(ctx); err != nil {
						return fail(err)
					}
					p.adapt(in)
				}
				continue
			}
			if err := p.commit(ctx); err != nil {
				return fail(err)
			}
			p.adapt(in)
		case <-ctx.Done():
			// The lease is lost (or the graceful stop ran out of time):
			// publish nothing more; abort what is open.
			return p.graver(ctx.Err(), p.abort())
		}
	}
}

// sendTxn produces rec in the open transaction (opening one if needed).
// intended is the topic a DLQ record's event was meant for.
func (p *Producer) sendTxn(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, intended string, dlq bool) error {
	if p.txn.bad.Load() {
		// A record failed: the transaction cannot commit. Produce
		// nothing more into it; find out why and end the session.
		if err := p.commit(ctx); err != nil {
			return err
		}
	}
	size := RecordSize(rec)
	if !p.txn.open {
		if err := p.txnClient().BeginTransaction(); err != nil {
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
	var span trace.Span
	if !dlq { // a dead letter's record is not the one the span named
		span, p.span = p.span, nil
	}
	p.txn.recs = append(p.txn.recs, txnRec{txn: ev.Txn, id: id, commit: ev.Row.Source.CommitTime, topic: rec.Topic, intended: intended, dlq: dlq, size: size, span: span})
	if p.txn.promise == nil {
		p.txn.promise = p.txnPromise
	}
	if len(p.txn.slab) == 0 {
		p.txn.slab = make([]recIndex, 1024)
	}
	ri := &p.txn.slab[0]
	p.txn.slab = p.txn.slab[1:]
	*ri = recIndex{Context: ctx, i: len(p.txn.recs) - 1, span: span}
	rec.Context = ri
	p.txnClient().Produce(ctx, rec, p.txn.promise)
	p.in(ev, id)
	return nil
}

// recIndex is a record's context in a transaction: the context it was
// produced with, and its index in the transaction's records. They are cut
// from a shared slab, so a record costs no allocation of its own, and the
// records are not kept after Kafka acknowledged them.
type recIndex struct {
	context.Context
	i    int
	span trace.Span // the relay span, told where Kafka put the record
}

// txnPromise is the promise of every record produced in a transaction.
func (p *Producer) txnPromise(r *kgo.Record, err error) {
	p.answers.Add(1)
	if err == nil {
		if ri, ok := r.Context.(*recIndex); ok && ri.span != nil {
			// Ended at the commit (finish): Kafka's ack of a record
			// in a transaction is its commit.
			ackSpan(ri.span, r)
			ri.span = nil
		}
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
	p.txn.bad.Store(true)
}

// unfinished reports whether the open Kafka transaction holds a record of
// a PostgreSQL transaction whose commit the stream did not read. Called
// once the stream closed its channel: every commit it read is recorded.
func (p *Producer) unfinished() bool {
	if !p.txn.open {
		return false
	}
	for i := len(p.txn.recs) - 1; i >= 0; i-- {
		if !p.txn.recs[i].txn.Committed() {
			return true
		}
	}
	return false
}

// loadMark is how many events waiting after a commit mean load.
const loadMark = 128

// adapt sets the next transaction's linger from the commit that just
// ended (pipelined: just started): events that piled up during it mean
// load. An event or two is a trickle, for which committing at once is
// cheapest in latency. Under load a transaction stays open at least four
// times as long as what stopped the line for the last commit (the whole
// commit; pipelined, its flush alone, the EndTxn running beside the next
// transaction), so at most a fifth of the time goes to committing.
func (p *Producer) adapt(in <-chan wal.Event) {
	if len(in) < max(min(cap(in)/2, loadMark), 1) {
		p.txn.linger = 0
		return
	}
	stall := p.txn.lastCommit
	if p.pipelined() {
		stall = p.txn.lastFlush
	}
	p.txn.linger = min(4*stall, p.cfg.TxnInterval)
}

// due reports, pipelined, whether the open transaction should commit once
// no commit is in flight: at once when the stream has nothing more to hand
// over (latency), or once it is as old as its linger (under load).
func (p *Producer) due(in <-chan wal.Event) bool {
	return len(in) == 0 || time.Since(p.txn.started) >= p.txn.linger
}

// commit flushes the open transaction and commits it, then marks its
// records done; a commit in flight ends first. Any failure leaves them
// undone: the session ends, and the next one (a new producer epoch, which
// aborts this transaction) reads them again from the confirmed position.
func (p *Producer) commit(ctx context.Context) error {
	if err := p.settle(); err != nil {
		if p.txn.open && p.txn.bad.Load() {
			// A record of the open transaction failed too: find out
			// which, so that a record Kafka refused is a suspect for
			// the next session (see Poison), as after a commit.
			if ferr := p.flush(ctx, p.txnClient()); ferr == nil {
				err = p.graver(err, p.recordErrors())
			}
		}
		return err
	}
	if err := p.startCommit(ctx); err != nil {
		return err
	}
	return p.settle()
}

// startCommit flushes the open transaction (its position with it), checks
// that every record of it was taken and that the lease still holds, and
// ends it: pipelined, on its lane while the other lane takes the next
// transaction (its records produced only now, after every record of this
// one was acknowledged, so a partition holds them in order); otherwise
// here. Its result is pending until settle or finish.
func (p *Producer) startCommit(ctx context.Context) error {
	if !p.txn.open {
		return nil
	}
	start := time.Now()
	p.txn.timer.Stop()
	p.writePosition(ctx)
	ln := p.txn.lanes[p.txn.cur]
	if err := p.flush(ctx, ln.client); err != nil {
		return fmt.Errorf("flush the Kafka transaction: %w", err)
	}
	p.txn.lastFlush = time.Since(start)
	if err := p.recordErrors(); err != nil {
		return err
	}
	if err := p.positionError(); err != nil {
		return err
	}
	if p.txn.bad.Load() {
		// A record of it failed and recordErrors said so before, to a
		// caller that went on: a transaction that lost a record never
		// commits, or the record would be acked unpublished.
		return errors.New("a record of the open Kafka transaction failed; aborting it and reading again from the confirmed position")
	}
	// Checked after the flush, right before the commit: a leader past its
	// deadline (a process resumed after a freeze) commits nothing. Kafka's
	// fencing covers the rest of the way.
	if !p.valid() {
		return fmt.Errorf("%w: the leader lease's deadline passed before the Kafka transaction committed; aborting it", ErrFenced)
	}
	if err := p.cfg.Faults.At(faultstep.BeforeKafkaCommit); err != nil {
		return err
	}
	pc := &pendingCommit{lane: ln, recs: p.txn.recs, start: start, done: make(chan error, 1)}
	p.txn.open = false
	p.txn.recs, p.txn.spare = p.txn.spare[:0], nil
	p.txn.pending = pc
	end := func() {
		err := p.endCommit(ctx, ln, len(pc.recs))
		if err == nil {
			// Committed at Kafka, not yet acked here: a failure now
			// leaves the records unacked, read again, and skipped as in
			// Kafka by the position (published again without one).
			err = p.cfg.Faults.At(faultstep.AfterKafkaCommit)
		}
		pc.done <- err
	}
	if p.pipelined() {
		p.txn.cur ^= 1
		go end()
		return nil
	}
	end()
	return nil
}

// settle waits for the commit in flight, if any, and does what its result
// means (finish).
func (p *Producer) settle() error {
	pc := p.txn.pending
	if pc == nil {
		return nil
	}
	return p.finish(pc, <-pc.done)
}

// finish does what the result of a pending commit means: its records are
// acked, or the error says why not.
func (p *Producer) finish(pc *pendingCommit, err error) error {
	p.txn.pending = nil
	if p.cfg.Tracer != nil {
		endTxnSpans(pc.recs, err)
	}
	if err != nil {
		// Ended promptly, so that read_committed consumers (and the next
		// session's read of the position) are not held back until a new
		// epoch aborts it.
		p.abortLane(pc.lane.client)
		if isFenced(err) {
			return fmt.Errorf("%w: commit the Kafka transaction: %w", ErrFenced, err)
		}
		if isFatalKafka(err) {
			return &fatal.Error{Msg: "Kafka refused the transaction; grant WRITE and DESCRIBE on transactional ids with the prefix outbox-connector-, or set OUTBOX_KAFKA_TRANSACTIONAL=false", Err: err}
		}
		return fmt.Errorf("commit the Kafka transaction: %w", err)
	}
	p.txn.lastCommit = time.Since(pc.start)
	p.positionCommitted()
	p.metrics.KafkaTxns.WithLabelValues("commit").Inc()
	p.metrics.KafkaTxnCommit.Observe(p.txn.lastCommit.Seconds())
	for i := range pc.recs {
		r := &pc.recs[i]
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
	clear(pc.recs)
	p.txn.spare = pc.recs[:0]
	return nil
}

// errCommitAborted: franz-go ended a commit as an abort (see endCommit).
var errCommitAborted = errors.New("franz-go ended the Kafka transaction as an abort although its records were produced (it counted no partition as added to the transaction); reading them again from the confirmed position")

// errCommitSkipped: franz-go ended a commit without a transaction although
// records were produced in it (see endCommit).
var errCommitSkipped = errors.New("franz-go ended the Kafka transaction without committing it although records were produced in it (it counted no partition as added to the transaction and sent no EndTxn); reading them again from the confirmed position")

// endCommit commits the open transaction of lane ln, which holds n
// records. franz-go (v1.22.3) may end it as
// an abort instead and return nil: when it counts no partition as added to
// the transaction although a record of it was produced and its promise
// reported success (seen when the transaction's first record went to a
// topic the client had not produced to yet, with a cluster of several
// brokers; under -race about one commit in fifty, TestTxnCommitNotDowngraded),
// it logs emptyEndMsg and issues an abort. Taken as a commit, its records
// would be acked and the position confirmed past records no
// read_committed consumer will ever see. The failure watch catches the
// line, which franz-go logs within this call: the commit failed, the
// session ends, and the records are read again.
//
// On the other branch of the same miscount (a broker before KIP-890 part
// 2, Kafka 4.0, or no produce counted as attempted) franz-go sends no
// EndTxn at all, logs noTxnEndMsg at debug level and returns nil: the
// records are left in a transaction the broker aborts at its timeout. With
// no record produced that is an empty transaction, legal and no failure;
// with one (n > 0, every record produced into this transaction, whose
// promises all reported success), the commit failed likewise. There is no
// signal but the line: franz-go keeps what it counts as added unexported,
// and counting records does not help, since its promises reported success
// for each of them; asking the broker (DescribeTransactions) would cost a
// round trip per commit and an ACL.
func (p *Producer) endCommit(ctx context.Context, ln lane, n int) error {
	w := ln.watch
	if w != nil {
		w.emptyEnd.Store(false)
		w.noTxnEnd.Store(false)
		w.ending.Store(true)
		defer w.ending.Store(false)
	}
	if err := ln.client.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return err
	}
	if w != nil && w.emptyEnd.Load() {
		p.log.Warn(errCommitAborted.Error())
		return errCommitAborted
	}
	if w != nil && w.noTxnEnd.Load() && n > 0 {
		err := fmt.Errorf("%w (%d records produced)", errCommitSkipped, n)
		p.log.Warn(err.Error())
		return err
	}
	return nil
}

// recordErrors examines the records of the flushed transaction; any
// failure aborts it. Records Kafka refused for their own account become
// suspects (see Poison), to be produced alone when read again: the error is
// then a *refusedError.
func (p *Producer) recordErrors() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.txn.failed) == 0 {
		return nil
	}
	defer clear(p.txn.failed)
	var first, fenced, stop error
	refused := 0
	for i := -1; i < len(p.txn.recs); i++ { // -1: a record sendTxn did not produce (cannot happen)
		err := p.txn.failed[i]
		if err == nil {
			continue
		}
		switch classify(err) {
		case faultFenced:
			fenced = err
		case faultFatal:
			topic := ""
			if i >= 0 {
				topic = p.txn.recs[i].topic
			}
			stop = &fatal.Error{Msg: fmt.Sprintf("Kafka refused to accept records for topic %q; check the connector's Kafka credentials and ACLs (WRITE and DESCRIBE on the topics and the transactional id)", topic), Err: err}
		case faultTransient:
			if i >= 0 && isDataLoss(err) {
				p.dataLoss(p.txn.recs[i].topic, err)
			}
		case faultRecord:
			if i >= 0 {
				r := &p.txn.recs[i]
				if p.cfg.Poison.suspect(poisonKey(r.topic, r.id), err) {
					p.metrics.KafkaRefused.WithLabelValues(r.topic, "suspect").Inc()
				}
				refused++
			}
		}
		if first == nil {
			first = err
		}
	}
	switch {
	case fenced != nil:
		return fmt.Errorf("%w: produce in the Kafka transaction: %w", ErrFenced, fenced)
	case stop != nil:
		return stop
	case refused > 0 && classify(first) == faultRecord:
		err := &refusedError{err: first, n: refused}
		p.log.Warn(err.Error())
		return err
	}
	p.log.Warn("a record of the Kafka transaction failed; aborting it and reading again from the confirmed position", "err", first)
	return fmt.Errorf("produce in the Kafka transaction: %w", first)
}

// aloneTxn produces a suspect in a transaction of its own: what is open is
// committed first. A refusal is a *refusedError, the transaction aborted.
func (p *Producer) aloneTxn(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, intended string, dlq bool) error {
	if err := p.commit(ctx); err != nil {
		var rf *refusedError
		if errors.As(err, &rf) {
			// Kafka refused records of the open transaction, not this
			// one, which was not produced: no verdict on it (alone takes
			// a *refusedError for its refusal). The session ends; those
			// records are suspects now, and this one is produced alone
			// in the next session.
			return errors.New(rf.Error())
		}
		return err
	}
	if err := p.sendTxn(ctx, ev, id, rec, intended, dlq); err != nil {
		return err
	}
	err := p.commit(ctx)
	var rf *refusedError
	if errors.As(err, &rf) {
		err = p.graver(err, p.abort())
	}
	return err
}

// abort ends the open transaction without committing, promptly, so that
// read_committed consumers are not held back until a new epoch aborts it,
// after the commit in flight (pipelined) has ended one way or the other:
// committed, its records are acked (they are in Kafka); failed, it is
// aborted too (finish), and its error is returned. Other errors do not
// matter: the session ends, and the next epoch aborts whatever is left.
func (p *Producer) abort() error {
	var perr error
	if pc := p.txn.pending; pc != nil {
		// The commit's own context is the session's: cancelled, its
		// EndTxn returns at once; otherwise it ends within a round trip
		// or its retries.
		select {
		case err := <-pc.done:
			perr = p.finish(pc, err)
		case <-time.After(pendingWait):
			// Its lane is busy in EndTxn (which holds the client's
			// transaction lock): the next session's producer epoch
			// aborts it if it did not commit.
			p.txn.pending = nil
			perr = fmt.Errorf("the Kafka transaction being committed had no answer within %s; the next session's producer epoch aborts it if it did not commit", pendingWait)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cl := p.txnClient()
	_ = cl.AbortBufferedRecords(ctx)
	if len(p.txn.recs) > 0 || p.txn.open {
		if err := cl.EndTransaction(ctx, kgo.TryAbort); err == nil {
			p.metrics.KafkaTxns.WithLabelValues("abort").Inc()
		} else {
			p.log.Warn("aborting the open Kafka transaction failed; the next session's producer epoch aborts it", "err", err)
		}
	}
	p.txn.open = false
	if p.cfg.Tracer != nil {
		endTxnSpans(p.txn.recs, errAborted)
	}
	clear(p.txn.recs)
	p.txn.recs = p.txn.recs[:0]
	p.mu.Lock()
	clear(p.txn.failed)
	p.mu.Unlock()
	p.txn.bad.Store(false)
	p.eo.aborted()
	return perr
}

// errAborted ends the spans of an aborted Kafka transaction's records.
var errAborted = errors.New("the Kafka transaction was aborted; read again from the confirmed position")

// graver is the graver of two errors of one failure, for the session's
// verdict: a fatal error (the connector stops) before a fenced one (the
// instance steps down) before any other, a stop's own (context.Canceled)
// last; of two alike, the first.
func graver(a, b error) error {
	g, _ := order(a, b)
	return g
}

// order is graver's choice, and the other error.
func order(a, b error) (graver, lesser error) {
	rank := func(err error) int {
		switch {
		case err == nil:
			return -1
		case fatal.Is(err):
			return 3
		case errors.Is(err, ErrFenced):
			return 2
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return 0
		}
		return 1
	}
	if rank(b) > rank(a) {
		return b, a
	}
	return a, b
}

// graver is graver(a, b), the other error logged rather than dropped
// (unless it is only the stop's cancellation).
func (p *Producer) graver(a, b error) error {
	g, lesser := order(a, b)
	if lesser != nil && g != nil && !errors.Is(lesser, context.Canceled) && !errors.Is(lesser, context.DeadlineExceeded) {
		p.log.Warn("a second error of the same failure, after the one the session ends with", "err", lesser, "reported", g)
	}
	return g
}

// pendingWait bounds abort's wait for the commit in flight.
const pendingWait = 10 * time.Second

// abortLane aborts what a lane's failed commit left open.
func (p *Producer) abortLane(cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err == nil {
		p.metrics.KafkaTxns.WithLabelValues("abort").Inc()
	} else {
		p.log.Warn("aborting what a failed Kafka commit left open failed; the next session's producer epoch aborts it", "err", err)
	}
}
