// Package wal reads the outbox from PostgreSQL's WAL: the replication
// connection and its slot, the pgoutput decoder, the relation cache and the
// stream loop that owns the connection and sends status updates.
package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// pgoutput (protocol version 1) message types.
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M'
)

// ErrMalformed marks a pgoutput message that could not be decoded. The
// decoder never panics on bad input (go-pq-cdc #152); it returns this.
var ErrMalformed = errors.New("malformed pgoutput message")

// pgEpoch is PostgreSQL's timestamp epoch.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func pgTime(us int64) time.Time { return pgEpoch.Add(time.Duration(us) * time.Microsecond) }

// reader decodes big-endian fields from a message without allocating; the
// first failure sticks and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated reading %s", ErrMalformed, what)
	}
	r.b = nil
}

func (r *reader) u8(what string) byte {
	if len(r.b) < 1 {
		r.fail(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16(what string) uint16 {
	if len(r.b) < 2 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) u32(what string) uint32 {
	if len(r.b) < 4 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64(what string) uint64 {
	if len(r.b) < 8 {
		r.fail(what)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// str reads a NUL-terminated string; the result aliases the message.
func (r *reader) str(what string) []byte {
	for i, c := range r.b {
		if c == 0 {
			s := r.b[:i]
			r.b = r.b[i+1:]
			return s
		}
	}
	r.fail(what)
	return nil
}

func (r *reader) bytes(n int, what string) []byte {
	if n < 0 || len(r.b) < n {
		r.fail(what)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// Begin is a transaction's start.
type Begin struct {
	FinalLSN   uint64 // the commit's LSN
	CommitTime time.Time
	Xid        uint32
}

// Commit is a transaction's end.
type Commit struct {
	CommitLSN  uint64
	EndLSN     uint64 // what to confirm once the transaction is delivered
	CommitTime time.Time
}

// Relation describes a table; it precedes the first change of the table in a
// session and follows every schema change.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []RelationColumn
}

// RelationColumn is one column of a Relation.
type RelationColumn struct {
	Name string
	Type uint32
	// TypeMod is the column's atttypmod: -1 when the type has no modifier,
	// ((precision<<16)|scale)+4 for numeric(precision, scale). The router
	// needs it to give a numeric column Debezium's schema.
	TypeMod int32
}

// TupleColumn is one column value of a tuple; Data aliases the message.
type TupleColumn struct {
	Kind byte // 'n' null, 'u' unchanged TOAST, 't' text, 'b' binary
	Data []byte
}

// Message is a logical decoding message (pg_logical_emit_message).
type Message struct {
	Transactional bool
	LSN           uint64
	Prefix        []byte // aliases the message
	Content       []byte // aliases the message
}

// decodeBegin decodes 'B'.
func decodeBegin(b []byte) (Begin, error) {
	r := reader{b: b}
	var m Begin
	m.FinalLSN = r.u64("begin final LSN")
	m.CommitTime = pgTime(int64(r.u64("begin timestamp")))
	m.Xid = r.u32("begin xid")
	return m, r.err
}

// decodeCommit decodes 'C'.
func decodeCommit(b []byte) (Commit, error) {
	r := reader{b: b}
	var m Commit
	r.u8("commit flags")
	m.CommitLSN = r.u64("commit LSN")
	m.EndLSN = r.u64("commit end LSN")
	m.CommitTime = pgTime(int64(r.u64("commit timestamp")))
	return m, r.err
}

// decodeRelation decodes 'R'.
func decodeRelation(b []byte) (*Relation, error) {
	r := reader{b: b}
	rel := &Relation{}
	rel.ID = r.u32("relation id")
	rel.Namespace = string(r.str("relation namespace"))
	rel.Name = string(r.str("relation name"))
	r.u8("relation replica identity")
	n := int(r.u16("relation column count"))
	if r.err == nil && n > len(r.b) { // each column needs at least 10 bytes
		return nil, fmt.Errorf("%w: relation claims %d columns in %d bytes", ErrMalformed, n, len(r.b))
	}
	rel.Columns = make([]RelationColumn, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		r.u8("column flags")
		name := string(r.str("column name"))
		typ := r.u32("column type")
		mod := int32(r.u32("column type modifier"))
		rel.Columns = append(rel.Columns, RelationColumn{Name: name, Type: typ, TypeMod: mod})
	}
	return rel, r.err
}

// decodeTuple decodes TupleData into cols (reused), aliasing the message.
func decodeTuple(r *reader, cols []TupleColumn) []TupleColumn {
	n := int(r.u16("tuple column count"))
	if r.err != nil {
		return cols[:0]
	}
	if n > len(r.b) { // each column needs at least one byte
		r.err = fmt.Errorf("%w: tuple claims %d columns in %d bytes", ErrMalformed, n, len(r.b))
		return cols[:0]
	}
	cols = cols[:0]
	for i := 0; i < n && r.err == nil; i++ {
		kind := r.u8("tuple column kind")
		c := TupleColumn{Kind: kind}
		switch kind {
		case 'n', 'u':
		case 't', 'b':
			l := r.u32("tuple column length")
			c.Data = r.bytes(int(int32(l)), "tuple column value")
		default:
			if r.err == nil {
				r.err = fmt.Errorf("%w: unknown tuple column kind %q", ErrMalformed, kind)
			}
		}
		cols = append(cols, c)
	}
	return cols
}

// decodeInsert decodes 'I' into cols (reused).
func decodeInsert(b []byte, cols []TupleColumn) (uint32, []TupleColumn, error) {
	r := reader{b: b}
	rel := r.u32("insert relation id")
	if k := r.u8("insert tuple marker"); r.err == nil && k != 'N' {
		return 0, cols[:0], fmt.Errorf("%w: insert tuple marker %q, want 'N'", ErrMalformed, k)
	}
	cols = decodeTuple(&r, cols)
	return rel, cols, r.err
}

// decodeRelationID reads the relation id that starts 'U' and 'D'.
func decodeRelationID(b []byte) (uint32, error) {
	r := reader{b: b}
	id := r.u32("relation id")
	return id, r.err
}

// decodeMessage decodes 'M' (protocol version 1: no xid).
func decodeMessage(b []byte) (Message, error) {
	r := reader{b: b}
	var m Message
	m.Transactional = r.u8("message flags")&1 == 1
	m.LSN = r.u64("message LSN")
	m.Prefix = r.str("message prefix")
	n := r.u32("message length")
	m.Content = r.bytes(int(int32(n)), "message content")
	return m, r.err
}

// XLogData header and keepalive decoding (the CopyData framing).

// xlogData is a 'w' CopyData message: WAL data from the server.
type xlogData struct {
	WALStart uint64
	WALEnd   uint64
	Data     []byte
}

func decodeXLogData(b []byte) (xlogData, error) {
	r := reader{b: b}
	var x xlogData
	x.WALStart = r.u64("xlogdata start")
	x.WALEnd = r.u64("xlogdata end")
	r.u64("xlogdata time")
	x.Data = r.b
	if len(x.Data) == 0 && r.err == nil {
		r.err = fmt.Errorf("%w: empty xlogdata", ErrMalformed)
	}
	return x, r.err
}

// keepalive is a 'k' CopyData message.
type keepalive struct {
	WALEnd         uint64
	ReplyRequested bool
}

func decodeKeepalive(b []byte) (keepalive, error) {
	r := reader{b: b}
	var k keepalive
	k.WALEnd = r.u64("keepalive WAL end")
	r.u64("keepalive time")
	k.ReplyRequested = r.u8("keepalive reply flag") == 1
	return k, r.err
}
