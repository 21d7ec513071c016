package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// TestStallWatchFailingSessions (issue 13, review finding 1): sessions that
// each get past setup, read nothing that moves the acked position and end
// in error at once (a server error while decoding before any Begin, such as
// a publication missing at that point of the WAL) hold the lease while the
// slot stands still. With the reconnect backoff capped at 30 s and no gap
// longer than the timeout, no single wait is a stall, and nothing is ever
// in flight: only a clock kept across sessions sees it. It must fire within
// the timeout (plus a look) of the first session, stay on while sessions
// keep failing, whether or not a look happens to fall inside a session, and
// clear once a session makes progress, or lives for the timeout.
func TestStallWatchFailingSessions(t *testing.T) {
	const start = 7000
	for _, tc := range []struct {
		name   string
		looked bool // a look falls inside each session
	}{
		{"a look inside each session", true},
		{"no look inside a session", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newWatchClock(t)
			c.streaming = false
			c.tick(nil, time.Second) // the lease taken; the first session sets up
			began := c.now
			var tr *tracker.Tracker
			session := func() {
				tr = tracker.New(start)
				if tc.looked {
					c.streaming = true
					c.tick(tr, 50*time.Millisecond)
				} else {
					c.now = c.now.Add(50 * time.Millisecond)
				}
				tr.Reset()
				c.streaming = false
			}
			lastErr := func() string { return `stream slot "outbox_slot": ERROR: out of disk space (SQLSTATE 53100)` }
			backoff := 500 * time.Millisecond
			var firstStall time.Duration
			sessions := 0
			for c.now.Sub(began) < 4*testStallTimeout {
				session()
				sessions++
				// The backoff, looked at every 250 ms (health checks).
				for waited := time.Duration(0); waited < backoff; waited += 250 * time.Millisecond {
					s := c.tick(tr, 250*time.Millisecond)
					st, why := stalled(s, testStallTimeout, lastErr)
					at := c.now.Sub(began)
					if st && firstStall == 0 {
						firstStall = at
						if !strings.Contains(why, "out of disk space") || !strings.Contains(why, "session") {
							t.Fatalf("stalled with reason %q; want it to say that sessions keep failing, and the last error", why)
						}
					}
					if !st && firstStall != 0 {
						t.Fatalf("the stall cleared %s after the first session, while sessions still fail (session %d): %+v", at, sessions, s)
					}
					if !st && at > testStallTimeout+5*time.Second {
						t.Fatalf("not stalled %s after the first session (OUTBOX_STALL_TIMEOUT %s), after %d sessions that each ended with no progress: %+v", at, testStallTimeout, sessions, s)
					}
				}
				backoff = min(backoff*2, 30*time.Second)
			}
			t.Logf("stalled %s after the first session; %d sessions in %s", firstStall, sessions, c.now.Sub(began))

			// The cause is gone: the next session streams, but an idle
			// database moves nothing. Getting past setup is no proof (every
			// failed session did): stalled until it has lived the timeout.
			tr = tracker.New(start)
			c.streaming = true
			if s := c.tick(tr, time.Second); !isStalled(s) {
				t.Fatalf("a session streams again, nothing moved yet: %+v, want still stalled", s)
			}
			if s := c.idleFor(tr, testStallTimeout); isStalled(s) {
				t.Fatalf("a session streamed for %s without ending: %+v, want the stall cleared", testStallTimeout, s)
			}
			// Fails again: a new run of failures starts from its end.
			tr.Reset()
			c.streaming = false
			for range 3 {
				if s := c.idleFor(tr, 2*time.Second); isStalled(s) {
					t.Fatalf("seconds after a session that lived the timeout failed: %+v, want not stalled", s)
				}
				session()
			}
			// Progress ends it at once: a keepalive moves the acked position
			// past anything a failed session reached.
			tr = tracker.New(start)
			c.streaming = true
			c.tick(tr, time.Second)
			tr.ServerWALEnd(start + 500)
			if s := c.tick(tr, time.Second); isStalled(s) || s.setup != 0 {
				t.Fatalf("a session moved the acked position: %+v, want not stalled", s)
			}
		})
	}
}

// TestStallWatchBlipIsNoStall: a session that lived long ends in error
// once and the next one streams an idle database: never a stall, however
// long nothing moves. Nor is a leader whose sessions fail at setup only
// (no tracker) stalled once a session gets past it (TestStallWatchSetup).
func TestStallWatchBlipIsNoStall(t *testing.T) {
	c := newWatchClock(t)
	tr := tracker.New(100)
	c.idleFor(tr, 2*testStallTimeout)
	tr.Reset()
	c.streaming = false
	if s := c.idleFor(tr, 30*time.Second); isStalled(s) {
		t.Fatalf("a 30 s reconnect backoff after a long session: %+v, want not stalled", s)
	}
	tr = tracker.New(100)
	c.streaming = true
	if s := c.idleFor(tr, 3*testStallTimeout); isStalled(s) {
		t.Fatalf("an idle session after one failure: %+v, want not stalled", s)
	}
}
