package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// Idempotent mode (OUTBOX_KAFKA_TRANSACTIONAL=false): every record is
// produced on its own, with franz-go's idempotent producer, which keeps a
// partition's records in order across its retries; a record is done for the
// tracker when Kafka acked it.
//
// A record that fails ends the session, as a failed transaction does: no
// record is produced once a failure is seen (sendIdem checks before every
// one), the records not yet sent fail at once (their context, halt, is
// cancelled: franz-go fails a partition's unsent batches whose first
// record's context is done, recBatch.maybeFailErr), and Run returns; the
// relay starts the next session after its backoff, reading again from the
// confirmed position, where Kafka's suspects are produced alone (see
// Poison). Nothing is produced again within a session: a record produced
// again would come after the records of its key produced meanwhile, and
// without the partition the router chose; read again, it is routed again,
// in its place.
//
// The window. franz-go fails a partition's buffered records under the
// partition's lock, in its sink (handleReqRespBatch, finishBatch,
// failAllRecords), but runs their promises later, on its promise goroutine.
// A record produced in between goes into a fresh batch of that partition,
// is sent once franz-go has re-initialised the producer ID (a round trip),
// and can be acked before the failed records of its key are read again:
// it would overtake them (TestIdempotentWindowSeen holds the promise
// goroutine up and sees it happen). No hook runs under that lock on
// failure, but franz-go logs "batch in a produce request failed" there,
// before it fails the records: WatchFailures, wrapped around the client's
// logger, turns that line into an immediate halt, so every record buffered
// after the failure has a cancelled context before it can be sent, and no
// record is produced after it. Without the watch (or should franz-go's
// message change), the producer still learns of the failure from the first
// failed promise and cancels halt then, which closes the window unless the
// promise goroutine is late by more than that round trip; and what is left
// is seen exactly: a partition's promises run in its order, so a record
// acked after a failure of its key on its partition was produced after that
// failure. It is logged, counted (outbox_connector_order_violations_total),
// and not done: it is read again and published again after them.

// idemState is the idempotent mode's state of a session.
type idemState struct {
	halt   context.Context // every record's context; done once a record failed
	cancel context.CancelFunc
	wake   chan struct{} // wakes Run when a record failed

	halted atomic.Bool
	stop   atomic.Bool // WatchFailures saw a batch refused: produce nothing more
	alone  atomic.Bool // a suspect is produced alone: its failure is expected
	mu     sync.Mutex
	err    error // why the session ends
	rank   int   // err's weight: the fatal and the fenced win over others
	failed map[partKey]map[string]struct{}
}

// partKey is a partition of a topic.
type partKey struct {
	topic     string
	partition int32
}

// recEvent is a record's context without transactions: the session's halt
// context, and the record's event. They are cut from a shared slab, so a
// record costs no promise closure of its own.
type recEvent struct {
	context.Context
	ev   wal.Event
	id   rowID
	dlq  bool
	span trace.Span // the relay span (Config.Tracer), or nil
}

// runIdem is Run in idempotent mode.
func (p *Producer) runIdem(ctx context.Context, in <-chan wal.Event, onFatal func()) error {
	im := &p.idm
	im.halt, im.cancel = context.WithCancel(ctx)
	defer im.cancel()
	im.wake = make(chan struct{}, 1)
	if w, ok := p.client.OptValue(kgo.WithLogger).(*failureWatch); ok {
		f := p.batchRefused
		w.refused.Store(&f)
		defer w.refused.Store(nil)
	}
	for {
		if err := p.haltErr(); err != nil {
			onFatal()
			return err
		}
		select {
		case ev, ok := <-in:
			if !ok {
				if err := p.client.Flush(ctx); err != nil {
					return fmt.Errorf("flush Kafka producer: %w", err)
				}
				if err := p.haltErr(); err != nil {
					onFatal()
					return err
				}
				return nil
			}
			if err := p.handle(ctx, ev); err != nil {
				onFatal()
				return err
			}
		case <-im.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// haltErr is why the session ends, once a record failed.
func (p *Producer) haltErr() error {
	if !p.idm.halted.Load() {
		return nil
	}
	p.idm.mu.Lock()
	defer p.idm.mu.Unlock()
	return p.idm.err
}

// batchRefused is WatchFailures' news that Kafka refused a batch: it runs
// under the partition's lock in franz-go, before franz-go fails the
// partition's records, so it only flags and cancels.
func (p *Producer) batchRefused() {
	im := &p.idm
	if im.alone.Load() {
		return
	}
	im.stop.Store(true)
	im.cancel()
}

// awaitHalt waits for the failed records' promises, which say why the
// session ends (and name the suspects), once WatchFailures saw a batch
// refused.
func (p *Producer) awaitHalt(ctx context.Context) error {
	for {
		if err := p.haltErr(); err != nil {
			return err
		}
		select {
		case <-p.idm.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendIdem produces rec, the record of ev, without a transaction.
func (p *Producer) sendIdem(ctx context.Context, ev wal.Event, id rowID, rec *kgo.Record, dlq bool) error {
	if p.idm.stop.Load() {
		return p.awaitHalt(ctx)
	}
	if err := p.haltErr(); err != nil {
		return err
	}
	if p.promise == nil {
		p.promise = p.idemPromise
	}
	if len(p.slab) == 0 {
		p.slab = make([]recEvent, 1024)
	}
	re := &p.slab[0]
	p.slab = p.slab[1:]
	halt := p.idm.halt
	if halt == nil {
		halt = ctx
	}
	*re = recEvent{Context: halt, ev: ev, id: id, dlq: dlq}
	if !dlq { // a dead letter's record is not the one the span named
		re.span, p.span = p.span, nil
	}
	rec.Context = re
	p.client.Produce(ctx, rec, p.promise)
	return nil
}

// idemPromise is the promise of every record produced without a
// transaction. It must not block: franz-go runs promises one at a time.
func (p *Producer) idemPromise(r *kgo.Record, err error) {
	p.answers.Add(1)
	re := r.Context.(*recEvent)
	ev, id, dlq, span := re.ev, re.id, re.dlq, re.span
	re.ev, re.span = wal.Event{}, nil // the slab outlives the event
	if err == nil {
		if p.overtook(r, ev) {
			if span != nil {
				endSpan(span, errOvertook)
			}
			return
		}
		if span != nil {
			ackSpan(span, r)
			endSpan(span, nil)
		}
		p.acked(ev, r.Topic, dlq)
		return
	}
	if span != nil {
		endSpan(span, err)
	}
	var herr error
	rank := 1
	switch classify(err) {
	case faultFenced:
		herr, rank = fmt.Errorf("%w: produce to Kafka: %w", ErrFenced, err), 2
	case faultFatal:
		herr, rank = &fatal.Error{Msg: fmt.Sprintf("Kafka refused to accept records for topic %q; check the connector's Kafka credentials and ACLs (WRITE and DESCRIBE on the topics, IDEMPOTENT_WRITE on the cluster)", r.Topic), Err: err}, 3
	case faultRecord:
		if p.cfg.Poison.suspect(poisonKey(r.Topic, id), err) {
			p.metrics.KafkaRefused.WithLabelValues(r.Topic, "suspect").Inc()
		}
		p.log.Debug("Kafka refused a record's batch; it is a suspect", "topic", r.Topic, "partition", r.Partition, "lsn", wal.FormatLSN(ev.Row.Source.LSN), "err", err)
		herr = fmt.Errorf("Kafka refused records of topic %q: %w; reading again from the confirmed position, where each is produced alone", r.Topic, err)
	default: // transient, or the session ends anyway
		if isDataLoss(err) {
			p.dataLoss(r.Topic, err)
		}
		herr = fmt.Errorf("produce to Kafka (topic %q): %w; reading again from the confirmed position", r.Topic, err)
	}
	im := &p.idm
	im.mu.Lock()
	if r.Partition >= 0 {
		if im.failed == nil {
			im.failed = map[partKey]map[string]struct{}{}
		}
		pk := partKey{r.Topic, r.Partition}
		if im.failed[pk] == nil {
			im.failed[pk] = map[string]struct{}{}
		}
		im.failed[pk][string(r.Key)] = struct{}{}
	}
	if im.err == nil || rank > im.rank {
		im.err, im.rank = herr, rank
	}
	im.mu.Unlock()
	im.halted.Store(true)
	if im.cancel != nil {
		im.cancel()
	}
	select {
	case im.wake <- struct{}{}:
	default:
	}
}

// errOvertook ends the span of a record acked after a failure of its key
// (overtook): it is published again, in its place, with a span of its own.
var errOvertook = errors.New("acked out of order after an earlier record of its key failed; published again")

// overtook reports a record Kafka acked after an earlier record of its key
// failed on its partition (see "The window" above), and says so.
func (p *Producer) overtook(r *kgo.Record, ev wal.Event) bool {
	im := &p.idm
	if !im.halted.Load() {
		return false
	}
	im.mu.Lock()
	_, bad := im.failed[partKey{r.Topic, r.Partition}][string(r.Key)]
	im.mu.Unlock()
	if bad {
		p.metrics.OrderViolations.Inc()
		p.log.Error("Kafka acked a record after an earlier record of its key failed on the same partition: consumers may see it before that one; it is published again after it",
			"topic", r.Topic, "partition", r.Partition, "lsn", wal.FormatLSN(ev.Row.Source.LSN))
	}
	return bad
}

// aloneIdem produces a suspect with nothing else in flight: everything
// produced before it is acked first. A refusal is a *refusedError.
func (p *Producer) aloneIdem(ctx context.Context, ev wal.Event, rec *kgo.Record, dlq bool) error {
	if err := p.client.Flush(ctx); err != nil {
		return fmt.Errorf("flush Kafka producer: %w", err)
	}
	if err := p.haltErr(); err != nil {
		return err
	}
	// The flush may have taken a while: the lease may have run out.
	if !p.valid() {
		return fmt.Errorf("%w (the leader lease's deadline passed)", ErrFenced)
	}
	p.idm.alone.Store(true)
	defer p.idm.alone.Store(false)
	res := make(chan error, 1)
	p.client.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		p.answers.Add(1)
		res <- err
	})
	var err error
	select {
	case err = <-res:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.span != nil && !dlq {
		if err == nil {
			ackSpan(p.span, rec)
		}
		endSpan(p.span, err)
		p.span = nil
	}
	switch classify(err) {
	case faultNone:
		p.acked(ev, rec.Topic, dlq)
		return nil
	case faultRecord:
		return &refusedError{err: err, n: 1}
	case faultFenced:
		return fmt.Errorf("%w: produce to Kafka: %w", ErrFenced, err)
	case faultFatal:
		return &fatal.Error{Msg: fmt.Sprintf("Kafka refused to accept records for topic %q; check the connector's Kafka credentials and ACLs (WRITE and DESCRIBE on the topics, IDEMPOTENT_WRITE on the cluster)", rec.Topic), Err: err}
	}
	if isDataLoss(err) {
		p.dataLoss(rec.Topic, err)
	}
	return fmt.Errorf("produce a record to Kafka alone (topic %q): %w", rec.Topic, err)
}

// WatchFailures wraps a Kafka client's logger so that an idempotent
// producer on that client learns that Kafka refused a batch at once, under
// franz-go's partition lock, rather than when the failed records' promises
// run: see "The window" above. Every line goes on to inner as inner would
// have taken it; inner's level still decides what is logged.
func WatchFailures(inner kgo.Logger) kgo.Logger { return &failureWatch{inner: inner} }

// batchFailedMsg is what franz-go (pkg/kgo/sink.go, handleReqRespBatch, as
// of v1.22) logs at info level when the broker answered a batch with an
// error it will not retry, before it fails the partition's records.
// TestIdempotentWindowSeen fails if franz-go stops logging it so.
const batchFailedMsg = "batch in a produce request failed"

// emptyEndMsg is what franz-go (pkg/kgo/txn.go, EndTransaction, as of
// v1.22) logs at info level, within the call, when it ends a transaction
// as an abort whatever the caller asked, because it counts no partition as
// added to it (see Producer.endCommit). TestTxnCommitNotDowngraded fails
// if franz-go goes on downgrading commits without saying so.
const emptyEndMsg = "no produce succeeded in this transaction but produces were attempted; issuing an abort to clear any server-side partition registrations"

// noTxnEndMsg is what franz-go (pkg/kgo/txn.go, EndTransaction, as of
// v1.22) logs at debug level, within the call, when it ends a transaction
// without sending EndTxn because it counts no partition as added to it and
// either the broker predates KIP-890 part 2 (Kafka 4.0) or it counts no
// produce attempted (see Producer.endCommit). TestTxnCommitNotSkipped
// fails if franz-go stops logging it so.
const noTxnEndMsg = "no records were produced during the commit; thus no transaction was began; ending without doing anything"

type failureWatch struct {
	inner   kgo.Logger
	refused atomic.Pointer[func()]
	// emptyEnd is set when franz-go logs emptyEndMsg, noTxnEnd when it
	// logs noTxnEndMsg; a transactional producer clears both before each
	// commit.
	emptyEnd atomic.Bool
	noTxnEnd atomic.Bool
	// ending is set while a transactional producer commits, so that
	// franz-go hands over its debug lines (noTxnEndMsg) for that call
	// only: at debug level franz-go logs every request, which costs
	// outside a commit for nothing.
	ending atomic.Bool
}

// Level is at least info, so that franz-go hands over batchFailedMsg, and
// debug while a commit is under way (noTxnEndMsg). franz-go asks it before
// every line (its wrappedLogger), so the change takes effect at once; the
// inner logger is still handed only what its own level takes (Log).
func (w *failureWatch) Level() kgo.LogLevel {
	lvl := kgo.LogLevelInfo
	if w.ending.Load() {
		lvl = kgo.LogLevelDebug
	}
	if w.inner == nil {
		return lvl
	}
	return max(w.inner.Level(), lvl)
}

func (w *failureWatch) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch msg {
	case emptyEndMsg:
		w.emptyEnd.Store(true)
	case noTxnEndMsg:
		w.noTxnEnd.Store(true)
	}
	if msg == batchFailedMsg && level <= kgo.LogLevelInfo {
		if f := w.refused.Load(); f != nil {
			(*f)()
		}
	}
	if w.inner != nil && w.inner.Level() >= level {
		w.inner.Log(level, msg, keyvals...)
	}
}
