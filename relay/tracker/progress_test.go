package tracker

import "testing"

// TestProgressCounts: the progress count (the connector's stall clock)
// grows by one for each record acked and for each move of the acked
// position, by commit or keepalive, and for nothing else: not for records
// handed over, transactions begun or committed with records pending,
// withdrawals, or keepalives that cannot move acked.
func TestProgressCounts(t *testing.T) {
	tr := New(100)
	want := func(step string, n uint64) {
		t.Helper()
		if got := tr.Positions().Progress; got != n {
			t.Fatalf("%s: progress %d, want %d", step, got, n)
		}
	}
	want("new", 0)
	tx := tr.Begin(200)
	tx.Add()
	tx.Add()
	tx.Add()
	want("three records handed over", 0)
	tx.Commit(200)
	want("committed, records pending", 0)
	tr.ServerWALEnd(300)
	want("keepalive while records are in flight", 0)
	tx.Done()
	want("one record acked, acked unmoved", 1)
	tx.Done()
	want("two records acked", 2)
	tx.Done()
	want("last record acked: the record, and acked moved", 4)
	if a := tr.Acked(); a != 200 {
		t.Fatalf("acked %d, want 200", a)
	}
	empty := tr.Begin(250)
	empty.Commit(250)
	want("a transaction without records committed: acked moved", 5)
	tr.ServerWALEnd(300)
	want("keepalive moved acked", 6)
	tr.ServerWALEnd(300)
	want("keepalive at acked", 6)
	tr.Begin(300).Commit(300)
	want("a transaction ending at acked: acked did not move", 6)
	tx = tr.Begin(400)
	tx.Add()
	tx.Abandon()
	want("a record withdrawn", 6)
	tx.Commit(400)
	want("an abandoned transaction committed: acked cannot move", 6)
}

// TestResetDropped: Reset reports what it forgot that carried events (the
// end of the last such transaction, at least as far as any earlier Reset
// said; not the received position, which a transaction forgotten before
// its commit, or the snapshot's, leaves where the next session starts),
// and nothing when what it forgot carried none or nothing was open.
func TestResetDropped(t *testing.T) {
	t.Run("nothing open", func(t *testing.T) {
		tr := New(100)
		tx := tr.Begin(200)
		tx.Add()
		tx.Commit(200)
		tx.Done()
		tr.Reset()
		if d := tr.Positions().Dropped; d != 0 {
			t.Fatalf("dropped %d, want 0", d)
		}
	})
	t.Run("open without events", func(t *testing.T) {
		tr := New(100)
		tr.Begin(200)
		tr.Begin(300).Commit(300)
		tr.Reset()
		if d := tr.Positions().Dropped; d != 0 {
			t.Fatalf("dropped %d, want 0", d)
		}
	})
	t.Run("events behind an eventless transaction", func(t *testing.T) {
		tr := New(100)
		tr.Begin(200).Commit(200) // acked at once
		open := tr.Begin(300)     // open, no events: blocks the queue
		tx := tr.Begin(400)
		tx.Add()
		tx.Commit(400)
		tr.ServerWALEnd(500) // received 500; acked stays 200
		_ = open
		tr.Reset()
		p := tr.Positions()
		if p.Dropped != 400 || p.Received != 200 || p.InFlight != 0 || !p.Ended {
			t.Fatalf("after Reset: %+v, want dropped 400 (the transaction's end, not the keepalive's), received 200, nothing in flight, ended", p)
		}
		// A second Reset with less received does not lower it.
		tx = tr.Begin(300)
		tx.Add()
		tr.Reset()
		if d := tr.Positions().Dropped; d != 400 {
			t.Fatalf("dropped %d after a second Reset, want 400", d)
		}
	})
	t.Run("partly acked", func(t *testing.T) {
		tr := New(100)
		tx := tr.Begin(200)
		tx.Add()
		tx.Add()
		tx.Commit(200)
		tx.Done()
		tr.Reset()
		if p := tr.Positions(); p.Dropped != 200 || p.DroppedAcked != 1 {
			t.Fatalf("after Reset: %+v, want dropped 200, one record of it acked", p)
		}
	})
	t.Run("before its commit", func(t *testing.T) {
		// Forgotten before its commit was read: received never moved,
		// the transaction's final LSN (Begin's) is what is owed.
		tr := New(100)
		tx := tr.Begin(300)
		tx.Add()
		tx.Abandon()
		tr.Reset()
		if p := tr.Positions(); p.Dropped != 300 || p.Received != 100 {
			t.Fatalf("after Reset: %+v, want dropped 300, received 100", p)
		}
	})
	t.Run("snapshot", func(t *testing.T) {
		// The snapshot's transaction begins and commits at the start.
		tr := New(100)
		tx := tr.Begin(100)
		tx.Add()
		tx.Add()
		tx.Done()
		if p := tr.Positions(); p.AckedOpen != 1 {
			t.Fatalf("one record acked: %+v, want acked open 1", p)
		}
		tx.Abandon()
		tr.Reset()
		if p := tr.Positions(); p.Dropped != 100 || p.DroppedAcked != 1 || p.AckedOpen != 0 {
			t.Fatalf("after Reset: %+v, want dropped 100, one of it acked, nothing open", p)
		}
	})
}
