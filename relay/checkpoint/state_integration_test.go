package checkpoint

import (
	"context"
	"errors"
	"testing"

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
