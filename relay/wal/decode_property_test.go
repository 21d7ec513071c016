package wal

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Properties of the decoder over messages rapid builds from random values
// by the documented layouts: each decodes to the values it was built from,
// and every shorter prefix of it is ErrMalformed, never a value read from
// past the end. FuzzDecode compares the decoders with a reference reading of
// arbitrary bytes; these start from the values instead, so that every run
// of the suite covers well-formed messages of every shape, not only the
// committed seeds.

// noNUL draws a String field's text: any bytes but NUL.
var noNUL = rapid.Custom(func(t *rapid.T) string {
	b := rapid.SliceOfN(rapid.ByteRange(1, 255), 0, 24).Draw(t, "text")
	return string(b)
})

// pgMicros draws a timestamp as pgoutput sends it, within a few centuries of
// PostgreSQL's epoch (a time.Duration holds ±292 years).
var pgMicros = rapid.Int64Range(-9_000_000_000_000_000/1000, 9_000_000_000_000_000/1000)

func wantTime(t *rapid.T, what string, got time.Time, us int64) {
	t.Helper()
	if want := pgEpoch.Add(time.Duration(us) * time.Microsecond); !got.Equal(want) {
		t.Fatalf("%s = %v; built from %d µs, want %v", what, got, us, want)
	}
}

// truncationsMalformed checks every prefix of msg shorter than upto.
func truncationsMalformed(t *rapid.T, msg []byte, upto int, decode func([]byte) error) {
	t.Helper()
	for i := range upto {
		if err := decode(msg[:i]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%x truncated to %d of %d bytes: error %v, want ErrMalformed", msg, i, len(msg), err)
		}
	}
}

func TestDecodeBuiltBegin(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		final, us, xid := rapid.Uint64().Draw(t, "final"), pgMicros.Draw(t, "time"), rapid.Uint32().Draw(t, "xid")
		msg := wire(final, uint64(us), xid)
		m, err := decodeBegin(msg)
		if err != nil || m.FinalLSN != final || m.Xid != xid {
			t.Fatalf("begin of %x = %+v, %v; want final %d xid %d", msg, m, err, final, xid)
		}
		wantTime(t, "begin time", m.CommitTime, us)
		truncationsMalformed(t, msg, len(msg), beginErr)
	})
}

func TestDecodeBuiltCommit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		flags, lsn, end, us := rapid.Byte().Draw(t, "flags"), rapid.Uint64().Draw(t, "lsn"), rapid.Uint64().Draw(t, "end"), pgMicros.Draw(t, "time")
		msg := wire(flags, lsn, end, uint64(us))
		m, err := decodeCommit(msg)
		if err != nil || m.CommitLSN != lsn || m.EndLSN != end {
			t.Fatalf("commit of %x = %+v, %v; want lsn %d end %d", msg, m, err, lsn, end)
		}
		wantTime(t, "commit time", m.CommitTime, us)
		truncationsMalformed(t, msg, len(msg), commitErr)
	})
}

func TestDecodeBuiltRelation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		want := &Relation{ID: rapid.Uint32().Draw(t, "id"), Namespace: noNUL.Draw(t, "namespace"), Name: noNUL.Draw(t, "name"), Columns: []RelationColumn{}}
		msg := wire(want.ID, cstr(want.Namespace), cstr(want.Name), rapid.SampledFrom([]byte("dnfi")).Draw(t, "replica identity"))
		n := rapid.IntRange(0, 12).Draw(t, "columns")
		msg = wire(msg, uint16(n))
		for range n {
			c := RelationColumn{Name: noNUL.Draw(t, "column"), Type: rapid.Uint32().Draw(t, "type"), TypeMod: rapid.Int32().Draw(t, "typmod")}
			msg = wire(msg, rapid.ByteRange(0, 1).Draw(t, "key flag"), cstr(c.Name), c.Type, uint32(c.TypeMod))
			want.Columns = append(want.Columns, c)
		}
		got, err := decodeRelation(msg)
		if err != nil {
			t.Fatalf("relation of %x: %v", msg, err)
		}
		if got.ID != want.ID || got.Namespace != want.Namespace || got.Name != want.Name || len(got.Columns) != len(want.Columns) {
			t.Fatalf("relation of %x = %+v; want %+v", msg, got, want)
		}
		for i := range want.Columns {
			if got.Columns[i] != want.Columns[i] {
				t.Fatalf("relation of %x: column %d = %+v; want %+v", msg, i, got.Columns[i], want.Columns[i])
			}
		}
		truncationsMalformed(t, msg, len(msg), relationErr)
	})
}

// drawTuple builds TupleData: its encoding and the columns it holds.
func drawTuple(t *rapid.T) ([]byte, []TupleColumn) {
	n := rapid.IntRange(0, 12).Draw(t, "columns")
	msg := wire(uint16(n))
	var cols []TupleColumn
	for range n {
		switch k := rapid.SampledFrom([]byte("nutb")).Draw(t, "kind"); k {
		case 'n', 'u':
			msg = append(msg, k)
			cols = append(cols, TupleColumn{Kind: k})
		default:
			data := rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "value")
			msg = wire(msg, k, uint32(len(data)), data)
			cols = append(cols, TupleColumn{Kind: k, Data: data})
		}
	}
	return msg, cols
}

func TestDecodeBuiltInsert(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// As the stream does, the decode reuses the columns of the insert
		// before, whatever they held.
		reuse := make([]TupleColumn, rapid.IntRange(0, 8).Draw(t, "reused"), 8)
		for i := range reuse {
			reuse[i] = TupleColumn{Kind: 'x', Data: []byte("stale")}
		}
		rel := rapid.Uint32().Draw(t, "relation")
		tuple, want := drawTuple(t)
		msg := wire(rel, byte('N'), tuple)
		gotRel, got, err := decodeInsert(msg, reuse)
		if err != nil || gotRel != rel || len(got) != len(want) {
			t.Fatalf("insert of %x = relation %d, %d columns, %v; want relation %d, %d columns", msg, gotRel, len(got), err, rel, len(want))
		}
		for i := range want {
			if got[i].Kind != want[i].Kind || !bytes.Equal(got[i].Data, want[i].Data) || !within(msg, got[i].Data) {
				t.Fatalf("insert of %x: column %d = %q %q; want %q %q, inside the message", msg, i, got[i].Kind, got[i].Data, want[i].Kind, want[i].Data)
			}
			if (want[i].Kind == 'n' || want[i].Kind == 'u') && got[i].Data != nil {
				t.Fatalf("insert of %x: %q column %d carries data %q", msg, want[i].Kind, i, got[i].Data)
			}
		}
		truncationsMalformed(t, msg, len(msg), insertErr)
		// Only a new tuple ('N') may follow the relation id of an insert.
		k := rapid.Byte().Filter(func(b byte) bool { return b != 'N' }).Draw(t, "marker")
		if _, _, err := decodeInsert(wire(rel, k, tuple), nil); !errors.Is(err, ErrMalformed) {
			t.Fatalf("insert with tuple marker %q: %v, want ErrMalformed", k, err)
		}
	})
}

func TestDecodeBuiltMessage(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		flags, lsn := rapid.Byte().Draw(t, "flags"), rapid.Uint64().Draw(t, "lsn")
		prefix := noNUL.Draw(t, "prefix")
		content := rapid.SliceOfN(rapid.Byte(), 0, 60).Draw(t, "content")
		msg := wire(flags, lsn, cstr(prefix), uint32(len(content)), content)
		m, err := decodeMessage(msg)
		if err != nil || m.Transactional != (flags&1 == 1) || m.LSN != lsn || string(m.Prefix) != prefix || !bytes.Equal(m.Content, content) {
			t.Fatalf("message of %x = %+v, %v; want flags %#x lsn %d prefix %q content %q", msg, m, err, flags, lsn, prefix, content)
		}
		truncationsMalformed(t, msg, len(msg), messageErr)
	})
}

func TestDecodeBuiltXLogData(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		start, end, sent := rapid.Uint64().Draw(t, "start"), rapid.Uint64().Draw(t, "end"), rapid.Uint64().Draw(t, "sent")
		data := rapid.SliceOfN(rapid.Byte(), 1, 60).Draw(t, "data")
		msg := wire(start, end, sent, data)
		x, err := decodeXLogData(msg)
		if err != nil || x.WALStart != start || x.WALEnd != end || !bytes.Equal(x.Data, data) {
			t.Fatalf("xlogdata of %x = %+v, %v; want start %d end %d data %x", msg, x, err, start, end, data)
		}
		// Up to and including the header alone: no message in it.
		truncationsMalformed(t, msg, 25, xlogDataErr)
	})
}

func TestDecodeBuiltKeepalive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		end, sent, reply := rapid.Uint64().Draw(t, "wal end"), rapid.Uint64().Draw(t, "sent"), rapid.Byte().Draw(t, "reply")
		msg := wire(end, sent, reply)
		k, err := decodeKeepalive(msg)
		if err != nil || k.WALEnd != end || k.ReplyRequested != (reply == 1) {
			t.Fatalf("keepalive of %x = %+v, %v; want end %d reply %v", msg, k, err, end, reply == 1)
		}
		truncationsMalformed(t, msg, len(msg), keepaliveErr)
	})
}

// TestDecodeRelationClaimAllocatesNothing: a Relation whose column count
// cannot fit in the bytes that follow is refused before anything is
// allocated for the columns it claims: one corrupt message must not cost
// megabytes (rule 4), however it came.
func TestDecodeRelationClaimAllocatesNothing(t *testing.T) {
	msg := wire(uint32(1), cstr("public"), cstr("outbox"), byte('d'), uint16(0xFFFF), byte(1), cstr("id"), uint32(2950), uint32(0xFFFFFFFF))
	const runs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if _, err := decodeRelation(msg); !errors.Is(err, ErrMalformed) {
			t.Fatalf("relation claiming 65535 columns in %d bytes: %v, want ErrMalformed", len(msg), err)
		}
	}
	runtime.ReadMemStats(&after)
	// 65535 columns would be 1.5 MiB a message; the error itself is a
	// few hundred bytes.
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 16<<10 {
		t.Fatalf("decoding the refused relation allocated %d bytes a message", per)
	}
}
