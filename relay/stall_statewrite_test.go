package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// TestStallWatchStateWritesFail (issue 35, item 10): the state row cannot
// be written (a trigger that raises, a row lock another session holds).
// Every session delivers events, new ones too, ends at its first state
// write and the next starts again from the slot's confirmed position: the
// tracker counts progress in each, nothing is ever owed for long, and the
// sessions get further each time, but the position the state row records,
// past which nothing is confirmed, never moves and the slot holds the WAL.
// It is a stall within the timeout (plus a look) of the first failure, for
// as long as writes fail, whatever the reconnect backoff, naming the
// failed write; a write that passes ends it at once.
func TestStallWatchStateWritesFail(t *testing.T) {
	const failure = `save connector state for slot "outbox_slot" at 0/1A63DE0: ERROR: state row refused by a trigger (SQLSTATE P0001)`
	c := newWatchClock(t)
	end := tracker.LSN(1000)
	// deliver reads transactions from start up to end (again) and n new
	// ones past it, 3 events and 4 KiB of WAL each, all acked: a session
	// gets past the promise's headroom.
	const step = 4 << 10
	deliver := func(tr *tracker.Tracker, start tracker.LSN, n int) {
		for lsn := start + step; lsn <= end+tracker.LSN(n)*step; lsn += step {
			tx := tr.Begin(lsn)
			for range 3 {
				tx.Add()
			}
			tx.Commit(lsn)
			for range 3 {
				tx.Done()
			}
		}
		end += tracker.LSN(n) * step
	}

	// Healthy, under steady load: never a stall.
	tr := tracker.New(end)
	for range 2 * testStallTimeout / time.Second {
		deliver(tr, tr.Acked(), 1)
		if s := c.tick(tr, time.Second); isStalled(s) || s.unconfirmed > time.Second {
			t.Fatalf("healthy, delivering: %+v, want not stalled", s)
		}
	}

	c.writesFail = true
	slot := tr.Acked() // what the stream confirmed: up to the promise
	began := c.now
	backoff := 500 * time.Millisecond
	var first time.Duration
	sessions := 0
	for c.now.Sub(began) < 4*testStallTimeout {
		// A session: it streams from the slot's position, delivers what
		// the last one did and more, and ends at its first write.
		tr = tracker.New(slot)
		c.tick(tr, 100*time.Millisecond)
		deliver(tr, slot, 5)
		c.tick(tr, 200*time.Millisecond)
		c.stateFailed(failure)
		tr.Reset()
		sessions++
		c.streaming = false
		for waited := time.Duration(0); waited < backoff; waited += 250 * time.Millisecond {
			s := c.tick(tr, 250*time.Millisecond)
			st, why := stalled(s, testStallTimeout, func() string { return "" })
			at := c.now.Sub(began)
			if st && first == 0 {
				first = at
				if !strings.Contains(why, "state row refused by a trigger") || !strings.Contains(why, "not confirmed") || !strings.Contains(why, "outbox_connector_state") {
					t.Fatalf("stalled with reason %q; want it to say that delivered events are not confirmed, and the failed state write", why)
				}
			}
			if !st && first != 0 {
				t.Fatalf("the stall cleared %s after the first failure, while writes still fail (session %d): %+v", at, sessions, s)
			}
			if !st && at > testStallTimeout+2*time.Second {
				t.Fatalf("not stalled %s after state writes began to fail (OUTBOX_STALL_TIMEOUT %s), after %d sessions that each delivered events: %+v", at, testStallTimeout, sessions, s)
			}
		}
		c.streaming = true
		backoff = min(backoff*2, 30*time.Second)
	}
	t.Logf("stalled %s after the first failed write; %d sessions in %s", first, sessions, c.now.Sub(began))

	// A write passes: the recorded position moves past what was
	// delivered, and the stall ends at once.
	c.writesFail = false
	tr = tracker.New(slot)
	deliver(tr, slot, 1)
	if s := c.tick(tr, time.Second); isStalled(s) || s.unconfirmed != 0 {
		t.Fatalf("a state write passed: %+v, want not stalled", s)
	}
}

// TestStallWatchQuietIsNoStall: with nothing delivered, a recorded
// position that stands still is no stall, whatever else moves: an idle
// database (nothing moves), keepalives acking the server's WAL end on a
// busy one while state writes fail, a large transaction whose records are
// acked one by one while its end is not.
func TestStallWatchQuietIsNoStall(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		c := newWatchClock(t)
		c.writesFail = true
		tr := tracker.New(1000)
		if s := c.idleFor(tr, 3*testStallTimeout); isStalled(s) || s.unconfirmed != 0 {
			t.Fatalf("idle, writes failing: %+v, want not stalled", s)
		}
	})
	t.Run("keepalives", func(t *testing.T) {
		c := newWatchClock(t)
		tr := tracker.New(1000)
		c.tick(tr, time.Second)
		c.writesFail = true
		for i := range 3 * testStallTimeout / time.Second {
			tr.ServerWALEnd(1000 + tracker.LSN(i+1)*64<<10)
			if s := c.tick(tr, time.Second); isStalled(s) || s.unconfirmed != 0 {
				t.Fatalf("keepalives only, writes failing, look %d: %+v, want not stalled", i, s)
			}
		}
	})
	t.Run("large transaction", func(t *testing.T) {
		c := newWatchClock(t)
		tr := tracker.New(1000)
		tx := tr.Begin(5000)
		for range 1000 {
			tx.Add()
		}
		for i := range 3 * testStallTimeout / time.Second {
			tx.Done()
			if s := c.tick(tr, time.Second); isStalled(s) {
				t.Fatalf("record %d of a large transaction acked: %+v, want not stalled", i, s)
			}
		}
	})
}

// TestStalledSaidUnconfirmed: the reason names the positions, and the
// failed write or, with none, that none failed and the last error.
func TestStalledSaidUnconfirmed(t *testing.T) {
	s := stallState{unconfirmed: 90 * time.Second, confirmed: 0x1A0C5F0, delivered: 0x1A5FDE0}
	st, why := stalled(s, testStallTimeout, func() string { return "dial tcp: refused" })
	if !st || !strings.Contains(why, "0/1A5FDE0") || !strings.Contains(why, "0/1A0C5F0") || !strings.Contains(why, "no state write has failed") || !strings.Contains(why, "dial tcp: refused") {
		t.Errorf("no failed write: %v %q", st, why)
	}
	s.stateErr, s.stateErrAge = "lock timeout", 2*time.Second
	if st, why = stalled(s, testStallTimeout, func() string { return "dial tcp: refused" }); !st || !strings.Contains(why, "the last state write failed 2s ago: lock timeout") || strings.Contains(why, "dial tcp") {
		t.Errorf("a failed write: %v %q", st, why)
	}
	s.unconfirmed = testStallTimeout
	if st, _ = stalled(s, testStallTimeout, func() string { return "" }); st {
		t.Error("stalled at the timeout, not past it")
	}
}
