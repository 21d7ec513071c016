package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

const testStallTimeout = time.Minute

// watchClock drives a stallWatch with a fake clock: each look is one tick
// of the state writer (or one health check).
type watchClock struct {
	t         testing.TB
	w         stallWatch
	now       time.Time
	holding   bool
	streaming bool // a session is streaming (past setup and the snapshot)
	// promise is the position the state row records; writesFail: the
	// state writer's writes fail (by default each look finds a write that
	// recorded one past the acked position, as a healthy writer's every
	// OUTBOX_STATUS_INTERVAL).
	promise    tracker.LSN
	writesFail bool
}

func newWatchClock(t testing.TB) *watchClock {
	return &watchClock{t: t, w: stallWatch{timeout: testStallTimeout}, now: time.Unix(1_000_000, 0), holding: true, streaming: true}
}

// tick advances the clock by d and looks at tr.
func (c *watchClock) tick(tr *tracker.Tracker, d time.Duration) stallState {
	c.t.Helper()
	c.now = c.now.Add(d)
	if tr != nil && !c.writesFail && tr.Acked() > c.promise {
		c.promise = tr.Acked() + 16<<10 // checkpoint's headroom
	}
	return c.w.look(tr, c.holding, c.streaming, c.promise, c.now)
}

// stateFailed reports a failed state write, as a session's writer does.
func (c *watchClock) stateFailed(msg string) { c.w.stateFailed(msg, c.now) }

// idleFor looks at tr every second for d, with nothing happening, and
// returns the last look.
func (c *watchClock) idleFor(tr *tracker.Tracker, d time.Duration) stallState {
	c.t.Helper()
	var s stallState
	for i := time.Duration(0); i < d; i += time.Second {
		s = c.tick(tr, time.Second)
	}
	return s
}

func isStalled(s stallState) bool {
	st, _ := stalled(s, testStallTimeout, func() string { return "" })
	return st
}

// TestStallWatchLooksAreNoProgress is the defect of issue 13: the state
// writer looks every tick whether anything moved or not, and that must not
// keep the clock fresh. Events in flight with no acknowledgement for longer
// than the timeout are a stall however often something looks; one
// acknowledgement restarts the clock; nothing in flight is never a stall.
func TestStallWatchLooksAreNoProgress(t *testing.T) {
	c := newWatchClock(t)
	tr := tracker.New(100)
	if s := c.idleFor(tr, time.Hour); s.owed || isStalled(s) {
		t.Fatalf("idle for an hour: %+v, want nothing owed", s)
	}
	tx := tr.Begin(200)
	for range 3 {
		tx.Add()
	}
	tx.Commit(200)
	// After an hour of idling, work that just arrived is not a stall: the
	// clock starts when work is first owed.
	if s := c.tick(tr, time.Second); !s.owed || s.waiting != 0 || isStalled(s) {
		t.Fatalf("work just arrived: %+v, want owed, waiting 0", s)
	}
	if s := c.idleFor(tr, testStallTimeout); isStalled(s) {
		t.Fatalf("%s without progress: stalled already (%+v)", testStallTimeout, s)
	}
	s := c.tick(tr, time.Second)
	if !isStalled(s) || s.inFlight != 3 {
		t.Fatalf("%s without progress, looked at every second: %+v, want stalled with 3 in flight", testStallTimeout+time.Second, s)
	}
	tx.Done() // one record acked: progress, though the acked LSN stays
	if s := c.tick(tr, time.Second); isStalled(s) || s.waiting != 0 || tr.Acked() != 100 {
		t.Fatalf("after one ack: %+v (acked %d), want not stalled, clock restarted, acked still 100", s, tr.Acked())
	}
	if s := c.idleFor(tr, testStallTimeout+time.Second); !isStalled(s) {
		t.Fatalf("no progress again for %s: %+v, want stalled", testStallTimeout+time.Second, s)
	}
	tx.Done()
	tx.Done()
	if s := c.tick(tr, time.Second); s.owed || isStalled(s) || tr.Acked() != 200 {
		t.Fatalf("everything acked: %+v (acked %d), want nothing owed, acked 200", s, tr.Acked())
	}
	if s := c.idleFor(tr, time.Hour); s.owed {
		t.Fatalf("idle again: %+v", s)
	}
}

// TestStallWatchLargeTransaction: one PostgreSQL transaction of 100,000
// records, acknowledged one every 200 ms (5.5 hours, far past the stall
// timeout) while its end LSN stays unacked until the last: never a stall.
// Acknowledgements that stop half-way are one after the timeout.
func TestStallWatchLargeTransaction(t *testing.T) {
	const records = 100_000
	c := newWatchClock(t)
	tr := tracker.New(100)
	tx := tr.Begin(500)
	for range records {
		tx.Add()
	}
	tx.Commit(500)
	var worst time.Duration
	for i := range records {
		if i == records/2 {
			if s := c.idleFor(tr, testStallTimeout+2*time.Second); !isStalled(s) {
				t.Fatalf("acks stopped half-way for %s: %+v, want stalled", testStallTimeout+2*time.Second, s)
			}
		}
		tx.Done()
		s := c.tick(tr, 200*time.Millisecond)
		if i < records-1 {
			if isStalled(s) || tr.Acked() != 100 {
				t.Fatalf("record %d acked: %+v (acked %d), want not stalled, acked 100", i, s, tr.Acked())
			}
			worst = max(worst, s.waiting)
		}
	}
	if tr.Acked() != 500 {
		t.Fatalf("acked %d after every record, want 500", tr.Acked())
	}
	if worst > time.Second {
		t.Errorf("waited up to %s between acks 200 ms apart", worst)
	}
}

// TestStallWatchReconnectLoop: sessions that each read the same events,
// deliver nothing and end after a few seconds (a Kafka transaction that
// never commits) are a stall after the timeout, though every session is
// shorter than it and nothing is in flight between sessions; a session
// that delivers ends it. Work dropped by a session is owed until a later
// session's acked position passes it, by delivery or by a keepalive.
func TestStallWatchReconnectLoop(t *testing.T) {
	c := newWatchClock(t)
	session := func(start tracker.LSN, deliver bool) *tracker.Tracker {
		tr := tracker.New(start)
		c.tick(tr, time.Second) // streaming, nothing read yet
		tx := tr.Begin(start + 100)
		tx.Add()
		tx.Add()
		tx.Commit(start + 100)
		c.idleFor(tr, 3*time.Second)
		if deliver {
			tx.Done()
			tx.Done()
			return tr
		}
		tx.Abandon()
		tx.Abandon()
		tr.Reset()
		return tr
	}
	var last *tracker.Tracker
	elapsed := time.Duration(0)
	for elapsed <= testStallTimeout {
		last = session(200, false)
		// Reconnect backoff: the last session's tracker stays current,
		// Reset, nothing in flight.
		s := c.idleFor(last, 2*time.Second)
		if !s.owed || s.inFlight != 0 {
			t.Fatalf("between sessions: %+v, want work owed, nothing in flight", s)
		}
		elapsed += 6 * time.Second
	}
	s := c.tick(last, time.Second)
	st, why := stalled(s, testStallTimeout, func() string { return "commit the Kafka transaction: boom" })
	if !st || !strings.Contains(why, "not delivered") || !strings.Contains(why, "boom") {
		t.Fatalf("after %s of sessions that deliver nothing: %+v %q, want stalled, saying why", elapsed, s, why)
	}
	// A session that delivers: progress, and nothing owed once acked
	// passes what was dropped.
	tr := session(200, true)
	if s := c.tick(tr, time.Second); s.owed || isStalled(s) {
		t.Fatalf("a session delivered everything: %+v, want nothing owed", s)
	}

	// Dropped work that a keepalive settles: the dropped transaction was
	// still open (it aborts later), the next session reads nothing of it,
	// and the WAL end it reports passes it.
	c.tick(session(300, false), time.Second)
	tr = tracker.New(300)
	if s := c.idleFor(tr, 10*time.Second); !s.owed {
		t.Fatalf("new session, dropped work not re-read yet: %+v, want owed", s)
	}
	tr.ServerWALEnd(450)
	if s := c.tick(tr, time.Second); s.owed {
		t.Fatalf("acked past the dropped work by a keepalive: %+v, want nothing owed", s)
	}
}

// TestStallWatchWithoutLease: an instance that does not hold the lease owes
// nothing (the leader does), even with a tracker that dropped work; when it
// leads again, what its old term dropped is not owed (another leader may
// have delivered it), but what the new term reads is.
func TestStallWatchWithoutLease(t *testing.T) {
	c := newWatchClock(t)
	tr := tracker.New(100)
	tx := tr.Begin(200)
	tx.Add()
	c.tick(tr, time.Second)
	c.holding = false
	tx.Abandon()
	tr.Reset()
	if s := c.idleFor(tr, 2*testStallTimeout); s.owed || isStalled(s) {
		t.Fatalf("standby: %+v, want nothing owed", s)
	}
	c.holding = true
	if s := c.idleFor(tr, 2*testStallTimeout); s.owed {
		t.Fatalf("leading again, old term's tracker: %+v, want nothing owed", s)
	}
	tr = tracker.New(250)
	if s := c.idleFor(tr, 2*testStallTimeout); s.owed {
		t.Fatalf("leading again, new session idle: %+v, want nothing owed", s)
	}
	tx = tr.Begin(300)
	tx.Add()
	if s := c.idleFor(tr, testStallTimeout+2*time.Second); !isStalled(s) {
		t.Fatalf("new term, nothing acked: %+v, want stalled", s)
	}
}

// TestStallWatchSnapshot: no state writer runs during the initial snapshot,
// so only health checks look, sparsely. Progress between two looks counts
// (the clock restarts at the look that sees it): a snapshot delivering
// steadily is never a stall, whatever its length.
func TestStallWatchSnapshot(t *testing.T) {
	c := newWatchClock(t)
	tr := tracker.New(0)
	tx := tr.Begin(0)
	for range 1000 {
		tx.Add()
	}
	for i := range 100 {
		for range 10 {
			tx.Done()
		}
		if s := c.tick(tr, 30*time.Second); isStalled(s) {
			t.Fatalf("look %d, 30 s apart, records acked in between: %+v", i, s)
		}
	}
}

// TestStallWatchSnapshotLoop (issue 13, review finding 6): the initial
// snapshot fails in a loop, every 20 s (a row that fails every time, a
// backoff). Its transaction begins and commits at the slot's consistent
// point, which is also where every session's tracker starts, so its acked
// position is already at what the last session dropped before it reads
// anything; and each session delivers the rows before the failing one
// again. Neither is progress: with looks between sessions and one between
// a session's start and its first row, it is a stall after the timeout,
// and stays one. A session that gets further than any before restarts the
// clock; one that delivers the whole snapshot ends the debt.
func TestStallWatchSnapshotLoop(t *testing.T) {
	const start = 5000
	c := newWatchClock(t)
	// session takes the snapshot; the first delivered rows are acked,
	// then it fails, its rows not yet acked are withdrawn, and the next
	// session starts 20 s after this one did.
	session := func(delivered, failed int, complete bool) stallState {
		tr := tracker.New(start)
		c.streaming = false // no state writer, no stream during a snapshot
		// A look between the session storing its tracker and its first
		// row: nothing of the new session is owed yet.
		c.tick(tr, 100*time.Millisecond)
		tx := tr.Begin(start)
		for range delivered + failed {
			tx.Add()
		}
		c.tick(tr, time.Second)
		for range delivered {
			tx.Done()
		}
		if complete {
			tx.Commit(start)
			c.streaming = true
			return c.tick(tr, time.Second)
		}
		for range failed {
			tx.Abandon()
		}
		s := c.tick(tr, time.Second)
		tr.Reset()
		for range 17 { // the reconnect backoff, looked at every second
			s = c.tick(tr, time.Second)
		}
		c.tick(tr, 900*time.Millisecond)
		return s
	}
	elapsed := time.Duration(0)
	for elapsed < 5*testStallTimeout {
		s := session(1, 1, false)
		elapsed += 20 * time.Second
		st, why := stalled(s, testStallTimeout, func() string { return "snapshot row: injected" })
		if elapsed > testStallTimeout+20*time.Second && !st {
			t.Fatalf("after %s of snapshots that each fail after delivering the same first row again: %+v, want stalled", elapsed, s)
		}
		if st && !strings.Contains(why, "injected") {
			t.Fatalf("stalled without the last error: %q", why)
		}
	}
	// Further than any session before: one more row delivered.
	if s := session(2, 1, false); s.waiting > 20*time.Second {
		t.Fatalf("a session delivered more of the snapshot than any before: %+v, want the clock restarted", s)
	}
	if s := session(2, 1, false); s.waiting < 20*time.Second {
		t.Fatalf("the next session delivered no more than that one: %+v, want the clock running on", s)
	}
	if s := session(3, 0, true); s.owed || isStalled(s) {
		t.Fatalf("a session delivered the whole snapshot: %+v, want nothing owed", s)
	}
	if s := c.idleFor(tracker.New(start), 2*testStallTimeout); s.owed {
		t.Fatalf("the snapshot was delivered; later sessions idle: %+v, want nothing owed", s)
	}
}

// TestStallWatchUncommittedDrop (finding 6): a transaction dropped before
// its commit was read (blocked in the hand-over to a producer that
// acknowledges nothing) leaves received where it began; the debt is the
// transaction's own end (Begin's final LSN), so the next session, whose
// acked position starts at received, still owes it until it delivers it.
func TestStallWatchUncommittedDrop(t *testing.T) {
	c := newWatchClock(t)
	var last *tracker.Tracker
	for elapsed := time.Duration(0); elapsed <= testStallTimeout+20*time.Second; elapsed += 10 * time.Second {
		tr := tracker.New(100)
		c.tick(tr, 100*time.Millisecond) // before the first record
		tx := tr.Begin(200)
		tx.Add()
		tx.Add()
		c.idleFor(tr, 5*time.Second)
		tx.Abandon()
		tx.Abandon()
		tr.Reset()
		c.idleFor(tr, 4900*time.Millisecond)
		last = tr
	}
	if s := c.tick(last, time.Second); !isStalled(s) {
		t.Fatalf("sessions that each drop the same uncommitted transaction for %s: %+v, want stalled", testStallTimeout+20*time.Second, s)
	}
	// Delivered at last: acked passes its commit.
	tr := tracker.New(100)
	tx := tr.Begin(200)
	tx.Add()
	tx.Commit(210)
	tx.Done()
	if s := c.tick(tr, time.Second); s.owed || isStalled(s) {
		t.Fatalf("the dropped transaction was delivered: %+v, want nothing owed", s)
	}
}

// TestStallWatchSetup (finding 7): an instance that holds the lease and
// has no session past setup (it cannot reach Kafka to fence the previous
// leader, or PostgreSQL, or a slot check fails again and again) is a stall
// after the timeout: no standby takes over while the lease is renewed,
// and the WAL grows. A streaming leader with nothing to do is not one, nor
// is a standby, nor a snapshot in progress (its tracker exists and counts
// progress), nor the wait for a snapshot's first row.
func TestStallWatchSetup(t *testing.T) {
	lastErr := func() string {
		return "initialise the Kafka transactional producer: dial tcp 127.0.0.1:1: connect: connection refused"
	}
	t.Run("first session never gets past setup", func(t *testing.T) {
		c := newWatchClock(t)
		c.streaming = false
		if s := c.idleFor(nil, testStallTimeout); isStalled(s) {
			t.Fatalf("setting up for %s: stalled already (%+v)", testStallTimeout, s)
		}
		s := c.idleFor(nil, 2*time.Second)
		st, why := stalled(s, testStallTimeout, lastErr)
		if !st || !strings.Contains(why, "Kafka") || !strings.Contains(why, "lease") {
			t.Fatalf("holding the lease, no session past setup for %s: %v %q, want stalled naming the lease and the last error", testStallTimeout+2*time.Second, st, why)
		}
		// It streams at last: not stalled.
		c.streaming = true
		tr := tracker.New(100)
		if s := c.tick(tr, time.Second); isStalled(s) {
			t.Fatalf("streaming: %+v, want not stalled", s)
		}
		// A healthy idle leader: nothing written for twice the timeout.
		if s := c.idleFor(tr, 2*testStallTimeout); s.owed || isStalled(s) {
			t.Fatalf("an idle streaming leader: %+v, want not stalled", s)
		}
		// The session ends with nothing owed; the next cannot get past
		// setup.
		c.streaming = false
		tr.Reset()
		if s := c.idleFor(tr, 30*time.Second); isStalled(s) {
			t.Fatalf("a reconnect backoff of 30 s: %+v, want not stalled", s)
		}
		if s := c.idleFor(tr, testStallTimeout-28*time.Second); !isStalled(s) {
			t.Fatalf("the session ended, the next stuck in setup for %s: %+v, want stalled", testStallTimeout+2*time.Second, s)
		}
	})
	t.Run("standby", func(t *testing.T) {
		c := newWatchClock(t)
		c.streaming, c.holding = false, false
		if s := c.idleFor(nil, 2*testStallTimeout); isStalled(s) {
			t.Fatalf("a standby for %s: %+v, want not stalled", 2*testStallTimeout, s)
		}
	})
	t.Run("snapshot in progress", func(t *testing.T) {
		c := newWatchClock(t)
		c.streaming = false
		tr := tracker.New(100)
		tx := tr.Begin(100)
		// The snapshot's query sorts the table before its first row.
		if s := c.idleFor(tr, 2*testStallTimeout); isStalled(s) {
			t.Fatalf("a snapshot waiting for its first row: %+v, want not stalled", s)
		}
		for i := range 40 {
			for range 5 {
				tx.Add()
			}
			for range 5 {
				tx.Done()
			}
			if s := c.tick(tr, 15*time.Second); isStalled(s) {
				t.Fatalf("a snapshot delivering rows, look %d: %+v, want not stalled", i, s)
			}
		}
	})
	t.Run("a new term with the old term's tracker", func(t *testing.T) {
		c := newWatchClock(t)
		tr := tracker.New(100)
		c.tick(tr, time.Second)
		c.holding, c.streaming = false, false
		tr.Reset()
		c.idleFor(tr, 2*testStallTimeout)
		c.holding = true // the lease again; the new session cannot set up
		if s := c.idleFor(tr, testStallTimeout+2*time.Second); !isStalled(s) {
			t.Fatalf("leading again, no session past setup for %s: %+v, want stalled", testStallTimeout+2*time.Second, s)
		}
	})
}
