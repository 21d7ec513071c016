package tracker

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// A model-based test of the tracker: rapid drives it as the stream, the
// producer and the relay do (transactions read in commit order, records
// acked in any order, a record withdrawn when the stream stops, keepalives in
// stream order, restarts that re-read from a position already confirmed) and
// after every step compares it with a model of what may be confirmed, and of
// the stall clock (Progress, Dropped).
//
//	go test -run TestTrackerModel ./relay/tracker -rapid.checks=10000 -rapid.steps=200

// walTxn is one transaction as the WAL holds it: final is the commit
// record's LSN (Begin's final LSN), end the end of that record (Commit's end
// LSN, what is confirmed once it is delivered). end == final is the
// snapshot's transaction, which begins and commits at one position.
type walTxn struct{ final, end LSN }

// modelTxn is one reading of a WAL transaction in the current session.
type modelTxn struct {
	tx        *Txn
	wal       int // index into trackerModel.wal
	pending   int
	acks      int // records of it acked
	committed bool
	abandoned bool
	events    bool
}

type trackerModel struct {
	tr *Tracker

	// The WAL, generated as the stream first reads it; a restart reads it
	// again from the position it starts at.
	wal       []walTxn
	delivered []bool // wal[i] was read, committed and every record of it acked, in some session
	tip       LSN    // the highest position the WAL has shown (a commit end or a keepalive)

	// The stream of the current session.
	next    int       // index in wal of the next transaction to read
	pos     LSN       // last position read: the session's start, a commit end or a keepalive
	open    *modelTxn // begun and not yet committed
	stopped bool      // the stream stopped; only acks and a restart follow
	floor   LSN       // the position the current session started at

	// What the tracker should say.
	queue     []*modelTxn // read and not yet fully acked, in commit order
	records   []*modelTxn // one entry per record in flight, oldest first
	acked     LSN
	received  LSN
	lastEvent LSN
	ackedSeen []LSN  // every value acked took, ascending: the positions a restart may start at
	progress  uint64 // one for each record acked and each move of acked
	dropped   LSN    // the end of the last transaction with events a restart forgot
	// droppedAcked: records acked of what the last restart that forgot
	// events forgot.
	droppedAcked int
	restarted    bool

	// What the last check saw.
	prevAcked    LSN
	prevInFlight int
}

func newTrackerModel(start LSN) *trackerModel {
	return &trackerModel{
		tr: New(start), tip: start, pos: start, floor: start,
		acked: start, received: start, ackedSeen: []LSN{start},
		prevAcked: start,
	}
}

func (m *trackerModel) setAcked(v LSN) {
	if v > m.acked {
		m.acked = v
		m.ackedSeen = append(m.ackedSeen, v)
		m.progress++
	}
}

// advance is the model's rule: acked moves past every leading transaction
// that is committed, has nothing pending and lost nothing.
func (m *trackerModel) advance() {
	for len(m.queue) > 0 {
		h := m.queue[0]
		if !h.committed || h.pending > 0 || h.abandoned {
			return
		}
		w := m.wal[h.wal]
		m.setAcked(w.end)
		if h.events {
			m.lastEvent = max(m.lastEvent, w.end)
		}
		m.delivered[h.wal] = true
		m.queue = m.queue[1:]
	}
}

func (m *trackerModel) canRead() bool { return !m.stopped && m.open == nil }

// begin reads the next transaction's Begin: one the WAL already holds (after
// a restart) or a new one after everything the WAL has shown.
func (m *trackerModel) begin(t *rapid.T) {
	if m.next == len(m.wal) {
		final := m.tip + LSN(rapid.IntRange(1, 40).Draw(t, "gap"))
		end := final + LSN(rapid.IntRange(0, 3).Draw(t, "commit size"))
		m.wal = append(m.wal, walTxn{final, end})
		m.delivered = append(m.delivered, false)
		m.tip = end
	}
	w := m.wal[m.next]
	mt := &modelTxn{tx: m.tr.Begin(w.final), wal: m.next}
	m.next++
	m.open = mt
	m.queue = append(m.queue, mt)
}

func (m *trackerModel) add() {
	m.open.tx.Add()
	m.open.pending++
	m.open.events = true
	m.records = append(m.records, m.open)
}

func (m *trackerModel) commit() {
	mt := m.open
	end := m.wal[mt.wal].end
	mt.tx.Commit(end)
	mt.committed = true
	m.received = max(m.received, end)
	m.pos = end
	m.open = nil
	m.advance()
}

func (m *trackerModel) done(i int) {
	mt := m.records[i]
	m.records = slices.Delete(m.records, i, i+1)
	mt.tx.Done()
	mt.pending--
	mt.acks++
	m.progress++
	m.advance()
}

// keepalive reports a WAL end the walsender may send here: never past a
// transaction it has not sent yet (the next one's final LSN), nor, inside a
// transaction, past that transaction's commit.
func (m *trackerModel) keepalive(t *rapid.T) {
	hi := m.tip + 40
	switch {
	case m.open != nil:
		hi = m.wal[m.open.wal].final
	case m.next < len(m.wal):
		hi = m.wal[m.next].final
	}
	w := LSN(rapid.Uint64Range(m.pos, hi).Draw(t, "wal end"))
	m.tr.ServerWALEnd(w)
	m.received = max(m.received, w)
	if len(m.queue) == 0 {
		m.setAcked(w)
	}
	if m.open == nil {
		m.pos = w
		m.tip = max(m.tip, w)
	}
}

// check compares the tracker with the model and with rule 1 itself.
func (m *trackerModel) check(t *rapid.T) {
	t.Helper()
	tr := m.tr
	p := tr.Positions()
	if p.Acked != tr.Acked() {
		t.Fatalf("Positions().Acked = %d, Acked() = %d", p.Acked, tr.Acked())
	}
	// Rule 1, independently of the model's bookkeeping: nothing confirmed
	// past a transaction that was never delivered. PostgreSQL skips, on the
	// next start, every transaction whose commit LSN is below the confirmed
	// position.
	for i, d := range m.delivered {
		if !d {
			if p.Acked > m.wal[i].final {
				t.Fatalf("acked %d passes transaction %d (commit at %d) that was never fully acked", p.Acked, i, m.wal[i].final)
			}
			break
		}
	}
	if p.Acked < m.prevAcked {
		t.Fatalf("acked moved backwards: %d after %d", p.Acked, m.prevAcked)
	}
	// Exactly the model's value: not past it (loss), not short of it
	// (a tracker that never confirms would pass the checks above).
	if p.Acked != m.acked {
		t.Fatalf("acked = %d; the model says %d", p.Acked, m.acked)
	}
	if p.Received != m.received {
		t.Fatalf("received = %d; the model says %d", p.Received, m.received)
	}
	if p.Received < p.Acked {
		t.Fatalf("received %d behind acked %d", p.Received, p.Acked)
	}
	if p.LastEvent != m.lastEvent {
		t.Fatalf("last event = %d; the model says %d", p.LastEvent, m.lastEvent)
	}
	// The stall clock (rule 10): it moves when work moves, and only then.
	if p.Progress != m.progress {
		t.Fatalf("progress = %d; the model says %d", p.Progress, m.progress)
	}
	if p.Dropped != m.dropped {
		t.Fatalf("dropped = %d; the model says %d", p.Dropped, m.dropped)
	}
	ackedOpen := 0
	for _, mt := range m.queue {
		ackedOpen += mt.acks
	}
	if p.AckedOpen != ackedOpen || p.DroppedAcked != m.droppedAcked || p.Ended != m.restarted {
		t.Fatalf("acked open %d, dropped acked %d, ended %v; the model says %d, %d, %v", p.AckedOpen, p.DroppedAcked, p.Ended, ackedOpen, m.droppedAcked, m.restarted)
	}
	if p.InFlight != len(m.records) {
		t.Fatalf("in flight = %d; the model says %d", p.InFlight, len(m.records))
	}
	if p.OpenTxns != len(m.queue) {
		t.Fatalf("open transactions = %d; the model says %d", p.OpenTxns, len(m.queue))
	}
	if tr.Idle() != (len(m.queue) == 0) {
		t.Fatalf("Idle() = %v with %d transactions open", tr.Idle(), len(m.queue))
	}
	if oldest := tr.OldestOpen(); len(m.queue) == 0 && !oldest.IsZero() {
		t.Fatalf("OldestOpen() = %v with nothing open", oldest)
	} else if len(m.queue) > 0 && !oldest.Equal(m.queue[0].tx.since) {
		t.Fatalf("OldestOpen() = %v; the oldest open transaction began at %v", oldest, m.queue[0].tx.since)
	}
	// Rule 4: acked transactions do not pile up at the head of the queue.
	tr.mu.Lock()
	head, n := tr.head, len(tr.queue)
	tr.mu.Unlock()
	if head > 1024 && head*2 > n {
		t.Fatalf("queue keeps %d acked transactions ahead of %d open ones", head, n-head)
	}
	// A waiter on Changed must wake when acked advances or something
	// leaves flight.
	signalled := false
	select {
	case <-tr.Changed():
		signalled = true
	default:
	}
	if (p.Acked != m.prevAcked || p.InFlight < m.prevInFlight) && !signalled {
		t.Fatalf("acked %d -> %d, in flight %d -> %d, and Changed was not signalled", m.prevAcked, p.Acked, m.prevInFlight, p.InFlight)
	}
	m.prevAcked, m.prevInFlight = p.Acked, p.InFlight
}

func (m *trackerModel) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"begin": func(t *rapid.T) {
			if !m.canRead() {
				t.Skip("the stream is inside a transaction or stopped")
			}
			m.begin(t)
		},
		"add": func(t *rapid.T) {
			if m.stopped || m.open == nil {
				t.Skip("no transaction being read")
			}
			m.add()
		},
		"commit": func(t *rapid.T) {
			if m.stopped || m.open == nil {
				t.Skip("no transaction being read")
			}
			m.commit()
		},
		"keepalive": func(t *rapid.T) {
			if m.stopped {
				t.Skip("the stream stopped")
			}
			m.keepalive(t)
		},
		// burst reads many small transactions at once, so that the queue
		// grows past its compaction threshold.
		"burst": func(t *rapid.T) {
			if !m.canRead() {
				t.Skip("the stream is inside a transaction or stopped")
			}
			n := rapid.IntRange(1, 2500).Draw(t, "burst")
			for range n {
				m.begin(t)
				m.add()
				m.commit()
			}
		},
		// done acks one record in flight, any of them: Kafka acks
		// partitions independently.
		"done": func(t *rapid.T) {
			if len(m.records) == 0 {
				t.Skip("nothing in flight")
			}
			m.done(rapid.IntRange(0, len(m.records)-1).Draw(t, "record"))
		},
		// ackOldest acks the k oldest records in order, as one partition's
		// acks come, checking after each.
		"ackOldest": func(t *rapid.T) {
			if len(m.records) == 0 {
				t.Skip("nothing in flight")
			}
			k := rapid.IntRange(1, len(m.records)).Draw(t, "acks")
			for range k {
				m.done(0)
				m.check(t)
			}
		},
		// abandon withdraws a record that was counted and never handed
		// to Kafka; the stream then stops, as Stream.emit does.
		"abandon": func(t *rapid.T) {
			if len(m.records) == 0 {
				t.Skip("nothing in flight")
			}
			i := rapid.IntRange(0, len(m.records)-1).Draw(t, "record")
			mt := m.records[i]
			m.records = slices.Delete(m.records, i, i+1)
			mt.tx.Abandon()
			mt.pending--
			mt.abandoned = true
			m.stopped = true
		},
		// stop ends the stream for another reason (an error, a shutdown),
		// perhaps inside a transaction.
		"stop": func(t *rapid.T) {
			m.stopped = true
		},
		// restart is the next session: the stream has ended and nothing is
		// in flight; it reads the WAL again from a position the tracker had
		// acked (the slot's confirmed position, possibly behind acked).
		"restart": func(t *rapid.T) {
			if len(m.records) > 0 {
				t.Skip("records still in flight")
			}
			m.tr.Reset()
			m.restarted = true
			forgot, acks := false, 0
			for _, mt := range m.queue {
				if mt.events {
					// The transaction's own end: its commit's once that
					// was read, else its final LSN (Begin's).
					end := m.wal[mt.wal].final
					if mt.committed {
						end = m.wal[mt.wal].end
					}
					m.dropped = max(m.dropped, end)
					forgot = true
				}
				acks += mt.acks
			}
			if forgot {
				m.droppedAcked = acks
			}
			var from []LSN
			for _, v := range m.ackedSeen {
				if v >= m.floor {
					from = append(from, v)
				}
			}
			start := rapid.SampledFrom(from).Draw(t, "restart at")
			m.floor, m.pos = start, start
			m.queue, m.open, m.stopped = nil, nil, false
			m.received = m.acked
			// PostgreSQL sends again every transaction whose commit is not
			// below the start.
			m.next = len(m.wal)
			for i, w := range m.wal {
				if w.final >= start {
					m.next = i
					break
				}
			}
		},
		"": func(t *rapid.T) { m.check(t) },
	}
}

func TestTrackerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newTrackerModel(LSN(rapid.Uint64Range(0, 1000).Draw(t, "start")))
		t.Repeat(m.actions())
	})
}
