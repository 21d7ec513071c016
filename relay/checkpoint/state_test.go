package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// Unit tests of the state row's decisions that need no server: when the
// row says the slot moved behind the connector's back (rule 2), and that a
// fenced state write which found another leader's token reports it (rule 8).
// The integration tests run the same paths against PostgreSQL.

func TestStateCreating(t *testing.T) {
	tests := []struct {
		st   State
		want bool
	}{
		{State{}, true},
		{State{Confirmed: 0x16B3748}, false},
		{State{SnapshotDone: true}, false},
		{State{Confirmed: 1, SnapshotDone: true}, false},
	}
	for _, tt := range tests {
		if got := tt.st.Creating(); got != tt.want {
			t.Errorf("%+v.Creating() = %v; want %v", tt.st, got, tt.want)
		}
	}
}

func TestCheckSlotAgainstState(t *testing.T) {
	const sys = "7412345678901234567"
	tests := []struct {
		name      string
		confirmed uint64 // the slot's
		promised  uint64 // the state row's
		system    string
		fatal     []string // what the error must name; nil: accepted
	}{
		{"at the promise", 0x2000, 0x2000, sys, nil},
		{"behind the promise (not yet told)", 0x1FFF, 0x2000, sys, nil},
		{"one byte past the promise", 0x2001, 0x2000, sys, []string{"moved behind the connector's back", "0/2001", "0/2000", "OUTBOX_ACCEPT_SLOT_RESET"}},
		{"another cluster", 0x2000, 0x2000, "7000000000000000001", []string{"system " + sys, "7000000000000000001", "OUTBOX_ACCEPT_SLOT_RESET"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSlotAgainstState(wal.SlotInfo{Name: "s", ConfirmedFlush: tt.confirmed}, State{Slot: "s", SystemID: sys, Confirmed: tt.promised}, tt.system)
			wantFatal(t, err, tt.fatal)
		})
	}
}

// stateExecer records the statement it was given and answers with rows affected
// or an error.
type stateExecer struct {
	sql  string
	args []any
	rows int64
	err  error
}

func (e *stateExecer) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	e.sql, e.args = sql, args
	if e.err != nil {
		return pgconn.CommandTag{}, e.err
	}
	return pgconn.NewCommandTag(fmt.Sprintf("INSERT 0 %d", e.rows)), nil
}

// QueryRow answers a state write's RETURNING: the point, no row, or the
// error.
func (e *stateExecer) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	e.sql, e.args = sql, args
	return stateRow{e}
}

type stateRow struct{ e *stateExecer }

func (r stateRow) Scan(dest ...any) error {
	switch {
	case r.e.err != nil:
		return r.e.err
	case r.e.rows == 0 && strings.Contains(r.e.sql, "token ="):
		return pgx.ErrNoRows
	}
	*dest[0].(*int64), *dest[1].(*string), *dest[2].(*time.Time) = 1234, "0/16B3800", time.Unix(1e9, 0)
	return nil
}

// TestStateWritesFenced: with a fence every state write is the statement
// that checks the lease's token (passed last), and one that changed no row,
// because the token moved on, is lease.ErrFenced, never success: the old leader
// must not believe it recorded a promise. Without a fence the write is the
// plain statement.
func TestStateWritesFenced(t *testing.T) {
	st := State{Slot: "outbox_slot", SystemID: "7412345678901234567", Confirmed: 0x16B3748, SnapshotDone: true}
	writes := []struct {
		name          string
		write         func(Execer, Fence) error
		plain, fenced string
	}{
		{"save", func(c Execer, f Fence) error { return SaveState(context.Background(), c, st, f) }, upsertState, upsertStateFenced},
		{"reset", func(c Execer, f Fence) error { return ResetState(context.Background(), c, st, f) }, resetState, resetStateFenced},
		{"set exact", func(c Execer, f Fence) error { return SetStateExact(context.Background(), c, st, f) }, setStateExact, setStateExactFenced},
	}
	for _, w := range writes {
		t.Run(w.name, func(t *testing.T) {
			plain := &stateExecer{}
			if err := w.write(plain, Fence{}); err != nil || plain.sql != w.plain {
				t.Fatalf("unfenced: %v, statement %q", err, plain.sql)
			}
			if !containsArg(plain.args, "0/16B3748") || containsArg(plain.args, int64(0)) {
				t.Fatalf("unfenced arguments %v", plain.args)
			}

			fenced := &stateExecer{rows: 1}
			if err := w.write(fenced, Fence{Token: 42}); err != nil || fenced.sql != w.fenced {
				t.Fatalf("fenced: %v, statement %q", err, fenced.sql)
			}
			if len(fenced.args) == 0 || fenced.args[len(fenced.args)-1] != int64(42) {
				t.Fatalf("fenced arguments %v; want the token last", fenced.args)
			}

			taken := &stateExecer{rows: 0}
			err := w.write(taken, Fence{Token: 42})
			if !errors.Is(err, lease.ErrFenced) || !strings.Contains(err.Error(), "outbox_slot") {
				t.Fatalf("fenced write that changed nothing: %v; want lease.ErrFenced naming the slot", err)
			}

			cause := errors.New("connection reset")
			failed := &stateExecer{err: cause}
			if err := w.write(failed, Fence{Token: 42}); !errors.Is(err, cause) || errors.Is(err, lease.ErrFenced) {
				t.Fatalf("failed write: %v; want the cause", err)
			}
		})
	}
}

func containsArg(args []any, v any) bool {
	for _, a := range args {
		if a == v {
			return true
		}
	}
	return false
}

// wantFatal fails unless err is nil (want nil) or a fatal.Error naming
// every part of want.
func wantFatal(t *testing.T, err error, want []string) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if !fatal.Is(err) {
		t.Fatalf("error %v; want a fatal.Error", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

// TestConfirmable: what may be confirmed is acked and promised, the lower of
// the two.
func TestConfirmable(t *testing.T) {
	tr := tracker.New(0x2000)
	w := NewWriter(nil, State{Confirmed: 0x1000}, tr, nil, nil, func(uint64) {})
	if got := w.Confirmable(); got != 0x1000 {
		t.Errorf("promise 0x1000, acked 0x2000: Confirmable %#x; want the promise", got)
	}
	w.durable.Store(0x3000)
	if got := w.Confirmable(); got != 0x2000 {
		t.Errorf("promise 0x3000, acked 0x2000: Confirmable %#x; want the acked position", got)
	}
}
