// Package lease elects the one connector instance that streams a slot (rule
// 8): a lease row per slot in PostgreSQL (public.outbox_lease) names the
// holder and carries a fencing token that grows by one on every acquisition.
//
// The row is the authority; its expiry is computed with the database's clock
// (clock_timestamp()), never with a clock of the hosts, and whether it has
// lapsed is decided by the same clock. The holder renews the row about every
// third of the TTL and, by its own monotonic clock counted from when it sent
// the last successful renewal, stops before the database could give the
// lease to anyone else (Term.Valid). A standby takes the row when it has
// lapsed, when it was released, or, unless Config.WaitForExpiry, at once when
// the holder's lease session no longer exists in pg_stat_activity (the holder
// was killed or its connection cut). That early takeover is safe only where
// the sink fences the old leader (Kafka's producer epoch in transactional
// mode): a holder whose connection died silently does not know, and may
// publish until its own deadline. A session-level advisory lock, held by the
// leader on its lease session, wakes the standbys the moment that session
// ends so that they need not poll; it is a hint only, since a PostgreSQL
// restart drops every advisory lock.
//
// The token fences the sinks: the connector's state writes are conditional
// on it (wal.Fence), and it travels in every Kafka record (header
// outbox.lease.token).
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLost is wrapped by every error that ends a term because this instance
// no longer holds the lease (or may no longer trust that it does).
var ErrLost = errors.New("leader lease lost")

// ErrFenced is wrapped by every write refused because this instance's term
// is over: a Kafka produce or commit after a newer leader initialised the
// slot's transactional id (or after the lease's deadline passed), a state
// write whose fence found another token. The one sentinel for "fenced"; it
// wraps ErrLost.
var ErrFenced = fmt.Errorf("this instance may no longer write, its term is over: %w", ErrLost)

// errReleased ends a term that was given up on purpose.
var errReleased = errors.New("leader lease released")

// Config is what an Elector needs.
type Config struct {
	// DSN is the libpq connection string of the database holding
	// public.outbox_lease (the connector's OUTBOX_PG_DSN).
	DSN string
	// Slot names the lease (one lease per replication slot).
	Slot string
	// Holder is this instance's name in the lease row; it must be unique
	// among the instances (default: host:pid:random, see DefaultHolder).
	Holder string
	// TTL is the lease's time to live (OUTBOX_LEASE_TTL, default 10s).
	TTL time.Duration
	// Poll is the longest a standby waits between looks at the lease
	// (default a tenth of the TTL, between 50ms and 1s). The end of the
	// leader's session and the lease's expiry wake it sooner.
	Poll time.Duration
	// WaitForExpiry is for sinks that do not fence a deposed leader (the
	// idempotent Kafka producer, OUTBOX_KAFKA_TRANSACTIONAL=false): a
	// standby then takes a lease its holder did not release only once the
	// lease has expired by the database's clock, even when the holder's
	// lease session is gone. Default false: a standby takes over as soon as
	// the holder's lease session ends, which is safe where the sink fences
	// (Kafka's producer epoch).
	WaitForExpiry bool
	// Log receives leadership changes, with the token.
	Log *slog.Logger
	// OnAcquire and OnEnd, when set, are called when a term starts and ends
	// (metrics).
	OnAcquire func(*Term)
	OnEnd     func(*Term, error)
}

// RenewEvery is how often a leader renews a lease of the given TTL.
func RenewEvery(ttl time.Duration) time.Duration { return ttl / 3 }

// guard is how long before the database could hand the lease to someone
// else a leader stops: time to stop the stream and abort the open Kafka
// transaction (or, without transactions, to close the Kafka client so that
// nothing it buffered is sent or retried), and room for the two clocks to run
// at slightly different rates.
//
// Why the deadline falls before the expiry: the leader takes sent from its
// clock before it sends the statement (acquire, hold); the database computes
// the expiry as clock_timestamp() + TTL while the statement runs, so after
// sent, and the leader's deadline is sent + TTL - guard whenever the reply
// arrives (extend). Only durations are compared, never instants of two
// clocks: the deadline precedes the expiry by at least the guard as long as
// neither clock gains more than the guard on the other over one TTL. A step
// of the database's clock forward (an NTP step, not a slew) by more than the
// guard breaks that, and so does a host clock that stops while the machine
// is suspended: see Valid.
func guard(ttl time.Duration) time.Duration { return max(ttl/10, 50*time.Millisecond) }

// Term is one leadership of this instance: from the acquisition of the lease
// until it is released or lost. Its context ends with the term.
type Term struct {
	// Token is the fencing token of this acquisition.
	Token int64
	// Acquired is when the acquisition was sent (monotonic).
	Acquired time.Time
	// Previous is the holder before this term ("" when the lease was free).
	Previous string
	// Reason says why the lease could be taken: free, released, expired,
	// or holder session ended.
	Reason string

	slot   string
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time // monotonic: the leader stops here unless renewed
	wall     time.Time // the same deadline by the wall clock (no monotonic reading)
	timer    *time.Timer
}

func newTerm(slot string, token int64, sent time.Time, ttl time.Duration) *Term {
	ctx, cancel := context.WithCancelCause(context.Background())
	d := sent.Add(ttl - guard(ttl))
	t := &Term{Token: token, Acquired: sent, slot: slot, ctx: ctx, cancel: cancel, deadline: d, wall: d.Round(0)}
	t.timer = time.AfterFunc(time.Until(t.deadline), t.expire)
	return t
}

// left is how long the term has to run at now: by the monotonic clock, and
// never longer than by the wall clock (see Valid).
func (t *Term) left(now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return min(t.deadline.Sub(now), t.wall.Sub(now.Round(0)))
}

// errDeadline ends a term whose deadline passed without a renewal.
var errDeadline = fmt.Errorf("%w: no renewal succeeded in time (deadline passed by this instance's clock)", ErrLost)

// expire ends the term when its deadline passed without a renewal. The
// timer may fire late (a frozen process): Valid does not depend on it.
func (t *Term) expire() {
	if wait := t.left(time.Now()); wait > 0 {
		t.mu.Lock()
		t.timer.Reset(wait)
		t.mu.Unlock()
		return
	}
	t.end(errDeadline)
}

// extend moves the deadline to sent+TTL-guard after a renewal sent at sent
// succeeded. The database computed the new expiry after sent, so the
// deadline falls before it (see guard).
func (t *Term) extend(sent time.Time, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d := sent.Add(ttl - guard(ttl)); d.After(t.deadline) {
		t.deadline, t.wall = d, d.Round(0)
	}
}

func (t *Term) end(cause error) {
	t.cancel(cause)
	t.mu.Lock()
	t.timer.Stop()
	t.mu.Unlock()
}

// Context is done when the term ends; its cause (Err) says why.
func (t *Term) Context() context.Context { return t.ctx }

// Err is why the term ended (wrapping ErrLost when it was lost), nil while
// it lasts.
func (t *Term) Err() error {
	if t.ctx.Err() == nil {
		return nil
	}
	return context.Cause(t.ctx)
}

// Deadline is when this instance stops leading unless a renewal succeeds.
func (t *Term) Deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadline
}

// Valid reports whether this instance may still act as the leader: the term
// has not ended and its deadline has passed by neither the monotonic clock
// nor the wall clock. It does not wait for the deadline's timer, so a
// process resumed after a freeze sees at once that it lost the lease; the
// first call that finds the deadline passed ends the term (its context), so
// that everything bound to it stops then, not when the timer runs.
//
// Why the wall clock too: Go's monotonic clock is CLOCK_MONOTONIC on Linux,
// which does not advance while the machine is suspended. A process resumed
// from a suspend reads less elapsed time than really passed and, by that
// clock alone, would think its term still had what was left of it before the
// suspend, while the database's clock ran on, the lease lapsed and a standby
// may lead. On resume the kernel advances the wall clock (CLOCK_REALTIME,
// read by the same time.Now, at no extra cost) by the time spent suspended,
// as it does CLOCK_BOOTTIME; so the wall clock shows the deadline passed at
// once. A wall clock stepped back (NTP) is caught by the monotonic one; one
// stepped forward only ends a term early. CLOCK_BOOTTIME would cost a
// system call on every check (per record) and sees no more than the wall
// clock does. What no clock of the host can see is a pause that stops every
// clock of a virtual machine (a hypervisor that pauses the guest's clock
// source, as QEMU does on stop, until the guest's time is set again by NTP
// or its agent): until the guest's wall clock is corrected, Valid may hold
// for what was left of the term (at most TTL - guard). The renewal due then
// (at most a third of the TTL after the last one) is refused, since another
// instance holds the token, and the new leader's termination of the old
// lease session ends the term as soon as the resumed process reads it.
func (t *Term) Valid() bool {
	if t.ctx.Err() != nil {
		return false
	}
	if t.left(time.Now()) > 0 {
		return true
	}
	t.end(errDeadline)
	return false
}

// Lost reports whether the term ended because the lease was lost rather
// than released.
func (t *Term) Lost() bool {
	return errors.Is(t.Err(), ErrLost)
}

// Elector competes for the lease of one slot and runs the leader's work
// while this instance holds it.
type Elector struct {
	cfg Config

	sess *session // owned by the goroutine running Run

	current atomic.Pointer[Term]
	failing atomic.Int64 // unix nanos of the first failed lease query since the last success, 0 when none
}

// New returns an elector; Run competes.
func New(cfg Config) *Elector {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = min(max(cfg.TTL/10, 50*time.Millisecond), time.Second)
	}
	return &Elector{cfg: cfg}
}

// Current is the current (or last) term, nil before the first.
func (e *Elector) Current() *Term { return e.current.Load() }

// Healthy reports whether the elector reaches the database: a standby that
// cannot see the lease could never take over.
func (e *Elector) Healthy() (bool, string) {
	if t := e.current.Load(); t != nil && t.Valid() {
		return true, ""
	}
	if f := e.failing.Load(); f != 0 {
		if since := time.Since(time.Unix(0, f)); since > e.cfg.TTL {
			return false, fmt.Sprintf("no lease query succeeded for %s", since.Round(time.Second))
		}
	}
	return true, ""
}

// contact records the outcome of a lease query, for Healthy.
func (e *Elector) contact(err error) {
	if err == nil {
		e.failing.Store(0)
	} else {
		e.failing.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// LeadFunc is the leader's work. ctx ends at shutdown (stop gracefully);
// t.Context() ends when the term does (stop at once, publish nothing more).
// It returns nil after a graceful stop, an error wrapping ErrLost when it
// lost the right to lead, or an error that stops the connector.
type LeadFunc func(ctx context.Context, t *Term) error

// Run competes for the lease until ctx ends, running lead for each term
// won. A term lost involuntarily is followed by a pause of one renewal
// interval (with WaitForExpiry, a TTL and a Poll) before competing again, so that a
// standby that saw the loss first takes over. Run returns nil at shutdown, or the first error of lead
// that does not wrap ErrLost (after releasing the lease).
func (e *Elector) Run(ctx context.Context, lead LeadFunc) error {
	defer e.closeSession()
	var pause time.Duration
	for {
		if pause > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
		}
		t, err := e.acquire(ctx)
		if err != nil {
			return err
		}
		if t == nil {
			return nil
		}
		err = e.lead(ctx, t, lead)
		switch {
		case ctx.Err() != nil && (err == nil || errors.Is(err, ErrLost)):
			return nil
		case errors.Is(err, ErrLost) || err == nil:
			// Lost (the lease, or the right to publish); or lead returned
			// with the term intact, which it does only to start over.
			pause = 0
			if t.Lost() {
				pause = RenewEvery(e.cfg.TTL)
				if e.cfg.WaitForExpiry {
					// No standby may take the lease before it expires, at
					// most a TTL from now, and a standby looks again at the
					// expiry or within Poll: step aside that long, so that
					// a standby rather than this instance (whose connection
					// or clock just failed it) takes over.
					pause = e.cfg.TTL + e.cfg.Poll
				}
			}
		default:
			return err
		}
	}
}

// lead runs lead for term t, renewing the lease until it returns, then
// releases the lease unless it was lost.
func (e *Elector) lead(ctx context.Context, t *Term, lead LeadFunc) error {
	done := make(chan error, 1)
	sess := e.sess
	sess.rearm()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := lead(ctx, t)
		done <- err
		// Wake the renewal loop if it is waiting on the lease session
		// (a renewal in flight runs to its end, then sees done). Only the
		// read deadline is touched from here; net.Conn allows it.
		sess.interrupt()
	}()
	leadErr := e.hold(t, done)
	wg.Wait()
	if t.Valid() {
		e.release(t)
	} else {
		t.end(fmt.Errorf("%w: term over", ErrLost))
		// The backend may be alive (a renewal timed out): close it so that
		// its pg_stat_activity row, the advisory lock and the walsender's
		// view of us all go.
		e.closeSession()
	}
	cause := t.Err()
	if e.cfg.OnEnd != nil {
		e.cfg.OnEnd(t, cause)
	}
	if errors.Is(cause, ErrLost) {
		e.cfg.Log.Warn("lost the leader lease; standing by", "slot", e.cfg.Slot, "token", t.Token, "err", cause)
	}
	if leadErr == nil && t.Lost() && ctx.Err() == nil {
		return cause
	}
	return leadErr
}

// hold renews the lease every third of the TTL until done delivers lead's
// result, watching the lease session between renewals: a session ended by
// the server (terminated, restarted) ends the term at once.
func (e *Elector) hold(t *Term, done <-chan error) error {
	every := RenewEvery(e.cfg.TTL)
	next := t.Acquired.Add(every)
	for {
		select {
		case err := <-done:
			return err
		default:
		}
		if !t.Valid() {
			t.end(fmt.Errorf("%w: no renewal succeeded in time", ErrLost))
			return <-done
		}
		if time.Until(next) > 0 {
			// Arm the read deadline, then look at done once more: lead's
			// goroutine sends on done before it interrupts the read, so
			// either the look sees its result or the read returns at once.
			e.sess.arm(next)
			select {
			case err := <-done:
				e.sess.disarm()
				return err
			default:
			}
			if err := e.sess.wait(); err != nil {
				t.end(fmt.Errorf("%w: the lease session ended: %v", ErrLost, err))
				return <-done
			}
			continue
		}
		sent := time.Now()
		err := e.renew(t)
		switch {
		case err == nil:
			e.contact(nil)
			t.extend(sent, e.cfg.TTL)
			next = sent.Add(every)
		case errors.Is(err, ErrLost):
			t.end(err)
			return <-done
		case e.retryable(err):
			// The server refused the statement but the session lives on
			// (a lock timeout, say): try again until the deadline.
			e.cfg.Log.Warn("renewing the leader lease failed; retrying until the deadline", "slot", e.cfg.Slot, "token", t.Token,
				"deadline_in", time.Until(t.Deadline()).Round(time.Millisecond), "err", err)
			next = time.Now().Add(min(every/4, 250*time.Millisecond))
		default:
			// The session is gone or in an unknown state. Its backend may be
			// gone too, and a standby may take over at once on seeing that:
			// stop now rather than race it with a new session.
			t.end(fmt.Errorf("%w: renewing on the lease session failed: %v", ErrLost, err))
			return <-done
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
