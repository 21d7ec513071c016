package checkpoint

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
)

// TestStateWritesFencedByLease: a state write fenced with a token the lease
// no longer holds (another instance took over) is refused, whichever write it
// is, with lease.ErrFenced (so lease.ErrLost: the term is over), and changes
// nothing; fenced with the current token it happens.
func TestStateWritesFencedByLease(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox_lease (slot_name, holder, token, expires_at) VALUES ('s1', 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	old, cur := Fence{Token: 1}, Fence{Token: 2}
	st := State{Slot: "s1", SystemID: "x", Confirmed: 100}
	if err := SaveState(ctx, conn, st, old); err != nil {
		t.Fatalf("write fenced with the lease's token: %v", err)
	}
	// b takes over.
	if _, err := conn.Exec(ctx, `UPDATE public.outbox_lease SET holder = 'b', token = 2 WHERE slot_name = 's1'`); err != nil {
		t.Fatal(err)
	}
	refused := State{Slot: "s1", SystemID: "x", Confirmed: 500}
	for name, write := range map[string]func(context.Context, Execer, State, Fence) error{
		"save": SaveState, "reset": ResetState, "set exact": SetStateExact,
	} {
		err := write(ctx, conn, refused, old)
		if !errors.Is(err, lease.ErrFenced) || !errors.Is(err, lease.ErrLost) {
			t.Errorf("%s fenced with the old token: %v; want lease.ErrFenced (and ErrLost)", name, err)
		}
	}
	if got, _, err := LoadState(ctx, conn, "s1"); err != nil || got.Confirmed != 100 {
		t.Errorf("state after refused writes: %+v, %v; want confirmed 100", got, err)
	}
	if err := SaveState(ctx, conn, refused, cur); err != nil {
		t.Errorf("write fenced with the current token: %v", err)
	}
	if got, _, err := LoadState(ctx, conn, "s1"); err != nil || got.Confirmed != 500 {
		t.Errorf("state after the current leader's write: %+v, %v; want confirmed 500", got, err)
	}
}

// TestWriterRecordsKafkaPosition: the newest exactly-once position Kafka
// committed reaches the state row even while the confirmed position does
// not move (one PostgreSQL transaction spanning Kafka transactions), and
// with the final write of a graceful stop; so an offsets topic that loses
// it is seen at the next start, not taken for a history that never
// committed one. Found by the review of issue 16: both writes left
// offsets_lsn behind.
func TestWriterRecordsKafkaPosition(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox_lease (slot_name, holder, token, expires_at) VALUES ('s1', 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	st := State{Slot: "s1", SystemID: "x", Confirmed: 0x1000, OffsetsEpoch: 7}
	if err := SaveState(ctx, conn, st, Fence{Token: 1}); err != nil {
		t.Fatal(err)
	}
	tr := tracker.New(0x1000)
	w := NewWriter(conn, st, tr, &lease.Term{Token: 1}, nil, func(uint64) {})
	// Kafka committed a position inside a transaction the tracker has not
	// acked: the confirmed position stays.
	w.KafkaCommitted(0x5000)
	if err := w.Write(ctx, tr.Acked(), false); err != nil {
		t.Fatal(err)
	}
	got, _, err := LoadState(ctx, conn, "s1")
	if err != nil || got.OffsetsLSN != 0x5000 || got.OffsetsEpoch != 7 {
		t.Fatalf("after Kafka committed 0/5000 with nothing acked: %+v, %v; want offsets_lsn 0/5000, epoch 7", got, err)
	}
	// The final write of a graceful stop records the newest too.
	w.KafkaCommitted(0x6000)
	if err := w.Write(ctx, 0x1000, true); err != nil {
		t.Fatal(err)
	}
	if got, _, err = LoadState(ctx, conn, "s1"); err != nil || got.OffsetsLSN != 0x6000 || got.Confirmed != 0x1000 {
		t.Fatalf("after the final write: %+v, %v; want offsets_lsn 0/6000, confirmed 0/1000", got, err)
	}
}

// TestWriterRecordsRecoveryPoint: a state write takes a recovery point, and
// a later write records it once the WAL position it was taken at is acked,
// never before (an event committed after an unacked point may not be
// delivered, and its transaction id may be below the point's); no point is
// recorded while a snapshot is owed, and SnapshotDone records the
// snapshot's.
func TestWriterRecordsRecoveryPoint(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox_lease (slot_name, holder, token, expires_at) VALUES ('s1', 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	st := State{Slot: "s1", SystemID: "x", Confirmed: 0x1000}
	if err := ResetState(ctx, conn, st, Fence{Token: 1}); err != nil {
		t.Fatal(err)
	}
	tr := tracker.New(0x1000)
	w := NewWriter(conn, st, tr, &lease.Term{Token: 1}, nil, func(uint64) {})
	point := func() Point {
		t.Helper()
		got, _, err := LoadState(ctx, conn, "s1")
		if err != nil {
			t.Fatal(err)
		}
		return got.Recover
	}
	write := func(acked uint64) {
		t.Helper()
		tr.ServerWALEnd(acked)
		if err := w.Write(ctx, tr.Acked(), false); err != nil {
			t.Fatal(err)
		}
	}
	write(0x100000)
	write(0x200000)
	if p := point(); !p.IsZero() {
		t.Fatalf("a point recorded while the snapshot is owed: %+v", p)
	}
	if err := w.SnapshotDone(ctx, Point{Xmin: 5, LSN: 0x200000, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if p := point(); p.Xmin != 5 || p.LSN != 0x200000 {
		t.Fatalf("after SnapshotDone: %+v; want the snapshot's point", p)
	}
	// Points are taken at the server's WAL position, far beyond these.
	write(0x300000)
	write(0x400000)
	if p := point(); p.Xmin != 5 {
		t.Fatalf("a point recorded before its position was acked: %+v", p)
	}
	var now string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&now); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(now)
	if err != nil {
		t.Fatal(err)
	}
	write(uint64(lsn))
	p := point()
	if p.Xmin <= 5 || p.LSN <= 0x400000 || p.LSN > uint64(lsn) {
		t.Fatalf("after acking %s: %+v; want a point taken by an earlier write, at most there", now, p)
	}
	// The final write of a graceful stop records the newest it may.
	tr.ServerWALEnd(uint64(lsn) + 1<<20)
	if err := w.Write(ctx, tr.Acked(), true); err != nil {
		t.Fatal(err)
	}
	if q := point(); q.LSN <= p.LSN || q.Xmin < p.Xmin {
		t.Fatalf("after the final write: %+v; want a newer point than %+v", q, p)
	}
}
