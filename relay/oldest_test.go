package relay

import (
	"testing"
	"time"
)

// TestOldestWatch: poll mode's table-wide stall: the oldest unpublished
// row in a bucket no reader holds, or this instance's marks failing, for
// longer than the timeout; a row whose bucket is held (its holder waits on
// Kafka, say) is its holder's affair, and a row that changes is progress.
func TestOldestWatch(t *testing.T) {
	const timeout = 10 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	var w oldestWatch
	stuck := func(at time.Time) bool { s, _ := w.stuck(at, timeout); return s }

	w.see(5, t0, true, t0)
	if stuck(t0.Add(time.Hour)) {
		t.Error("a row whose bucket is held is a stall")
	}
	w.see(5, t0, false, t0.Add(time.Second))
	if stuck(t0.Add(timeout)) {
		t.Error("stalled before the timeout")
	}
	if !stuck(t0.Add(timeout + 2*time.Second)) {
		t.Error("a row in a bucket nobody holds past the timeout is no stall")
	}
	w.see(6, t0, false, t0.Add(timeout+3*time.Second))
	if stuck(t0.Add(timeout + 4*time.Second)) {
		t.Error("another row: the clock did not start again")
	}
	w.see(6, t0, true, t0.Add(timeout+5*time.Second))
	if stuck(t0.Add(time.Hour)) {
		t.Error("held again, still a stall")
	}
	w.markFailing(t0)
	w.markFailing(t0.Add(5 * time.Second)) // the first failure counts
	if !stuck(t0.Add(timeout + time.Second)) {
		t.Error("marks failing past the timeout is no stall")
	}
	w.markDone()
	if stuck(t0.Add(time.Hour)) {
		t.Error("marks done, still a stall")
	}
	w.see(7, t0, false, t0)
	w.clear()
	if stuck(t0.Add(time.Hour)) {
		t.Error("cleared, still a stall")
	}
	// Between sessions the age is the last row's, growing: a session that
	// fails again and again must not read 0 and keep resetting
	// OutboxPollBacklogOld's for-duration.
	if got := w.age(t0.Add(time.Minute)); got != 60 {
		t.Errorf("age after a session ended = %v; want the last row's, 60", got)
	}
	// A session's end does not forget marks that keep failing.
	w.markFailing(t0)
	w.clear()
	if !stuck(t0.Add(timeout + time.Second)) {
		t.Error("marks failing across sessions are no stall")
	}
}
