package checkpoint

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// promiseHeadroom is how far past the acked position a state write lets
// the connector confirm. WAL with no outbox events still needs confirming
// (rule 5), but our own state write, and the running-xacts and checkpoint
// records the server logs after any activity, are WAL too: if each of them
// called for another write, an idle database would never go quiet. With the
// headroom, those few records (at most one full-page image of the state row
// and a few small records) are confirmed without a write, and a database with
// no other activity sees nothing more from the connector. The price: a slot
// advanced by someone else by less than this past the last position the
// connector examined is not detected at start. A graceful stop records the
// exact position, so the headroom does not outlive the process.
const promiseHeadroom = 16 << 10

// Writer persists the position the connector may confirm before it is
// confirmed (the promise), so that a slot moved behind its back is detected
// at the next start, and answers what may be confirmed now (Confirmable):
// acked by Kafka (the tracker) and covered by a recorded promise. Every
// write is fenced with the term's token.
type Writer struct {
	mu      sync.Mutex
	conn    *pgx.Conn
	st      State
	tracker *tracker.Tracker
	term    *lease.Term
	// onAck is told the position each write covers, on every tick whether
	// it moved or not: it is no sign of progress (the stall clock is the
	// tracker's progress count).
	onAck   func(uint64)
	durable atomic.Uint64 // the recorded promise
	// offsets is the commit LSN of the newest exactly-once position Kafka
	// committed, recorded with the next write (State.OffsetsLSN).
	offsets atomic.Uint64
	// recorded is the OffsetsLSN last written, under mu.
	recorded uint64
	// points are the recovery points the writes took, oldest first, not
	// yet recordable (their LSN not acked), under mu: each write records
	// the newest one that is (see Point).
	points []Point
	// messages: the stream decoded an event written as a logical message
	// (State.MessagesSeen), recorded with the next write.
	messages atomic.Bool
	// msgRecorded: the state row says so (State.MessagesSeen); until then
	// nothing past lastTarget, the acked position the last write covered
	// (without the headroom), may be confirmed.
	msgRecorded atomic.Bool
	lastTarget  atomic.Uint64
	faults      fault.Hook
	// Failed is told a periodic write that failed waiting for a lock
	// (LockWait: another transaction holds the state row or, through the
	// fence, the lease row, say a lease renewal waiting on a synchronous
	// standby); Run then tries again at its next tick instead of ending
	// the session. Nil: such a failure ends Run as any other.
	Failed func(error)
}

// SawMessage records that the stream decoded an event written as a logical
// decoding message: the next write records it (State.MessagesSeen), before
// any position past it is confirmed.
func (w *Writer) SawMessage() { w.messages.Store(true) }

// maxPoints bounds the points kept: a position that stays unacked for
// many writes (a long transaction, a Kafka outage) keeps the oldest ones,
// and a newer one is recorded once it is acked.
const maxPoints = 64

// NewWriter returns the writer of st (the row as prepared for this
// session) on conn, for the positions tr acks, fenced by term.
func NewWriter(conn *pgx.Conn, st State, tr *tracker.Tracker, term *lease.Term, faults fault.Hook, onAck func(uint64)) *Writer {
	w := &Writer{conn: conn, st: st, tracker: tr, term: term, faults: faults, onAck: onAck, recorded: st.OffsetsLSN}
	w.durable.Store(st.Confirmed)
	w.lastTarget.Store(st.Confirmed)
	w.msgRecorded.Store(st.MessagesSeen)
	return w
}

// Confirmable is the position that may be confirmed to PostgreSQL: acked,
// and covered by a recorded promise.
//
// A message event the state row does not yet record holds it at the last
// write's own target: the headroom would let the stream confirm past the
// message before the write that records it (State.MessagesSeen).
func (w *Writer) Confirmable() uint64 {
	c := min(w.tracker.Acked(), w.durable.Load())
	if w.messages.Load() && !w.msgRecorded.Load() {
		c = min(c, w.lastTarget.Load())
	}
	return c
}

// KafkaCommitted records that Kafka committed an exactly-once position at
// commit LSN lsn: the next write records it in the state row.
func (w *Writer) KafkaCommitted(lsn uint64) {
	for {
		old := w.offsets.Load()
		if lsn <= old || w.offsets.CompareAndSwap(old, lsn) {
			return
		}
	}
}

// Durable is the recorded promise.
func (w *Writer) Durable() uint64 { return w.durable.Load() }

// SnapshotDone records that the initial snapshot is published (every row
// acked): from now on a start streams the slot instead of taking it again.
// p is the recovery point of the snapshot's transaction (see Point).
func (w *Writer) SnapshotDone(ctx context.Context, p Point) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.st
	st.SnapshotDone, st.Recovering, st.Floor = true, false, Floor{}
	if !p.IsZero() {
		st.Recover = p
	}
	if err := SaveState(ctx, w.conn, st, Fence{Token: w.term.Token}); err != nil {
		return err
	}
	w.st = st
	return nil
}

// recoverable picks the newest point taken whose position is acked
// (recorded with the next write, which drops it and those before it from
// points); the zero Point when none is newer than the row's. No point is
// recorded while a snapshot is owed: until it is published, the row's
// point (or, for an initial snapshot, the whole table) is what was
// delivered.
func (w *Writer) recoverable(acked uint64) (Point, int) {
	if !w.st.SnapshotDone {
		return Point{}, 0
	}
	for i := len(w.points) - 1; i >= 0; i-- {
		if p := w.points[i]; p.LSN <= acked {
			if p.Xmin <= w.st.Recover.Xmin {
				return Point{}, i + 1
			}
			return p, i + 1
		}
	}
	return Point{}, 0
}

// took keeps the point a write took, and the one it recorded, after a
// write that succeeded: used are the points the write no longer needs.
func (w *Writer) took(taken, recorded Point, used int) {
	if !recorded.IsZero() {
		w.st.Recover = recorded
	}
	w.points = w.points[used:]
	if len(w.points) >= maxPoints {
		w.points = w.points[1:]
	}
	if !taken.IsZero() && w.st.SnapshotDone {
		w.points = append(w.points, taken)
	}
}

// Run writes at most once per interval: each write is a commit, and the
// confirmation it allows only goes out once per status interval anyway.
func (w *Writer) Run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// The write itself is not cancelled with ctx: pgx closes a
		// connection whose query is cancelled, and the final write at a
		// graceful stop needs this connection.
		// It ends with the term, though: a write after it is fenced anyway,
		// and the session must not wait 30 s on a dead connection.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		stop := context.AfterFunc(w.term.Context(), cancel)
		err := w.Write(wctx, w.tracker.Acked(), false)
		stop()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// A lock not granted in LockWait is someone else's moment: the
			// write is retried at the next tick (ending the session for it
			// replayed a suffix, and a writer that keeps failing is the
			// stall the caller says through Failed).
			if pgErr := (*pgconn.PgError)(nil); w.Failed != nil && errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				w.Failed(err)
				continue
			}
			return err
		}
	}
}

// Write records a promise covering target when the current one does not.
// final records exactly target (a graceful stop: target is at least every
// position sent, so the promise may shrink to it).
func (w *Writer) Write(ctx context.Context, target uint64, final bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.st
	st.OffsetsLSN = max(st.OffsetsLSN, w.recorded, w.offsets.Load())
	st.MessagesSeen = st.MessagesSeen || w.messages.Load()
	rec, used := w.recoverable(min(target, w.tracker.Acked()))
	st.Recover = rec
	if final {
		st.Confirmed = target
		taken, err := setStateExactPoint(ctx, w.conn, st, Fence{Token: w.term.Token})
		if err != nil {
			return err
		}
		w.took(taken, rec, used)
		w.recorded = st.OffsetsLSN
		w.wrote(st, target)
		w.durable.Store(target)
		w.onAck(target)
		return nil
	}
	if target <= w.durable.Load() {
		if st.OffsetsLSN > w.recorded || st.MessagesSeen != w.st.MessagesSeen {
			// Kafka committed positions while the confirmed one did not
			// move (one PostgreSQL transaction spanning Kafka
			// transactions, a slow ack): record them all the same, so
			// that an offsets topic that loses them is seen at start,
			// not taken for a history that never committed one. At most
			// once per interval (Run).
			st.Confirmed = w.durable.Load()
			taken, err := saveStatePoint(ctx, w.conn, st, Fence{Token: w.term.Token})
			if err != nil {
				return err
			}
			w.took(taken, rec, used)
			w.recorded = st.OffsetsLSN
			w.wrote(st, w.lastTarget.Load())
		}
		w.onAck(target)
		return nil
	}
	st.Confirmed = target + promiseHeadroom
	if err := w.faults.At(fault.BeforePromise); err != nil {
		return err
	}
	taken, err := saveStatePoint(ctx, w.conn, st, Fence{Token: w.term.Token})
	if err != nil {
		return err
	}
	w.took(taken, rec, used)
	w.wrote(st, target)
	if err := w.faults.At(fault.AfterPromise); err != nil {
		return err
	}
	w.recorded = st.OffsetsLSN
	w.durable.Store(st.Confirmed)
	w.onAck(target)
	return nil
}

// wrote keeps what a write recorded: whether messages were seen, and the
// acked position it covered.
func (w *Writer) wrote(st State, target uint64) {
	w.st.MessagesSeen = st.MessagesSeen
	w.msgRecorded.Store(st.MessagesSeen)
	w.lastTarget.Store(target)
}
