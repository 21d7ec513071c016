package relay

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// stallWatch is the liveness clock behind /healthz and
// outbox_connector_stalled: how long work has been owed (events in flight,
// or events a stream read and could not deliver before it ended) with no
// progress (a record acknowledged or dead-lettered, the acked position
// moving); and how long this instance has held the lease with no session
// past setup.
//
// The tracker counts progress without reading the clock; the watch reads it
// when it looks, and restarts the clock only when the count moved since its
// last look, or when work becomes owed after none was. It looks on every
// state writer tick (OUTBOX_STATUS_INTERVAL) while streaming and whenever
// /healthz or /metrics asks, so a stall is seen at most one of those
// intervals late. Looking alone never restarts it: a liveness clock
// refreshed by a timer instead of by progress never fires.
//
// The clock outlives a session. A session that reads events, fails to
// deliver them and ends (a Kafka transaction that never commits, a record
// that aborts every transaction, a snapshot that fails at a row) leaves
// its tracker Dropped; the next session's tracker counts from zero, and the
// work is still owed (the debt) until that session delivers the dropped
// transactions or its acked position passes them. Until then progress
// counts only where the session gets further than any session of the debt
// did: one that delivers again the records an earlier one delivered
// (every session starts from the slot's confirmed position, and a snapshot
// from its first row) is repeating, not progressing. Otherwise a reconnect
// loop, each session shorter than the stall timeout, would never be a
// stall. The price: a session that re-delivers, after a failure, more than
// a stall timeout's worth of records (a large snapshot taken again) is
// reported stalled until it passes the point the failed one reached.
//
// Setup is the time from taking the lease, or from a session's end, to
// the next session storing its tracker: connecting, fencing the previous
// leader at Kafka, freeing and checking the slot. No work is owed then,
// but a leader that cannot get past it (Kafka unreachable, a slot check
// failing at every try) renews its lease, so no standby takes over, and the
// WAL grows. A snapshot in progress is past setup: its tracker counts the
// rows it delivers.
//
// Getting past setup is no proof of health once a session that got past it
// ended without proving itself: sessions that each start streaming and fail
// before anything moves (a server error decoding a change before any Begin)
// owe no work and are past setup for a moment each, and with the reconnect
// backoff capped below the timeout no single wait is one either; the slot
// stands still while the lease is renewed. A session proves itself by
// progress past the furthest point of every session since the last one that
// proved itself (its acked position, or records acked past it, or the work
// dropped before it delivered), or by living for the stall timeout. Until
// one does, the setup clock runs on across sessions, from the end of the
// first session that failed unproven (or from taking the lease), and stops
// (not restarts) while a session runs: a stall once the clock passes the
// timeout, and until a session proves itself.
//
// Delivered is not confirmed. A third clock (WAL mode) runs while events
// delivered to Kafka wait for the position recorded in the state row, past
// which nothing is confirmed to PostgreSQL, to move past them, and
// restarts only when a write moves it: state writes that keep failing
// leave it standing while every session delivers (see look).
type stallWatch struct {
	mu   sync.Mutex
	tr   *tracker.Tracker // the tracker last looked at
	seen uint64           // its progress count then
	// stale: tr belongs to a term this instance lost; what it dropped,
	// another leader may have delivered since.
	stale bool
	// debt: earlier sessions of this term dropped work up to owedTo that
	// no session has delivered since; reached is the furthest any of them
	// got.
	debt    bool
	owedTo  tracker.LSN
	reached reach
	owed    bool      // work was owed at the last look
	at      time.Time // since when owed work made no progress
	setup   time.Time // since when holding the lease with no session past setup, or none proven since one failed (zero: not so at the last look)

	// timeout is the stall timeout: a session that lives this long without
	// ending has proved itself. Zero: getting past setup is proof enough.
	timeout time.Duration
	// live is when the current tracker was first seen with its session
	// running (zero: not seen so); base is its reach then, proven whether
	// it has proved itself, ended whether its end was counted.
	live          time.Time
	base          reach
	proven, ended bool
	// failed counts the sessions that got past setup and ended unproven
	// since the last that proved itself; best is the furthest any of them,
	// or that one, reached.
	failed int
	best   reach

	// The position the state row records (WAL mode; see look): confMax is
	// the furthest this term; unconf the end of the newest transaction
	// with events delivered past it (0: none waits), and unconfAt since
	// when such events have waited with it unmoved. Kept across sessions,
	// like the debt: each session starts from the slot's confirmed
	// position and delivers them again.
	confMax, unconf tracker.LSN
	unconfAt        time.Time
	// stateErr is the last state write that failed (a session's writer),
	// and when.
	stateErr   string
	stateErrAt time.Time
	// writer is the current (or last) session's state writer: its
	// recorded promise is the position looked at (nil: none, poll mode).
	writer atomic.Pointer[checkpoint.Writer]
	// held is what PostgreSQL holds the session's replication connection
	// for (nil: nothing), a reason source (see Relay.watchWalsender);
	// heldBy the outbox_connector_walsender_held_by series set for it,
	// touched only by the watch's goroutine (a session joins its watch
	// before it ends, so two never overlap).
	held   atomic.Pointer[wal.Hold]
	heldBy map[[2]string]bool
}

// reach is how far a session got: its acked position, and records acked
// past it.
type reach struct {
	acked tracker.LSN
	more  int
}

func (a reach) beyond(b reach) bool {
	return a.acked > b.acked || a.acked == b.acked && a.more > b.more
}

// stallState is one look's result.
type stallState struct {
	inFlight int
	owed     bool          // events in flight, or read and not yet delivered
	waiting  time.Duration // owed with no progress for this long (0 when nothing is owed)
	setup    time.Duration // holding the lease with no session past setup (or none proven) for this long
	failed   int           // sessions that got past setup and ended unproven in that time
	// unconfirmed: events delivered (up to delivered) have waited this
	// long for the position the state row records, which stands at
	// confirmed (0 when none waits); stateErr is the last failed state
	// write, stateErrAge ago.
	unconfirmed          time.Duration
	confirmed, delivered tracker.LSN
	stateErr             string
	stateErrAge          time.Duration
}

// look reads t (the current or last session's tracker; nil before the
// first) at now. holding is false when this instance does not hold the
// lease: then another instance owes the work, and nothing here is a stall.
// streaming: a session is streaming the slot. confirmed is the position
// the state row records (the writer's promise), past which nothing is
// confirmed to PostgreSQL (0: none kept, poll mode).
//
// Delivering events is progress for the work owed, not for the slot: a
// session whose state writes fail (a trigger that raises, a row lock held
// by another session) delivers its events, ends at its first write, and
// the next delivers them again from the slot's confirmed position, which
// never moves while the WAL piles up. So events delivered past the
// recorded position wait on a clock of their own, restarted only when a
// write moves it. The recorded position, not the one last sent: that one
// creeps up to the promise session after session while writes fail, and
// each step would restart the clock. A healthy writer records a promise
// past every acked position once per OUTBOX_STATUS_INTERVAL. With nothing
// delivered there is nothing to record: an idle outbox, whose position
// follows the keepalives' WAL end within the promise or stands still, is
// never a stall.
func (w *stallWatch) look(t *tracker.Tracker, holding, streaming bool, confirmed tracker.LSN, now time.Time) stallState {
	// Positions is read under w.mu: two lookers (a scrape and a health
	// check) must not apply their readings out of order, or an older count
	// would look like progress.
	w.mu.Lock()
	defer w.mu.Unlock()
	if !holding {
		w.tr, w.seen, w.stale = t, 0, true
		w.debt, w.owedTo, w.reached, w.owed, w.setup = false, 0, reach{}, false, time.Time{}
		w.live, w.base, w.proven, w.ended, w.failed, w.best = time.Time{}, reach{}, false, false, 0, reach{}
		w.confMax, w.unconf = 0, 0
		return stallState{}
	}
	if t != w.tr {
		// A new session (or the first): its tracker counts from zero, and
		// inherits what the last one dropped (and what that one still owed).
		if w.tr != nil && !w.stale {
			p := w.tr.Positions()
			if p.Dropped != 0 {
				w.debt = true
				w.owedTo = max(w.owedTo, p.Dropped)
				if r := (reach{p.Acked, p.DroppedAcked}); r.beyond(w.reached) {
					w.reached = r
				}
			}
			w.sessionEnded(p, now)
		}
		w.tr, w.seen, w.stale = t, 0, t == nil
		w.live, w.base, w.proven, w.ended = time.Time{}, reach{}, false, false
	}
	var s stallState
	var p tracker.Positions
	if t != nil {
		p = t.Positions()
	}
	var progressed, delivered bool
	if t != nil && !w.stale {
		progressed = p.Progress != w.seen
		w.seen = p.Progress
		if w.debt {
			if p.Acked > w.owedTo || p.LastEvent >= w.owedTo {
				// Delivered (a transaction with events acked at or past
				// what was dropped), or passed by a keepalive (it aborted).
				w.debt, w.owedTo, w.reached = false, 0, reach{}
				progressed, delivered = true, true
			} else if !(reach{p.Acked, p.AckedOpen}).beyond(w.reached) {
				progressed = false // delivering again what an earlier session did
			}
		}
	}
	// Past setup: a session's tracker is there and its session has not
	// ended. Not an old term's tracker.
	if streaming || t != nil && !w.stale && !p.Ended {
		if w.live.IsZero() {
			w.live, w.base = now, reach{p.Acked, p.AckedOpen}
		}
		if !w.proven && (delivered || now.Sub(w.live) >= w.timeout || (reach{p.Acked, p.AckedOpen}).beyond(w.ref())) {
			w.proven = true
		}
		if !w.setup.IsZero() && (w.failed == 0 || w.proven) {
			// Past setup with no session failed since the clock started
			// (setup was what failed), or proven: the clock stops.
			w.setup = time.Time{}
		}
		if !w.setup.IsZero() {
			// Not proven yet after sessions that failed: the clock stands
			// still while this one runs.
			s.setup, s.failed = w.live.Sub(w.setup), w.failed
		}
	} else {
		if t != nil && !w.stale && p.Ended {
			w.sessionEnded(p, now)
		}
		if w.setup.IsZero() {
			w.setup = now
		}
		s.setup, s.failed = now.Sub(w.setup), w.failed
	}
	if t == nil || w.stale {
		w.owed = false
		return s
	}
	if confirmed != 0 {
		if confirmed > w.confMax {
			w.confMax, w.unconfAt = confirmed, now
		}
		if p.LastEvent > confirmed && p.LastEvent > w.unconf {
			if w.unconf == 0 {
				w.unconfAt = now
			}
			w.unconf = p.LastEvent
		}
		if w.unconf <= w.confMax {
			w.unconf = 0
		}
		if w.unconf != 0 {
			s.unconfirmed, s.confirmed, s.delivered = now.Sub(w.unconfAt), w.confMax, w.unconf
			if s.stateErr = w.stateErr; s.stateErr != "" {
				s.stateErrAge = now.Sub(w.stateErrAt)
			}
		}
	}
	owed := p.InFlight > 0 || p.Dropped != 0 || w.debt
	if progressed || owed && !w.owed {
		w.at = now
	}
	w.owed = owed
	if owed {
		s.inFlight, s.owed, s.waiting = p.InFlight, true, now.Sub(w.at)
	}
	return s
}

// stateFailed keeps a state write that failed at at, for the reason of
// the stall it causes.
func (w *stallWatch) stateFailed(msg string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stateErr, w.stateErrAt = msg, at
}

// ref is the reach a session must pass to prove itself: where it started,
// and the furthest any session since the last proven one got.
func (w *stallWatch) ref() reach {
	if w.best.beyond(w.base) {
		return w.best
	}
	return w.base
}

// sessionEnded counts the end of the current tracker's session, once, with
// p its positions after the end. A session never seen running lived less
// than one look's interval: it proved itself only by getting further than
// the sessions before it.
func (w *stallWatch) sessionEnded(p tracker.Positions, now time.Time) {
	if w.ended {
		return
	}
	w.ended = true
	r := reach{p.Acked, 0}
	if p.Dropped != 0 {
		r.more = p.DroppedAcked
	}
	if !w.proven {
		if w.live.IsZero() {
			w.proven = w.best != (reach{}) && r.beyond(w.best)
		} else {
			w.proven = r.beyond(w.ref())
		}
	}
	if w.proven {
		// A fresh start: the clock runs from this end, and the next
		// session past setup stops it.
		w.setup, w.failed, w.best = now, 0, r
		return
	}
	if w.setup.IsZero() {
		w.setup = now
	}
	w.failed++
	if r.beyond(w.best) {
		w.best = r
	}
}

// stateWriteFailed counts a state write that failed, and keeps it for the
// reason of the stall it causes.
func (r *Relay) stateWriteFailed(err error) {
	r.metrics.StateWriteFailures.Inc()
	r.stall.stateFailed(config.RedactError(err, r.cfg.PGDSN), time.Now())
}

// holding reports whether this instance holds the lease (a leader, or a
// leader still setting up or reconnecting).
func (r *Relay) holding() bool {
	if r.cfg.Source == "poll" {
		return r.pollRunning.Load()
	}
	l := r.lead.Load()
	return l != nil && l.term.Valid()
}

func (r *Relay) lookStall(now time.Time) stallState {
	var confirmed tracker.LSN
	if sw := r.stall.writer.Load(); sw != nil {
		confirmed = sw.Durable()
	}
	return r.stall.look(r.cur.Load(), r.holding(), r.streaming.Load(), confirmed, now)
}

func (r *Relay) stalledAt(now time.Time) (bool, string) {
	words := walStallWords
	if r.cfg.Source == "poll" {
		words = pollStallWords
	}
	st, why := stalledSaid(r.lookStall(now), r.cfg.StallTimeout, r.LastError, words)
	if h := r.stall.held.Load(); h != nil {
		// PostgreSQL holds the replication connection (watchWalsender):
		// the cause, named first. A stall of its own past the timeout:
		// a standby holding the stream back leaves nothing in flight.
		if now.Sub(h.Since) > r.cfg.StallTimeout {
			reason := fmt.Sprintf("%s (OUTBOX_STALL_TIMEOUT %s)", h.Reason(now), r.cfg.StallTimeout)
			if st {
				reason += "; and " + why
			}
			return true, reason
		}
		if st {
			why += "; meanwhile " + h.Reason(now)
		}
	}
	if !st && r.cfg.Source == "poll" {
		if stuck, reason := r.oldest.stuck(now, r.cfg.StallTimeout); stuck {
			if e := r.LastError(); e != "" {
				reason += "; last error here: " + e
			}
			return true, reason
		}
	}
	return st, why
}

// stallWords name, in a stall's reason, what the instance holds and what
// its setup is: the same clocks run for both kinds of relay.
type stallWords struct{ holds, setup string }

var (
	walStallWords  = stallWords{"this instance holds the leader lease (so no standby takes over)", "PostgreSQL and the slot, fencing the previous leader at Kafka"}
	pollStallWords = stallWords{"this poll-mode instance runs (its buckets wait for it)", "PostgreSQL, the table's buckets, Kafka"}
)

// stalled is stalledSaid in the WAL relay's words.
func stalled(s stallState, timeout time.Duration, lastErr func() string) (bool, string) {
	return stalledSaid(s, timeout, lastErr, walStallWords)
}

// stalled decides a look: events delivered and not confirmed for longer
// than timeout, owed work waiting longer, or the lease held with no
// session past setup for longer, and why (lastErr is asked only then).
// Unconfirmed events come first: sessions that end at a failed state write
// may also leave work owed or end unproven, and the state write is the
// cause.
func stalledSaid(s stallState, timeout time.Duration, lastErr func() string, w stallWords) (bool, string) {
	if s.unconfirmed > timeout {
		return true, unconfirmedReason(s, timeout, lastErr)
	}
	if s.owed && s.waiting > timeout {
		return true, owedReason(s, timeout, lastErr)
	}
	if s.setup > timeout {
		why := fmt.Sprintf("%s but no session got past setup (%s) for %s (OUTBOX_STALL_TIMEOUT %s)", w.holds, w.setup, s.setup.Round(time.Second), timeout)
		if s.failed > 0 {
			why = fmt.Sprintf("%s but its sessions keep ending with no progress: for %s, %d sessions got past setup and ended with nothing acknowledged or dead-lettered and the acked position unmoved (OUTBOX_STALL_TIMEOUT %s)", w.holds, s.setup.Round(time.Second), s.failed, timeout)
		}
		if e := lastErr(); e != "" {
			why += "; last error: " + e
		} else {
			why += "; no error yet"
		}
		return true, why
	}
	return false, ""
}

func unconfirmedReason(s stallState, timeout time.Duration, lastErr func() string) string {
	why := fmt.Sprintf("events delivered to Kafka up to %s are not confirmed to PostgreSQL: the position the state row public.outbox_connector_state records, past which nothing is confirmed, has stood at %s for %s (OUTBOX_STALL_TIMEOUT %s), so the slot holds the WAL and every new session delivers them again",
		wal.FormatLSN(s.delivered), wal.FormatLSN(s.confirmed), s.unconfirmed.Round(time.Second), timeout)
	if s.stateErr != "" {
		return why + fmt.Sprintf("; the last state write failed %s ago: %s", s.stateErrAge.Round(time.Second), s.stateErr)
	}
	why += "; no state write has failed (one may be waiting)"
	if e := lastErr(); e != "" {
		why += "; last error: " + e
	}
	return why
}

func owedReason(s stallState, timeout time.Duration, lastErr func() string) string {
	var why string
	if s.inFlight > 0 {
		why = fmt.Sprintf("%d events in flight and none acknowledged or dead-lettered for %s (OUTBOX_STALL_TIMEOUT %s)", s.inFlight, s.waiting.Round(time.Second), timeout)
	} else {
		why = fmt.Sprintf("events read before the stream restarted are not delivered, and none was acknowledged or dead-lettered for %s (OUTBOX_STALL_TIMEOUT %s)", s.waiting.Round(time.Second), timeout)
	}
	// The last error may say why (a topic that does not exist, which the
	// producer reports while it waits for it; a reconnect's cause).
	if e := lastErr(); e != "" {
		why += "; last error: " + e
	}
	return why
}

// kafkaDialErrors keeps a failed connection to a Kafka broker as the last
// error. A session waiting for an unreachable broker (InitProducerID waits
// as long as its context) returns no error of its own, and the stall it
// causes must say why.
type kafkaDialErrors struct{ r *Relay }

func (h kafkaDialErrors) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		msg := fmt.Sprintf("connect to Kafka broker %s: %v", net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), err)
		h.r.lastErr.Store(&msg)
	}
}

// stallMetrics registers the stall as metrics, computed at scrape time like
// /healthz.
func (r *Relay) stallMetrics(m *metrics.Metrics) {
	m.GaugeFunc("outbox_connector_stalled", "1 while events are owed (in flight, or read by a stream that ended before delivering them) and none was acknowledged or dead-lettered for longer than OUTBOX_STALL_TIMEOUT, or events delivered to Kafka have waited longer for the position the state row records to move past them (state writes failing), or while this instance has held the lease for longer with no session past setup or with its sessions ending with no progress; /healthz fails then. 0 otherwise.", func() float64 {
		if stalled, _ := r.stalledAt(time.Now()); stalled {
			return 1
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_progress_age_seconds", "How long events have been owed (in flight, or read and not delivered) with none acknowledged or dead-lettered; 0 when nothing is owed.", func() float64 {
		return r.lookStall(time.Now()).waiting.Seconds()
	})
	m.GaugeFunc("outbox_connector_unconfirmed_age_seconds", "How long events delivered to Kafka have waited for the position the state row records, past which nothing is confirmed to PostgreSQL, to move past them (a healthy writer moves it every OUTBOX_STATUS_INTERVAL); 0 when none waits.", func() float64 {
		return r.lookStall(time.Now()).unconfirmed.Seconds()
	})
}

// watchWalsender watches, for one session, what PostgreSQL holds the
// session's replication connection (its walsender, pid) for, asking on db
// (the pool; see wal.WalsenderWatch): creating the slot, the transactions
// running when it began; streaming a failover slot, the standbys of
// synchronized_standby_slots. It is said in the log, in
// outbox_connector_walsender_held_seconds and _held_by, and in the stall's
// reason, which a hold longer than the stall timeout makes a stall of its
// own (stalledAt). The returned func stops the watch and waits for its
// goroutine to end.
func (r *Relay) watchWalsender(ctx context.Context, db wal.Querier, pid uint32) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	w := &wal.WalsenderWatch{DB: db, PID: pid, Slot: r.cfg.Slot, Log: r.log.With("component", "walsender-watch"), Held: r.walsenderHeld}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// maxHeldBy bounds the outbox_connector_walsender_held_by series of one
// hold.
const maxHeldBy = 10

// walsenderHeld takes a look's hold (see watchWalsender).
func (r *Relay) walsenderHeld(h wal.Hold) {
	by := map[[2]string]bool{}
	for _, k := range []wal.HoldKind{wal.HoldTransactions, wal.HoldStandby} {
		held := 0.0
		if k == h.Kind {
			held = time.Since(h.Since).Seconds()
		}
		r.metrics.WalsenderHeld.WithLabelValues(string(k)).Set(held)
	}
	for _, x := range h.Blockers {
		name := "pid:" + strconv.Itoa(int(x.PID))
		if x.GID != "" {
			name = "prepared:" + x.GID
		}
		by[[2]string{string(h.Kind), name}] = true
	}
	for _, s := range h.Standbys {
		by[[2]string{string(h.Kind), "slot:" + s.Name}] = true
	}
	for k := range r.stall.heldBy {
		if !by[k] {
			r.metrics.WalsenderHeldBy.DeleteLabelValues(k[0], k[1])
		}
	}
	n := 0
	for k := range by {
		if n++; n > maxHeldBy {
			delete(by, k)
			continue
		}
		r.metrics.WalsenderHeldBy.WithLabelValues(k[0], k[1]).Set(1)
	}
	r.stall.heldBy = by
	if h.Kind == "" {
		r.stall.held.Store(nil)
		return
	}
	r.stall.held.Store(&h)
}
