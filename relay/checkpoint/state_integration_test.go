package checkpoint

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/lease"
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
