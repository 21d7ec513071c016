package publish

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// Exactly-once (transactional mode with Config.Offsets). Every Kafka
// transaction that commits records also holds the position (offsets.Position)
// of the last event handled before it commits: the records and the position
// commit or abort together. The producer handles events one at a time in
// stream order, so when it commits, every event up to that one is in this
// or an earlier Kafka transaction, or is done without a record (dead-lettered
// to the table, skipped by the router), and the position says exactly that:
// the transaction's commit LSN and how many of its events, which may be
// fewer than it has (a PostgreSQL transaction that spans Kafka
// transactions).
//
// A session starts with the position read back after InitProducerID
// (Offsets.Resume): the slot replays from PostgreSQL's confirmed position,
// which may be far behind it, and every event the position covers is
// skipped, done for the tracker at once (it is committed in Kafka, so
// confirming past it keeps rule 1). Rows of an initial snapshot are never
// skipped: a snapshot taken again reads the table as it is then, where a
// count of rows published says nothing of which. A snapshot interrupted by
// a crash is therefore published again whole (at-least-once).

// Offsets is the exactly-once configuration of a session.
type Offsets struct {
	Topic string
	Key   offsets.Key
	// Base is the history every position of the session is written in:
	// its Epoch, Timeline and Token (Commit and Events are ignored).
	Base offsets.Position
	// Resume, when set, is the position read back at start: the events it
	// covers are skipped.
	Resume *offsets.Position
	// Committed, when set, is given every position Kafka committed (the
	// state writer records it, see checkpoint.State.OffsetsLSN).
	Committed func(offsets.Position)
}

// exactly is the producer's exactly-once state.
type exactly struct {
	cfg *Offsets
	pos offsets.Position // covers every event handled
	// written is the position last produced into a transaction; it
	// differs from committed, the one Kafka last committed, while a
	// position record is in the transaction being committed.
	written, committed offsets.Position
	failed             atomic.Pointer[error]
	// skipped counts the events of this session the resume position
	// covered.
	skipped atomic.Int64
	// gone is cancelled, with the error the session ends with, once
	// watchTopics found the offsets topic deleted (see offsetsGone).
	gone     context.Context
	markGone context.CancelCauseFunc
}

func (e *exactly) init(cfg *Offsets) {
	e.cfg = cfg
	if cfg == nil {
		return
	}
	e.pos = cfg.Base
	e.pos.Commit, e.pos.Events, e.pos.Snapshot = 0, 0, 0
	if r := cfg.Resume; r != nil {
		e.pos.Commit, e.pos.Events = r.Commit, r.Events
	}
	e.written, e.committed = e.pos, e.pos
	e.gone, e.markGone = context.WithCancelCause(context.Background())
}

// aborted: the open transaction was aborted, its position with it. The
// session may go on (a suspect refused alone is dead-lettered next): what
// was handled since the last commit is covered again only as it is handled
// again (the suspect's dead letter), and the next commit writes a position.
func (e *exactly) aborted() {
	if e.cfg == nil {
		return
	}
	e.pos, e.written = e.committed, e.committed
	e.failed.Store(nil)
}

// Skipped is how many events of this session were skipped as already in
// Kafka by the position read back at start.
func (p *Producer) Skipped() int64 { return p.eo.skipped.Load() }

// covered reports, and does what it means, an event the resume position
// covers: it is in Kafka already, done.
func (p *Producer) covered(ev wal.Event, id rowID) bool {
	e := &p.eo
	if e.cfg == nil || e.cfg.Resume == nil || ev.Row == nil || ev.Row.Source.LSN == 0 {
		return false
	}
	if !e.cfg.Resume.Covers(id.commit, id.seq) {
		return false
	}
	p.metrics.ExactlyOnceSkippedLast.Set(float64(e.skipped.Add(1)))
	p.metrics.ExactlyOnceSkipped.Inc()
	ev.Txn.Done()
	return true
}

// in records that the event id is in the open Kafka transaction or done
// without a record: the next commit's position covers it.
func (p *Producer) in(ev wal.Event, id rowID) {
	e := &p.eo
	if e.cfg == nil || ev.Row == nil {
		return
	}
	if ev.Row.Source.LSN == 0 {
		// A snapshot row: the position is the slot's consistent point,
		// with no event of the transaction that may commit there, and
		// the count of rows for people.
		if id.commit > e.pos.Commit {
			e.pos.Commit, e.pos.Events, e.pos.Snapshot = id.commit, 0, 0
		}
		if id.commit == e.pos.Commit {
			e.pos.Snapshot++
		}
		return
	}
	next := offsets.Position{Commit: id.commit, Events: id.seq + 1}
	if e.pos.Less(next) {
		e.pos.Commit, e.pos.Events, e.pos.Snapshot = next.Commit, next.Events, 0
	}
}

// writePosition produces the position into the open transaction, before it
// is flushed and committed, when it moved since the last one committed.
func (p *Producer) writePosition(ctx context.Context) {
	e := &p.eo
	if e.cfg == nil || !p.txn.open || e.pos == e.written {
		return
	}
	rec := offsets.Record(e.cfg.Topic, e.cfg.Key, e.pos)
	e.written = e.pos
	p.txnClient().Produce(ctx, rec, func(_ *kgo.Record, err error) {
		if err != nil {
			e.failed.Store(&err)
			p.txn.bad.Store(true)
		}
	})
}

// positionError is why the position record of the flushed transaction
// failed, if it did: the transaction cannot commit.
func (p *Producer) positionError() error {
	e := &p.eo
	perr := e.failed.Swap(nil)
	if perr == nil {
		return nil
	}
	err := *perr
	switch classify(err) {
	case faultFenced:
		return fmt.Errorf("%w: write the exactly-once position: %w", ErrFenced, err)
	case faultFatal:
		return &fatal.Error{Msg: fmt.Sprintf("Kafka refused the exactly-once position for topic %q; grant WRITE and DESCRIBE on it to the connector", e.cfg.Topic), Err: err}
	}
	return fmt.Errorf("write the exactly-once position to %q: %w", e.cfg.Topic, err)
}

// isOffsets reports whether topic is the exactly-once offsets topic.
func (p *Producer) isOffsets(topic string) bool {
	return p.eo.cfg != nil && topic == p.eo.cfg.Topic
}

// offsetsGone: watchTopics found the offsets topic deleted while records
// wait. The position record of the commit in progress is among them, and
// franz-go retries an unknown topic without end (UnknownTopicRetries(-1)):
// the commit's flush would never return and the line would stand still
// with no word. The topic is named (an error log line,
// outbox_connector_topic_missing, the Blocked hook) and the session ends
// with that error: the flush gives up (flush), the open Kafka transaction
// is aborted and nothing of it is confirmed to PostgreSQL. It is not
// created again here, as a deleted event topic is: the slot's position is
// gone with it, and what that means is the start's to decide, in one place
// (the relay's exactlyOnce): the next session finds the topic missing, or
// created again and empty, while the state row recorded a position, and
// stops with the choices, or, with OUTBOX_ON_OFFSETS_LOSS=at-least-once,
// continues from the slot's position.
func (p *Producer) offsetsGone(topic string) {
	err := fmt.Errorf("the exactly-once offsets topic %q (OUTBOX_KAFKA_OFFSETS_TOPIC) was deleted while the connector ran: the position record of the Kafka transaction being committed waits for it, and every record after it. "+
		"The session ends and aborts that transaction (nothing of it is confirmed to PostgreSQL); the next start applies the rule for a lost offsets topic: "+
		"it stops with the choices (OUTBOX_ON_OFFSETS_LOSS=fail, the default; with OUTBOX_TOPIC_CREATE=false, until the topic is created again), or continues from the slot's position, publishing again what the slot replays (OUTBOX_ON_OFFSETS_LOSS=at-least-once)", topic)
	p.log.Error(err.Error(), "topic", topic)
	p.metrics.TopicMissing.WithLabelValues(topic).Set(1)
	p.blocked(err.Error())
	p.eo.markGone(err)
}

// flush flushes cl, the client of the transaction being committed. With
// exactly-once it gives up once the offsets topic was found deleted
// (offsetsGone), and returns why: the transaction then never commits,
// even if its position record got through after all (the topic created
// again meanwhile): the next start decides what the lost topic means.
func (p *Producer) flush(ctx context.Context, cl *kgo.Client) error {
	e := &p.eo
	if e.gone == nil {
		return cl.Flush(ctx)
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.gone, cancel)()
	err := cl.Flush(fctx)
	if lost := e.lost(); lost != nil {
		return lost
	}
	return err
}

// lost is why the session ends when the offsets topic was found deleted
// (offsetsGone), or nil.
func (e *exactly) lost() error {
	if e.gone == nil {
		return nil
	}
	return context.Cause(e.gone)
}

// positionCommitted: the open transaction committed, with its position.
func (p *Producer) positionCommitted() {
	e := &p.eo
	if e.cfg == nil || e.written == e.committed {
		return
	}
	e.committed = e.written
	if e.cfg.Committed != nil {
		e.cfg.Committed(e.written)
	}
}
