// Package history keeps a sampled history of a server's WAL position, so
// that slotwatch can tell when a given LSN was written (lag in seconds: how
// old is the oldest WAL a slot has not confirmed) and how fast WAL is being
// written (the rate behind the time to invalidation).
package history

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Sample is the WAL position at a moment.
type Sample struct {
	Time time.Time
	LSN  uint64
}

// WAL is the history of one server's WAL position. It is safe for
// concurrent use.
type WAL struct {
	mu      sync.Mutex
	samples []Sample // ascending in Time and LSN
	horizon time.Duration
	max     int
}

// DefaultMaxSamples bounds a history's memory; past it, older samples are
// thinned out (every other one dropped), so a long horizon costs precision
// in the past, not memory.
const DefaultMaxSamples = 4096

// New returns an empty history that keeps samples for horizon and at most
// max of them (DefaultMaxSamples when max <= 0).
func New(horizon time.Duration, max int) *WAL {
	if max <= 0 {
		max = DefaultMaxSamples
	}
	if max < 4 {
		max = 4
	}
	return &WAL{horizon: horizon, max: max}
}

// Add records the WAL position at t. A position behind the last one means
// the server is not the one sampled before (restored, failed over, or
// replaced): the history starts again.
func (h *WAL) Add(t time.Time, lsn uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.samples); n > 0 {
		last := h.samples[n-1]
		if lsn < last.LSN {
			h.samples = h.samples[:0]
		} else if !t.After(last.Time) {
			return
		}
	}
	h.samples = append(h.samples, Sample{Time: t, LSN: lsn})
	// Drop what is older than the horizon, keeping one sample at or before
	// it so that positions written just inside the horizon still interpolate.
	cut := t.Add(-h.horizon)
	i := sort.Search(len(h.samples), func(i int) bool { return h.samples[i].Time.After(cut) })
	if i > 1 {
		h.samples = append(h.samples[:0], h.samples[i-1:]...)
	}
	if len(h.samples) > h.max {
		h.thin()
	}
}

// thin drops every other sample of the older half.
func (h *WAL) thin() {
	half := len(h.samples) / 2
	kept := h.samples[:0]
	for i, s := range h.samples {
		if i < half && i%2 == 1 {
			continue
		}
		kept = append(kept, s)
	}
	h.samples = kept
}

// Len is the number of samples held.
func (h *WAL) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.samples)
}

// Lag is how long ago, at now, the WAL right after lsn was written: the age
// of the oldest WAL not yet confirmed by a slot at lsn. It is 0 when lsn is
// at or past the newest sample. When lsn is older than the whole history,
// lowerBound is true and the answer is the history's age (the WAL is at
// least that old). ok is false without any sample.
func (h *WAL) Lag(now time.Time, lsn uint64) (seconds float64, lowerBound, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.samples)
	if n == 0 {
		return 0, false, false
	}
	if lsn >= h.samples[n-1].LSN {
		return 0, false, true
	}
	// The first sample that had already passed lsn.
	i := sort.Search(n, func(i int) bool { return h.samples[i].LSN > lsn })
	if i == 0 {
		return math.Max(0, now.Sub(h.samples[0].Time).Seconds()), true, true
	}
	a, b := h.samples[i-1], h.samples[i]
	// Between a and b the server wrote b.LSN-a.LSN bytes; assume an even pace.
	frac := float64(lsn-a.LSN) / float64(b.LSN-a.LSN)
	written := a.Time.Add(time.Duration(frac * float64(b.Time.Sub(a.Time))))
	return math.Max(0, now.Sub(written).Seconds()), false, true
}

// Rate is the WAL write rate in bytes per second over the last window (or
// over the whole history when it is shorter). ok is false until two samples
// some time apart exist.
func (h *WAL) Rate(window time.Duration) (bytesPerSecond float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.samples)
	if n < 2 {
		return 0, false
	}
	last := h.samples[n-1]
	from := last.Time.Add(-window)
	// The newest sample at or before the window's start, else the oldest.
	i := sort.Search(n, func(i int) bool { return h.samples[i].Time.After(from) })
	if i > 0 {
		i--
	}
	first := h.samples[i]
	dt := last.Time.Sub(first.Time).Seconds()
	if dt <= 0 {
		return 0, false
	}
	return float64(last.LSN-first.LSN) / dt, true
}

// Samples returns a copy of the history, oldest first.
func (h *WAL) Samples() []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Sample(nil), h.samples...)
}
