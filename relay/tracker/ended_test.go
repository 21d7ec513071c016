package tracker

import "testing"

// TestDoneAfterReset: a record of a session that ended may still be acked
// by Kafka after Reset (the relay resets the tracker before the session's
// Kafka client is closed, and franz-go runs promises on a goroutine of its
// own, after Close returns). Such a Done, or Abandon, belongs to work
// Reset already forgot: it moves no count of the tracker, so the
// in-flight count (outbox_connector_events_in_flight) never goes negative,
// nothing is counted as progress or as acked work of the next session, and
// acked does not move.
func TestDoneAfterReset(t *testing.T) {
	tr := New(100)
	old := tr.Begin(200)
	old.Add()
	old.Add()
	old.Add()
	old.Commit(200)
	before := tr.Positions()
	tr.Reset()
	old.Done()
	old.Done()
	if p := tr.Positions(); p.InFlight != 0 || p.AckedOpen != 0 || p.Progress != before.Progress || p.Acked != 100 {
		t.Fatalf("after two acks of a forgotten session: %+v; want nothing in flight, nothing acked open, progress %d, acked 100", p, before.Progress)
	}
	// The next session on the same tracker: its counts are its own.
	tx := tr.Begin(300)
	tx.Add()
	old.Abandon()
	if p := tr.Positions(); p.InFlight != 1 {
		t.Fatalf("in flight %d after a forgotten record was abandoned; want the new session's 1", p.InFlight)
	}
	tx.Commit(300)
	tx.Done()
	if p := tr.Positions(); p.InFlight != 0 || p.Acked != 300 || p.AckedOpen != 0 {
		t.Fatalf("after the new session's record was acked: %+v; want nothing in flight, acked 300", p)
	}
	// Done still refuses more acks than records.
	defer func() {
		if recover() == nil {
			t.Fatal("a fourth Done of a forgotten transaction of three records did not panic")
		}
	}()
	old.Done()
	old.Done()
}
