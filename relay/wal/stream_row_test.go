package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// TestStreamRowIsTheInsert: the row the stream hands to the producer for an
// outbox insert is that insert, whatever its shape (no columns, a few, more
// than fit in the row's own allocation): each column's name, type and type
// modifier from the Relation, its value or null (an unchanged TOAST value
// too), where it came from (the insert's WAL position, the transaction's
// commit LSN and time, the outbox table's name); and a copy, not a view of
// the frame, which the connection reuses for the next read. The
// transaction then acks at its commit end once the row is acked, and the
// newest WAL end the frames reported is kept for the status updates.
func TestStreamRowIsTheInsert(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		out := make(chan Event, 1)
		s := &Stream{
			Slot: "outbox_slot", Publication: "outbox_pub", Schema: "public", Table: "outbox",
			Tracker: tracker.New(100), Out: out, StatusInterval: time.Hour,
			Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			Position: ConfirmFunc(func() uint64 { return 0 }),
		}
		s.rels = make(map[uint32]*relation)
		s.nextStatus = time.Now().Add(time.Hour)

		n := rapid.IntRange(0, 20).Draw(t, "columns")
		rel := wire(byte(msgRelation), uint32(16390), cstr("public"), cstr("outbox"), byte('d'), uint16(n))
		type col struct {
			name     string
			typ      uint32
			mod      int32
			kind     byte
			value    []byte
			wantNull bool
		}
		cols := make([]col, n)
		tuple := wire(uint16(n))
		for i := range cols {
			c := &cols[i]
			c.name = fmt.Sprintf("c%d_%s", i, noNUL.Draw(t, "name"))
			c.typ, c.mod = rapid.Uint32().Draw(t, "type"), rapid.Int32().Draw(t, "typmod")
			rel = wire(rel, byte(0), cstr(c.name), c.typ, uint32(c.mod))
			c.kind = rapid.SampledFrom([]byte("tbnu")).Draw(t, "kind")
			switch c.kind {
			case 'n', 'u':
				c.wantNull = true
				tuple = append(tuple, c.kind)
			default:
				c.value = rapid.SliceOfN(rapid.Byte(), 0, 30).Draw(t, "value")
				tuple = wire(tuple, c.kind, uint32(len(c.value)), c.value)
			}
		}
		final := 5000 + rapid.Uint64Range(0, 1000).Draw(t, "final")
		us := rapid.Int64Range(0, 1<<50).Draw(t, "commit time")
		insertAt := final - 10
		frames := [][]byte{
			xlog(final-30, rel),
			xlog(final-20, wire(byte(msgBegin), final, uint64(us), uint32(777))),
			xlog(insertAt, wire(byte(msgInsert), uint32(16390), byte('N'), tuple)),
		}
		ctx := context.Background()
		var walEnd uint64
		for _, f := range frames {
			walEnd = max(walEnd, binary.BigEndian.Uint64(f[9:]))
			if err := s.handleCopyData(ctx, f); err != nil {
				t.Fatalf("frame %x: %v", f, err)
			}
		}
		// The status updates' write position is the newest WAL end the
		// frames reported.
		if s.walEnd != walEnd {
			t.Fatalf("WAL end seen = %d; the frames said up to %d", s.walEnd, walEnd)
		}
		var ev Event
		select {
		case ev = <-out:
		default:
			t.Fatal("the insert was not handed on")
		}
		// The connection reads the next message into the same buffer.
		for _, f := range frames {
			for i := range f {
				f[i] = 0xEE
			}
		}
		row := ev.Row
		src := row.Source
		if src.LSN != insertAt || src.CommitLSN != final || !src.CommitTime.Equal(pgTime(us)) || src.Table != "public.outbox" {
			t.Fatalf("source = %+v; want LSN %d, commit LSN %d, commit time %v, table public.outbox", src, insertAt, final, pgTime(us))
		}
		if len(row.Columns) != n {
			t.Fatalf("row has %d columns; the insert has %d", len(row.Columns), n)
		}
		for i, c := range cols {
			got := row.Columns[i]
			if got.Name != c.name || got.Type != c.typ || got.TypeMod != c.mod || !got.HasTypeMod {
				t.Fatalf("column %d = %q type %d mod %d (%v); want %q type %d mod %d", i, got.Name, got.Type, got.TypeMod, got.HasTypeMod, c.name, c.typ, c.mod)
			}
			if got.Null != c.wantNull || (!c.wantNull && !bytes.Equal(got.Value, c.value)) {
				t.Fatalf("column %d (%q) = null %v value %q; want null %v value %q", i, c.kind, got.Null, got.Value, c.wantNull, c.value)
			}
		}

		commitEnd := final + 8
		if err := s.handleCopyData(ctx, xlog(final, wire(byte(msgCommit), byte(0), final, commitEnd, uint64(us)))); err != nil {
			t.Fatal(err)
		}
		if a := s.Tracker.Acked(); a != 100 {
			t.Fatalf("acked %d with the row in flight; want 100", a)
		}
		ev.Txn.Done()
		if a := s.Tracker.Acked(); a != commitEnd {
			t.Fatalf("acked %d after the row was acked; want the commit end %d", a, commitEnd)
		}
	})
}
