// Package tracker keeps two of the connector's three WAL positions apart:
// received (what the stream has read) and acked (everything up to it is in
// Kafka or durably dead-lettered). The third, confirmed (what PostgreSQL is
// told), is relay/checkpoint's: at most acked, and covered by a recorded
// promise. Confusing them loses events (go-pq-cdc #107, Eventuate): a
// keepalive's WAL end may only be acked when nothing received is still in
// flight.
package tracker

import (
	"sync"
	"time"
)

// LSN is a WAL position.
type LSN = uint64

// Txn is one decoded transaction's bookkeeping: how many of its records are
// still unacknowledged and whether its commit has been received.
type Txn struct {
	t         *Tracker
	end       LSN // commit end LSN; known at Begin for protocol v1 (final LSN) and fixed at Commit
	pending   int
	acks      int // records of it acked (or dead-lettered)
	committed bool
	abandoned bool
	events    bool
	since     time.Time // when Begin was read, for the oldest-unacked age
	gen       uint64    // the tracker's gen at Begin: a Reset since forgot tx
}

// Tracker is safe for concurrent use: the stream goroutine adds, producer
// promises complete.
type Tracker struct {
	mu        sync.Mutex
	queue     []*Txn // transactions not yet fully acked, in commit order
	head      int
	acked     LSN
	received  LSN
	lastEvent LSN // commit end of the newest transaction that carried events
	inFlight  int // records handed to Kafka and not yet acked
	// progress counts the moments work moved: a record acked or
	// dead-lettered, or the acked position advanced. Not the acked position
	// alone: a transaction of millions of records acks them one by one,
	// for longer than any stall timeout, before its end LSN is acked. A
	// count, not a time: the connector's stall watch reads the clock when
	// it looks; reading it in Done, once per record, would double what
	// Done costs.
	progress uint64
	// ackedOpen counts the records acked in transactions not yet fully
	// acked: how far past acked the work has got.
	ackedOpen int
	// dropped is the end of the last transaction with events that Reset
	// forgot unacked (0: none): the next stream reads it again, and the
	// work is owed until that transaction is delivered or acked passes it.
	// Its own end, not the received position: a transaction forgotten
	// before its commit was read, or the snapshot's (which begins and
	// commits at the slot's consistent point), leaves received where the
	// next session's acked position starts.
	dropped LSN
	// droppedAcked is ackedOpen when Reset last forgot such work: how far
	// the session got into it.
	droppedAcked int
	ended        bool // Reset was called: the session it counted for ended
	// gen counts Resets. A transaction begun before the last one was
	// forgotten by it: its records' acks and abandons, which may still
	// come (franz-go runs promises on its own goroutine, even after the
	// client is closed), move none of the counts, or the in-flight count
	// went negative and the next session's counts were off.
	gen     uint64
	changed chan struct{}
}

// New returns a tracker whose positions start at start (the slot's
// confirmed position: everything before it is already in Kafka).
func New(start LSN) *Tracker {
	return &Tracker{acked: start, received: start, changed: make(chan struct{}, 1)}
}

// Changed is signalled (without blocking) whenever the acked position or the
// in-flight count changes, so a waiter can re-check.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

func (t *Tracker) signal() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Begin registers a transaction whose commit ends at end.
func (t *Tracker) Begin(end LSN) *Txn {
	tx := &Txn{t: t, end: end, since: time.Now()}
	t.mu.Lock()
	tx.gen = t.gen
	t.queue = append(t.queue, tx)
	t.mu.Unlock()
	return tx
}

// Add counts one more record of tx handed to Kafka.
func (tx *Txn) Add() {
	t := tx.t
	t.mu.Lock()
	tx.pending++
	tx.events = true
	t.inFlight++
	t.mu.Unlock()
}

// Done marks one record of tx as acked (or durably dead-lettered). For a
// transaction a Reset forgot it counts nothing.
func (tx *Txn) Done() {
	t := tx.t
	t.mu.Lock()
	tx.pending--
	if tx.pending < 0 {
		t.mu.Unlock()
		panic("tracker: Done called more often than Add")
	}
	if tx.gen != t.gen {
		t.mu.Unlock()
		return
	}
	t.inFlight--
	tx.acks++
	t.ackedOpen++
	t.progress++
	t.advanceLocked()
	t.mu.Unlock()
	t.signal()
}

// Abandon withdraws one record of tx that was counted with Add but never
// handed to Kafka (the stream stopped). The transaction can then never be
// acked: its commit will be read again from the slot.
func (tx *Txn) Abandon() {
	t := tx.t
	t.mu.Lock()
	tx.pending--
	tx.abandoned = true
	if tx.gen != t.gen {
		t.mu.Unlock()
		return
	}
	t.inFlight--
	t.mu.Unlock()
	t.signal()
}

// Committed reports whether tx's commit was received: a transaction the
// stream stopped inside can never be confirmed, and is read again whole.
func (tx *Txn) Committed() bool {
	t := tx.t
	t.mu.Lock()
	defer t.mu.Unlock()
	return tx.committed
}

// Reset forgets every transaction that is not acked, once nothing is in
// flight: after a stream ends, the next one re-reads them from the slot's
// confirmed position. received falls back to acked.
func (t *Tracker) Reset() {
	t.mu.Lock()
	forgot := false
	for _, tx := range t.queue[t.head:] {
		if tx.events {
			t.dropped = max(t.dropped, tx.end)
			forgot = true
		}
	}
	if forgot {
		t.droppedAcked = t.ackedOpen
	}
	clear(t.queue)
	t.queue = t.queue[:0]
	t.head = 0
	t.inFlight = 0
	t.ackedOpen = 0
	t.ended = true
	t.gen++
	t.received = t.acked
	t.mu.Unlock()
	t.signal()
}

// Commit marks tx's commit as received, at end (its end LSN).
func (tx *Txn) Commit(end LSN) {
	t := tx.t
	t.mu.Lock()
	tx.end = max(tx.end, end)
	tx.committed = true
	t.received = max(t.received, tx.end)
	t.advanceLocked()
	t.mu.Unlock()
	t.signal()
}

// advanceLocked moves acked past every leading transaction that is committed
// and has nothing pending.
func (t *Tracker) advanceLocked() {
	for t.head < len(t.queue) {
		tx := t.queue[t.head]
		if !tx.committed || tx.pending > 0 || tx.abandoned {
			break
		}
		if tx.end > t.acked {
			t.acked = tx.end
			t.progress++
		}
		if tx.events {
			t.lastEvent = max(t.lastEvent, tx.end)
		}
		t.ackedOpen -= tx.acks
		t.queue[t.head] = nil
		t.head++
	}
	if t.head == len(t.queue) {
		t.queue = t.queue[:0]
		t.head = 0
	} else if t.head > 1024 && t.head*2 > len(t.queue) {
		n := copy(t.queue, t.queue[t.head:])
		clear(t.queue[n:])
		t.queue = t.queue[:n]
		t.head = 0
	}
}

// ServerWALEnd records the WAL end a keepalive reported. Only when nothing
// received is still open or in flight does it become acked: the walsender
// sends a keepalive's position only after every transaction committed before
// it, and the stream reads in order, so an empty queue means nothing before
// walEnd is outstanding. It must be called by the goroutine that reads the
// stream, in stream order.
func (t *Tracker) ServerWALEnd(walEnd LSN) {
	t.mu.Lock()
	t.received = max(t.received, walEnd)
	if t.head == len(t.queue) && walEnd > t.acked {
		t.acked = walEnd
		t.progress++
		t.mu.Unlock()
		t.signal()
		return
	}
	t.mu.Unlock()
}

// Positions is a consistent view of the tracker.
type Positions struct {
	Received  LSN
	Acked     LSN
	LastEvent LSN // commit end of the newest fully acked transaction with events
	InFlight  int // records handed to Kafka, not yet acked
	OpenTxns  int // transactions received but not yet fully acked
	// Progress grows whenever work moves (a record acked or dead-lettered,
	// the acked position advanced): a stall is work owed (InFlight > 0, or
	// Dropped) while Progress stays the same.
	Progress uint64
	// Dropped is the end of the last transaction with events that Reset
	// forgot unacked (0: none): the stream ended owing it, and the next
	// one reads it again. The snapshot's transaction ends where it
	// begins, at the position the next session starts from.
	Dropped LSN
	// AckedOpen is how many records of transactions not yet fully acked
	// are acked: with Acked, how far the work has got.
	AckedOpen int
	// DroppedAcked is AckedOpen when Reset last forgot work: how far into
	// it the ended session got.
	DroppedAcked int
	// Ended: Reset was called, the session this tracker counted for ended.
	Ended bool
}

// Positions returns the current positions.
func (t *Tracker) Positions() Positions {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Positions{Received: t.received, Acked: t.acked, LastEvent: t.lastEvent, InFlight: t.inFlight, OpenTxns: len(t.queue) - t.head, Progress: t.progress, Dropped: t.dropped,
		AckedOpen: t.ackedOpen, DroppedAcked: t.droppedAcked, Ended: t.ended}
}

// OldestOpen is when the oldest transaction not yet acked was read (zero
// when none is open).
func (t *Tracker) OldestOpen() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head == len(t.queue) {
		return time.Time{}
	}
	return t.queue[t.head].since
}

// Acked returns the acked position.
func (t *Tracker) Acked() LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.acked
}

// Idle reports whether nothing is open or in flight.
func (t *Tracker) Idle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.head == len(t.queue)
}
