package wal

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// Benchmarks of the decoder and the stream's per-event path, on messages
// shaped like the outbox's: six columns, a ~330-byte JSON payload.
//
//	go test -run '^$' -bench . -benchmem ./relay/wal

const benchRelID = 16385

var benchPayload = []byte(`{"items": [{"qty": 2, "sku": "SKU-123", "price": "19.95"}, {"qty": 2, "sku": "SKU-456", "price": "5.50"}], "total": "123.45", "status": "CREATED", "bench_t": 1764490000000000000, "orderId": 123456, "currency": "EUR", "shipping": {"zip": "10115", "city": "Berlin", "street": "Hauptstrasse 17", "country": "DE"}, "customerId": "customer-4711"}`)

func be16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }
func be32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func be64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

func benchBegin(final uint64) []byte {
	b := []byte{msgBegin}
	b = be64(b, final)
	b = be64(b, uint64(time.Now().UnixMicro()-pgEpoch.UnixMicro()))
	return be32(b, 1234)
}

func benchCommit(lsn, end uint64) []byte {
	b := []byte{msgCommit, 0}
	b = be64(b, lsn)
	b = be64(b, end)
	return be64(b, uint64(time.Now().UnixMicro()-pgEpoch.UnixMicro()))
}

func benchRelation() []byte {
	b := []byte{msgRelation}
	b = be32(b, benchRelID)
	b = append(b, "public\x00outbox\x00"...)
	b = append(b, 'd')
	cols := []struct {
		name string
		typ  uint32
	}{{"id", 2950}, {"aggregatetype", 1043}, {"aggregateid", 1043}, {"type", 1043}, {"payload", 3802}, {"created_at", 1184}}
	b = be16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = append(b, c.name...)
		b = append(b, 0)
		b = be32(b, c.typ)
		b = be32(b, 0xffffffff)
	}
	return b
}

func benchInsert() []byte {
	b := []byte{msgInsert}
	b = be32(b, benchRelID)
	b = append(b, 'N')
	vals := [][]byte{
		[]byte("6f1c2a4e-8d3b-4c1e-9a7f-2b5d8e0c4a11"), []byte("Order"), []byte("order-417"),
		[]byte("OrderCreated"), benchPayload, []byte("2026-11-30 08:00:00.123456+00"),
	}
	b = be16(b, uint16(len(vals)))
	for _, v := range vals {
		b = append(b, 't')
		b = be32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

// xlog frames a pgoutput message as the server sends it: 'w', start, end,
// send time, then the message.
func xlog(start uint64, msg []byte) []byte {
	b := []byte{'w'}
	b = be64(b, start)
	b = be64(b, start+uint64(len(msg)))
	b = be64(b, 0)
	return append(b, msg...)
}

func BenchmarkDecodeInsert(b *testing.B) {
	msg := benchInsert()
	var cols []TupleColumn
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		_, c, err := decodeInsert(msg[1:], cols)
		if err != nil {
			b.Fatal(err)
		}
		cols = c
	}
}

func BenchmarkDecodeBeginCommit(b *testing.B) {
	begin, commit := benchBegin(100), benchCommit(100, 200)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeBegin(begin[1:]); err != nil {
			b.Fatal(err)
		}
		if _, err := decodeCommit(commit[1:]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeXLogData(b *testing.B) {
	frame := xlog(100, benchInsert())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeXLogData(frame[1:]); err != nil {
			b.Fatal(err)
		}
	}
}

// benchStream is a Stream fed from memory: no connection (status updates are
// pushed past the benchmark), its events completed by a goroutine as Kafka's
// promises would.
func benchStream(b *testing.B) (*Stream, func()) {
	b.Helper()
	out := make(chan Event, 256)
	s := &Stream{
		Slot: "bench", Publication: "outbox_pub", Schema: "public", Table: "outbox",
		Tracker: tracker.New(0), Out: out, StatusInterval: time.Hour,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Position: ConfirmFunc(func() uint64 { return 0 }),
	}
	s.rels = make(map[uint32]*relation)
	s.nextStatus = time.Now().Add(time.Hour)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range out {
			ev.Txn.Done()
		}
	}()
	if err := s.handleCopyData(context.Background(), xlog(1, benchRelation())); err != nil {
		b.Fatal(err)
	}
	return s, func() { close(out); <-done }
}

// benchStreamTx runs transactions of size events through handleCopyData:
// framing, decoding, the row copy, tracking and the hand-over to the
// producer. It reports the cost per event. The frames are built once and
// their LSNs patched in place, so the benchmark allocates nothing itself.
func benchStreamTx(b *testing.B, size int) {
	s, stop := benchStream(b)
	defer stop()
	insert := xlog(0, benchInsert())
	begin := xlog(0, benchBegin(0))
	commit := xlog(0, benchCommit(0, 0))
	// Offsets: the frame's start LSN at 1; after the 25-byte header, Begin's
	// final LSN at 1, Commit's LSN at 2 and end LSN at 10.
	const hdr = 25
	ctx := context.Background()
	lsn := uint64(1000)
	b.ReportAllocs()
	b.SetBytes(int64(len(insert) - hdr))
	events := 0
	for b.Loop() {
		if events%size == 0 {
			binary.BigEndian.PutUint64(begin[1:], lsn)
			binary.BigEndian.PutUint64(begin[hdr+1:], lsn+uint64(size+1)*1000)
			if err := s.handleCopyData(ctx, begin); err != nil {
				b.Fatal(err)
			}
		}
		binary.BigEndian.PutUint64(insert[1:], lsn)
		if err := s.handleCopyData(ctx, insert); err != nil {
			b.Fatal(err)
		}
		lsn += 1000
		events++
		if events%size == 0 {
			binary.BigEndian.PutUint64(commit[1:], lsn)
			binary.BigEndian.PutUint64(commit[hdr+2:], lsn)
			binary.BigEndian.PutUint64(commit[hdr+10:], lsn+1)
			if err := s.handleCopyData(ctx, commit); err != nil {
				b.Fatal(err)
			}
			lsn += 1000
		}
	}
}

func BenchmarkStreamInsertTx1(b *testing.B)   { benchStreamTx(b, 1) }
func BenchmarkStreamInsertTx100(b *testing.B) { benchStreamTx(b, 100) }
