package lease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTermDeadline: a term is valid until the TTL, less the guard, after
// the acquisition was sent; a renewal moves the deadline to the TTL after it
// was sent (never back); at the deadline the term ends as lost, and Valid
// says so at once, without waiting for the timer.
func TestTermDeadline(t *testing.T) {
	const ttl = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		renew time.Duration // when a renewal is sent after the acquisition; 0: none
		life  time.Duration // how long the term must last
	}{
		{"no renewal", 0, ttl - guard(ttl)},
		{"renewed at a third", ttl / 3, ttl/3 + ttl - guard(ttl)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := time.Now()
			term := newTerm("s", 7, sent, ttl)
			if !term.Valid() {
				t.Fatal("a new term is not valid")
			}
			if tc.renew > 0 {
				time.Sleep(tc.renew)
				term.extend(sent.Add(tc.renew), ttl)
				term.extend(sent, ttl) // a late, older renewal does not move it back
			}
			if got, want := term.Deadline(), sent.Add(tc.life); !got.Equal(want) {
				t.Fatalf("deadline %s after acquisition; want %s", got.Sub(sent), tc.life)
			}
			for term.Valid() {
				time.Sleep(time.Millisecond)
			}
			if lived := time.Since(sent); lived < tc.life {
				t.Errorf("term valid for %s; want %s", lived, tc.life)
			}
			select {
			case <-term.Context().Done():
			case <-time.After(time.Second):
				t.Fatal("the term's context did not end at the deadline")
			}
			if !term.Lost() || !errors.Is(term.Err(), ErrLost) {
				t.Errorf("term ended with %v; want ErrLost", term.Err())
			}
		})
	}
}

// TestTermValidWithoutTimer: Valid compares the clocks with the deadline
// itself, so a process whose timers have not run yet (just resumed after
// SIGSTOP) does not act as leader past its deadline; and the first look
// past the deadline ends the term, so that what hangs on its context stops
// then, not when the timer runs.
func TestTermValidWithoutTimer(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// A deadline passed, and a timer that has not fired yet.
	d := time.Now().Add(-time.Millisecond)
	term := &Term{Token: 1, ctx: ctx, cancel: cancel, deadline: d, wall: d.Round(0), timer: time.NewTimer(time.Hour)}
	defer term.timer.Stop()
	if term.Valid() {
		t.Fatal("a term past its deadline is valid")
	}
	if !term.Lost() {
		t.Fatalf("the term did not end as lost when Valid found its deadline passed: %v", term.Err())
	}
}

// TestTermValidAfterSuspend: the machine was suspended, so the monotonic
// clock says the deadline is still ahead while the wall clock (advanced by
// the kernel on resume) says it passed: the term is not valid, and ends.
// The other way round (the wall clock stepped back) the monotonic clock
// still ends it at its deadline.
func TestTermValidAfterSuspend(t *testing.T) {
	const ttl = 10 * time.Second
	t.Run("suspended", func(t *testing.T) {
		term := newTerm("s", 3, time.Now(), ttl)
		defer term.end(nil)
		if !term.Valid() {
			t.Fatal("a new term is not valid")
		}
		// As after a 30 s suspend: the monotonic deadline still ahead, the
		// wall-clock deadline 30 s - (TTL - guard) behind.
		term.mu.Lock()
		term.wall = term.wall.Add(-30 * time.Second)
		term.mu.Unlock()
		if term.Valid() {
			t.Fatalf("term valid %s before its monotonic deadline although the wall clock passed it", time.Until(term.Deadline()).Round(time.Millisecond))
		}
		select {
		case <-term.Context().Done():
		default:
			t.Fatal("the term's context did not end")
		}
		if !term.Lost() {
			t.Errorf("term ended with %v; want ErrLost", term.Err())
		}
	})
	t.Run("wall clock stepped back", func(t *testing.T) {
		const short = 200 * time.Millisecond
		sent := time.Now()
		term := newTerm("s", 4, sent, short)
		defer term.end(nil)
		term.mu.Lock()
		term.wall = term.wall.Add(time.Hour)
		term.mu.Unlock()
		for term.Valid() {
			time.Sleep(time.Millisecond)
		}
		if lived, want := time.Since(sent), short-guard(short); lived < want || lived > want+100*time.Millisecond {
			t.Errorf("term lived %s; want its monotonic deadline, %s", lived, want)
		}
	})
}

// TestGuard: the leader stops a tenth of the TTL (at least 50 ms) before the
// database could give the lease away.
func TestGuard(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second:            100 * time.Millisecond,
		10 * time.Second:       time.Second,
		200 * time.Millisecond: 50 * time.Millisecond,
	} {
		if got := guard(ttl); got != want {
			t.Errorf("guard(%s) = %s; want %s", ttl, got, want)
		}
	}
}
