package relay

import (
	"fmt"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/connector/metrics"
	"github.com/pgoutbox/pgoutbox/connector/tracker"
)

// stallWatch is the liveness clock behind /healthz and
// outbox_connector_stalled: how long work has been owed (events in flight,
// or events a stream read and could not deliver before it ended) with no
// progress (a record acknowledged or dead-lettered, the acked position
// moving).
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
// that aborts every transaction) leaves its tracker Dropped; the next
// session's tracker counts from zero, and until its acked position passes
// what was dropped the work is still owed and the clock runs on, restarted
// only by progress. Otherwise a reconnect loop, each session shorter than
// the stall timeout, would never be a stall.
type stallWatch struct {
	mu   sync.Mutex
	tr   *tracker.Tracker // the tracker last looked at
	seen uint64           // its progress count then
	// stale: tr belongs to a term this instance lost; what it dropped,
	// another leader may have delivered since.
	stale bool
	// owedTo: an earlier session's tracker dropped work up to here, and
	// the current one has not acked past it yet (0: nothing inherited).
	owedTo tracker.LSN
	owed   bool      // work was owed at the last look
	at     time.Time // since when owed work made no progress
}

// stallState is one look's result.
type stallState struct {
	inFlight int
	owed     bool          // events in flight, or read and not yet delivered
	waiting  time.Duration // owed with no progress for this long (0 when nothing is owed)
}

// look reads t (the current or last session's tracker; nil before the
// first) at now. holding is false when this instance does not hold the
// lease: then another instance owes the work, and nothing here is a stall.
func (w *stallWatch) look(t *tracker.Tracker, holding bool, now time.Time) stallState {
	// Positions is read under w.mu: two lookers (a scrape and a health
	// check) must not apply their readings out of order, or an older count
	// would look like progress.
	w.mu.Lock()
	defer w.mu.Unlock()
	if t == nil || !holding {
		w.tr, w.seen, w.stale, w.owedTo, w.owed = t, 0, true, 0, false
		return stallState{}
	}
	if t != w.tr {
		// A new session: its tracker counts from zero, and inherits what
		// the last one dropped (and what that one still owed).
		if w.tr != nil && !w.stale {
			w.owedTo = max(w.owedTo, w.tr.Positions().Dropped)
		}
		w.tr, w.seen, w.stale = t, 0, false
	}
	p := t.Positions()
	progressed := p.Progress != w.seen
	w.seen = p.Progress
	if w.owedTo != 0 && p.Acked >= w.owedTo {
		w.owedTo = 0
	}
	dropped := p.Dropped != 0 && !w.stale
	owed := p.InFlight > 0 || dropped || w.owedTo != 0
	if progressed || owed && !w.owed {
		w.at = now
	}
	w.owed = owed
	if !owed {
		return stallState{}
	}
	return stallState{inFlight: p.InFlight, owed: true, waiting: now.Sub(w.at)}
}

// holding reports whether this instance holds the lease (a leader, or a
// leader still setting up or reconnecting).
func (r *Relay) holding() bool {
	l := r.lead.Load()
	return l != nil && l.term.Valid()
}

func (r *Relay) lookStall(now time.Time) stallState {
	return r.stall.look(r.cur.Load(), r.holding(), now)
}

func (r *Relay) stalledAt(now time.Time) (bool, string) {
	return stalled(r.lookStall(now), r.cfg.StallTimeout, r.LastError)
}

// stalled decides a look: owed work waiting longer than timeout, and why
// (lastErr is asked only then).
func stalled(s stallState, timeout time.Duration, lastErr func() string) (bool, string) {
	if !s.owed || s.waiting <= timeout {
		return false, ""
	}
	if s.inFlight > 0 {
		return true, fmt.Sprintf("%d events in flight and none acknowledged or dead-lettered for %s (OUTBOX_STALL_TIMEOUT %s)", s.inFlight, s.waiting.Round(time.Second), timeout)
	}
	why := fmt.Sprintf("events read before the stream restarted are not delivered, and none was acknowledged or dead-lettered for %s (OUTBOX_STALL_TIMEOUT %s)", s.waiting.Round(time.Second), timeout)
	if e := lastErr(); e != "" {
		why += "; last error: " + e
	}
	return true, why
}

// stallMetrics registers the stall as metrics, computed at scrape time like
// /healthz.
func (r *Relay) stallMetrics(m *metrics.Metrics) {
	m.GaugeFunc("outbox_connector_stalled", "1 while events are owed (in flight, or read by a stream that ended before delivering them) and none was acknowledged or dead-lettered for longer than OUTBOX_STALL_TIMEOUT; /healthz fails then. 0 otherwise.", func() float64 {
		if stalled, _ := r.stalledAt(time.Now()); stalled {
			return 1
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_progress_age_seconds", "How long events have been owed (in flight, or read and not delivered) with none acknowledged or dead-lettered; 0 when nothing is owed.", func() float64 {
		return r.lookStall(time.Now()).waiting.Seconds()
	})
}
