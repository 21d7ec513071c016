package tracker

import (
	"strings"
	"testing"
)

// TestQueueCompaction holds one early transaction open behind thousands that
// complete: the acked ones ahead of it must not pile up in the queue (rule
// 4), and compacting it must keep every open transaction, in order.
func TestQueueCompaction(t *testing.T) {
	const n, held = 5000, 3000
	tr := New(0)
	txns := make([]*Txn, n)
	for i := range txns {
		end := LSN(10 * (i + 1))
		txns[i] = tr.Begin(end)
		txns[i].Add()
		if i == held {
			txns[i].Add() // one record of it stays in flight
		}
		txns[i].Commit(end)
	}
	compacted := false
	for i, tx := range txns {
		tx.Done()
		tr.mu.Lock()
		head, qlen := tr.head, len(tr.queue)
		tr.mu.Unlock()
		if head > 1024 && head*2 > qlen {
			t.Fatalf("after %d acks the queue keeps %d acked transactions ahead of %d open ones", i+1, head, qlen-head)
		}
		if head < min(i+1, held) { // fewer dead entries than acked transactions
			compacted = true
		}
		want := LSN(10 * (i + 1))
		if i >= held {
			want = LSN(10 * held) // the held transaction stops acked
		}
		if got := tr.Acked(); got != want {
			t.Fatalf("after %d acks acked = %d; want %d", i+1, got, want)
		}
		p := tr.Positions()
		if i >= held {
			if p.OpenTxns != n-held {
				t.Fatalf("after %d acks %d transactions open; want %d", i+1, p.OpenTxns, n-held)
			}
			if !tr.OldestOpen().Equal(txns[held].since) {
				t.Fatalf("after %d acks the oldest open transaction is not the held one", i+1)
			}
		}
	}
	if !compacted {
		t.Fatal("the queue was never compacted; the test no longer exercises it")
	}
	if p := tr.Positions(); p.OpenTxns != n-held || p.InFlight != 1 {
		t.Fatalf("positions = %+v; want %d open and 1 in flight", p, n-held)
	}
	txns[held].Done()
	if p := tr.Positions(); p.Acked != LSN(10*n) || p.OpenTxns != 0 || p.InFlight != 0 || p.LastEvent != LSN(10*n) {
		t.Fatalf("positions = %+v after the held record; want everything acked to %d", p, 10*n)
	}
}

// TestDoneMoreThanAdd: an ack of a record the tracker no longer counts (acked
// twice, or withdrawn with Abandon and then acked) is a bug in the caller
// that would let a transaction be confirmed with a record of it still in
// flight; the tracker refuses it loudly.
func TestDoneMoreThanAdd(t *testing.T) {
	tests := []struct {
		name string
		run  func(a *Txn)
	}{
		{"acked twice", func(a *Txn) { a.Add(); a.Add(); a.Done(); a.Done(); a.Done() }},
		{"withdrawn then acked", func(a *Txn) { a.Add(); a.Add(); a.Abandon(); a.Done(); a.Done() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(0)
			a := tr.Begin(20)
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, "Done called more often than Add") {
					t.Fatalf("recovered %v; want the tracker's panic", r)
				}
			}()
			tt.run(a)
			t.Fatal("no panic")
		})
	}
}

// TestAbandonHoldsUntilReset: a record withdrawn before it reached Kafka
// holds its transaction, and every later one, unacked for good (neither the
// other records' acks, nor the commit, nor a keepalive move past it); Reset
// then leaves nothing open and received back at acked, so the next stream
// reads the transaction again.
func TestAbandonHoldsUntilReset(t *testing.T) {
	tr := New(100)
	a := tr.Begin(200)
	a.Add()
	a.Commit(200)
	a.Done()
	b := tr.Begin(300)
	b.Add()
	b.Add()
	b.Abandon()
	if p := tr.Positions(); p.InFlight != 1 || p.Acked != 200 {
		t.Fatalf("after the abandon positions = %+v; want 1 in flight, acked 200", p)
	}
	b.Done()
	b.Commit(310)
	c := tr.Begin(400)
	c.Add()
	c.Commit(400)
	c.Done()
	tr.ServerWALEnd(500)
	p := tr.Positions()
	if p.Acked != 200 {
		t.Fatalf("acked = %d past a transaction with an abandoned record; want 200", p.Acked)
	}
	if p.InFlight != 0 || p.OpenTxns != 2 || tr.Idle() || p.Received != 500 {
		t.Fatalf("positions = %+v, idle %v; want nothing in flight, 2 open, received 500", p, tr.Idle())
	}
	tr.Reset()
	p = tr.Positions()
	if p.Acked != 200 || p.Received != 200 || p.OpenTxns != 0 || p.InFlight != 0 || !tr.Idle() || !tr.OldestOpen().IsZero() {
		t.Fatalf("after Reset positions = %+v, idle %v; want acked = received = 200, nothing open", p, tr.Idle())
	}
	tr.ServerWALEnd(250)
	if got := tr.Acked(); got != 250 {
		t.Fatalf("acked = %d after a keepalive with nothing open; want 250", got)
	}
}
