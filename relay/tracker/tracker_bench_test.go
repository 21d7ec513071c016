package tracker

import (
	"sync"
	"testing"
)

// Benchmarks of the tracker's hot path as the connector drives it: the
// stream goroutine calls Begin, Add and Commit; franz-go's promise goroutine
// calls Done; the status loop reads Acked.
//
//	go test -run '^$' -bench . -benchmem ./relay/tracker

// benchTxns runs transactions of size records, Done on another goroutine.
func benchTxns(b *testing.B, size int) {
	tr := New(0)
	done := make(chan *Txn, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for tx := range done {
			tx.Done()
		}
	}()
	b.ReportAllocs()
	var lsn LSN
	n := 0
	var tx *Txn
	for b.Loop() {
		if n%size == 0 {
			lsn++
			tx = tr.Begin(lsn)
		}
		tx.Add()
		done <- tx
		n++
		if n%size == 0 {
			tx.Commit(lsn)
		}
	}
	close(done)
	wg.Wait()
}

func BenchmarkTrackerTx1(b *testing.B)   { benchTxns(b, 1) }
func BenchmarkTrackerTx100(b *testing.B) { benchTxns(b, 100) }

// BenchmarkTrackerAckedUnderLoad is the status loop's and the metrics'
// reading of Acked while records complete.
func BenchmarkTrackerAckedUnderLoad(b *testing.B) {
	tr := New(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var lsn LSN
		for {
			select {
			case <-stop:
				return
			default:
			}
			lsn++
			tx := tr.Begin(lsn)
			tx.Add()
			tx.Commit(lsn)
			tx.Done()
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		_ = tr.Acked()
	}
	close(stop)
	wg.Wait()
}
