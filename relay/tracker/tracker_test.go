package tracker

import (
	"math/rand"
	"testing"
)

func TestAckedFollowsCommitOrder(t *testing.T) {
	tr := New(100)
	a := tr.Begin(200)
	a.Add()
	a.Add()
	b := tr.Begin(300)
	b.Add()
	a.Commit(200)
	b.Commit(300)
	b.Done() // later transaction acked first: nothing moves
	if got := tr.Acked(); got != 100 {
		t.Fatalf("acked = %d after only the later txn finished; want 100", got)
	}
	a.Done()
	if got := tr.Acked(); got != 100 {
		t.Fatalf("acked = %d with one record of the first txn pending; want 100", got)
	}
	a.Done()
	if got := tr.Acked(); got != 300 {
		t.Fatalf("acked = %d; want 300", got)
	}
	if p := tr.Positions(); p.InFlight != 0 || p.OpenTxns != 0 || p.LastEvent != 300 {
		t.Fatalf("positions = %+v", p)
	}
}

func TestNotAckedBeforeCommitReceived(t *testing.T) {
	tr := New(0)
	a := tr.Begin(50)
	a.Add()
	a.Done()
	if got := tr.Acked(); got != 0 {
		t.Fatalf("acked = %d before commit; want 0", got)
	}
	a.Commit(50)
	if got := tr.Acked(); got != 50 {
		t.Fatalf("acked = %d; want 50", got)
	}
}

// TestKeepaliveDoesNotConfirmInFlight is go-pq-cdc #107: a keepalive's WAL
// end must not be acked while a received event is still in flight.
func TestKeepaliveDoesNotConfirmInFlight(t *testing.T) {
	tr := New(10)
	a := tr.Begin(20)
	a.Add()
	a.Commit(20)
	tr.ServerWALEnd(1000)
	if got := tr.Acked(); got != 10 {
		t.Fatalf("acked = %d with an event in flight; want 10", got)
	}
	if p := tr.Positions(); p.Received != 1000 {
		t.Fatalf("received = %d; want 1000", p.Received)
	}
	a.Done()
	if got := tr.Acked(); got != 20 {
		t.Fatalf("acked = %d; want 20 (the keepalive came before the ack)", got)
	}
	tr.ServerWALEnd(1000)
	if got := tr.Acked(); got != 1000 {
		t.Fatalf("acked = %d when idle; want the WAL end 1000", got)
	}
	if p := tr.Positions(); p.LastEvent != 20 {
		t.Fatalf("last event = %d; want 20", p.LastEvent)
	}
}

func TestEmptyTransactionAcksAtCommit(t *testing.T) {
	tr := New(0)
	a := tr.Begin(70)
	a.Commit(70)
	if got := tr.Acked(); got != 70 {
		t.Fatalf("acked = %d; want 70", got)
	}
	if p := tr.Positions(); p.LastEvent != 0 {
		t.Fatalf("an empty transaction counted as events: %+v", p)
	}
}

// TestRandomAckOrder acks records in random order and checks that acked never
// passes an unacked transaction.
func TestRandomAckOrder(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	tr := New(0)
	type rec struct {
		tx  *Txn
		end LSN
	}
	var recs []rec
	var txns []*Txn
	for i := 1; i <= 2000; i++ {
		tx := tr.Begin(LSN(i * 10))
		n := rng.Intn(4)
		for j := 0; j < n; j++ {
			tx.Add()
			recs = append(recs, rec{tx, LSN(i * 10)})
		}
		tx.Commit(LSN(i * 10))
		txns = append(txns, tx)
	}
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	done := map[*Txn]int{}
	for _, r := range recs {
		r.tx.Done()
		done[r.tx]++
		acked := tr.Acked()
		for _, tx := range txns {
			if tx.end > acked {
				break
			}
			if tx.pending != 0 {
				t.Fatalf("acked %d passes txn %d with %d pending", acked, tx.end, tx.pending)
			}
		}
	}
	if got := tr.Acked(); got != 20000 {
		t.Fatalf("acked = %d; want 20000", got)
	}
}

func BenchmarkTrackerRecord(b *testing.B) {
	tr := New(0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tx := tr.Begin(LSN(i + 1))
		tx.Add()
		tx.Commit(LSN(i + 1))
		tx.Done()
	}
}
