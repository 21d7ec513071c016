package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/relay/tracker"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// The relation ids of the tests beside the outbox's (benchRelID).
const (
	partRelID  = 16390 // a partition of the outbox
	otherRelID = 16400 // another table
)

// relationMsg is a Relation message with the outbox's columns for any
// relation: a partition has its parent's columns.
func relationMsg(id uint32, namespace, name string) []byte {
	b := benchRelation()
	cols := b[1+4+len("public\x00outbox\x00"):]
	return wire(byte(msgRelation), id, cstr(namespace), cstr(name), cols)
}

// insertMsg is the outbox's insert for relation id.
func insertMsg(id uint32) []byte {
	b := benchInsert()
	binary.BigEndian.PutUint32(b[1:], id)
	return b
}

type guardStream struct {
	*Stream
	out     chan Event
	ignored map[string]int
	asked   map[uint32]int
}

// newGuardStream is a Stream fed by handleMessage, with no connection
// (status updates pushed past the test) and IsOutboxPartition answered from
// partitions (or failing with lookupErr), counting how often each relation
// is asked about. Its tracker starts at start.
func newGuardStream(t *testing.T, start uint64, partitions map[uint32]bool, lookupErr error) *guardStream {
	t.Helper()
	g := &guardStream{out: make(chan Event, 16), ignored: map[string]int{}, asked: map[uint32]int{}}
	g.Stream = &Stream{
		Slot: "outbox_slot", Publication: "outbox_pub", Schema: "public", Table: "outbox",
		Tracker: tracker.New(start), Out: g.out, StatusInterval: time.Hour,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Position: ConfirmFunc(func() uint64 { return 0 }),
		Counters: Counters{Ignored: func(kind string) { g.ignored[kind]++ }},
		IsOutboxPartition: func(_ context.Context, relID uint32) (bool, error) {
			g.asked[relID]++
			return partitions[relID], lookupErr
		},
	}
	g.rels = make(map[uint32]*relation)
	g.nextStatus = time.Now().Add(time.Hour)
	return g
}

// feed hands msgs to handleMessage in order at increasing LSNs, stopping at
// the first error.
func (g *guardStream) feed(msgs ...[]byte) error {
	for i, m := range msgs {
		if err := g.handleMessage(context.Background(), uint64(1000+i), m); err != nil {
			return err
		}
	}
	return nil
}

// TestStreamRefusesOutboxPartitionInsert: an insert that names a partition
// of the outbox stops the stream with a fatal.Error before the row is handed
// on, and its transaction is never acked (not at commit, which the stream
// never reads, nor by a keepalive), so nothing of it is confirmed. A
// partition's Relation message alone, which pgoutput also sends with
// publish_via_partition_root while naming the outbox in the insert, is no
// error; another table's inserts are counted and skipped, with one lookup
// per Relation message.
func TestStreamRefusesOutboxPartitionInsert(t *testing.T) {
	const start, final = 500, 5000
	partitions := map[uint32]bool{partRelID: true}
	begin, commit := benchBegin(final), benchCommit(final, final+40)

	t.Run("insert names a partition", func(t *testing.T) {
		g := newGuardStream(t, start, partitions, nil)
		err := g.feed(begin, benchRelation(), insertMsg(benchRelID), relationMsg(partRelID, "public", "outbox_p20261201"), insertMsg(partRelID))
		var fe *fatal.Error
		if !errors.As(err, &fe) {
			t.Fatalf("insert into a partition of the outbox: %v; want a fatal.Error", err)
		}
		for _, want := range []string{"public.outbox_p20261201", "partition of the outbox table public.outbox", "ALTER PUBLICATION outbox_pub SET (publish_via_partition_root = true)", FormatLSN(final)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		// The outbox's own row before it went to the producer; Kafka acks
		// it. The partition's row did not.
		if n := len(g.out); n != 1 {
			t.Fatalf("%d events handed on; want 1 (the outbox's own row)", n)
		}
		(<-g.out).Txn.Done()
		// The server's WAL end moves on past the transaction: a keepalive
		// must not ack it either.
		g.Tracker.ServerWALEnd(final + 1000)
		p := g.Tracker.Positions()
		if p.Acked != start || p.OpenTxns != 1 {
			t.Fatalf("after the refusal acked = %d with %d open transactions; want %d (nothing of the refused transaction) and 1 open", p.Acked, p.OpenTxns, start)
		}
		if g.ignored["other-table"] != 0 {
			t.Errorf("the partition's insert was counted as another table's")
		}
	})

	t.Run("via root: partition's relation, insert names the outbox", func(t *testing.T) {
		g := newGuardStream(t, start, partitions, nil)
		// What PostgreSQL 15 sends with publish_via_partition_root: the
		// root's Relation, the partition's, then an insert naming the root.
		if err := g.feed(begin, benchRelation(), relationMsg(partRelID, "public", "outbox_p20261201"), insertMsg(benchRelID), commit); err != nil {
			t.Fatalf("publish_via_partition_root stream: %v", err)
		}
		if n := len(g.out); n != 1 {
			t.Fatalf("%d events handed on; want 1", n)
		}
		(<-g.out).Txn.Done()
		if got := g.Tracker.Acked(); got != final+40 {
			t.Fatalf("acked %d after the commit; want %d", got, final+40)
		}
		if len(g.asked) != 0 {
			t.Errorf("asked about %v; the outbox's inserts need no lookup", g.asked)
		}
	})

	t.Run("another table", func(t *testing.T) {
		g := newGuardStream(t, start, partitions, nil)
		rel := relationMsg(otherRelID, "public", "orders")
		if err := g.feed(begin, rel, insertMsg(otherRelID), insertMsg(otherRelID), rel, insertMsg(otherRelID), commit); err != nil {
			t.Fatalf("another table's inserts: %v", err)
		}
		if g.ignored["other-table"] != 3 || len(g.out) != 0 {
			t.Errorf("other-table counted %d, %d events handed on; want 3 and 0", g.ignored["other-table"], len(g.out))
		}
		if g.asked[otherRelID] != 2 {
			t.Errorf("asked %d times; want once per Relation message (2)", g.asked[otherRelID])
		}
		if got := g.Tracker.Acked(); got != final+40 {
			t.Errorf("acked %d; want the commit's end %d", got, final+40)
		}
	})

	t.Run("lookup fails", func(t *testing.T) {
		g := newGuardStream(t, start, partitions, errors.New("connection refused"))
		err := g.feed(begin, relationMsg(otherRelID, "public", "orders"), insertMsg(otherRelID))
		if err == nil || fatal.Is(err) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("failed lookup: %v; want a retryable error that wraps the cause", err)
		}
		g.Tracker.ServerWALEnd(final + 1000)
		if got := g.Tracker.Acked(); got != start {
			t.Fatalf("acked %d after a failed lookup; want %d", got, start)
		}
		if g.ignored["other-table"] != 0 {
			t.Errorf("an insert not known to be another table's was counted as one")
		}
	})
}
