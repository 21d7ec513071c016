package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unit tests of the decisions in state.go and slot.go that need no server:
// when a slot is refused, when the state row says the slot moved behind the
// connector's back (rule 2), which errors stop the connector, and that a
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
			err := CheckSlotAgainstState(SlotInfo{Name: "s", ConfirmedFlush: tt.confirmed}, State{Slot: "s", SystemID: sys, Confirmed: tt.promised}, tt.system)
			wantFatal(t, err, tt.fatal)
		})
	}
}

func TestCheckSlot(t *testing.T) {
	ok := SlotInfo{Name: "s", SlotType: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "reserved"}
	tests := []struct {
		name  string
		edit  func(*SlotInfo)
		fatal []string
	}{
		{"usable", func(*SlotInfo) {}, nil},
		{"unreserved WAL is still usable", func(s *SlotInfo) { s.WALStatus = "unreserved" }, nil},
		{"physical", func(s *SlotInfo) { s.SlotType = "physical" }, []string{"physical slot"}},
		{"other plugin", func(s *SlotInfo) { s.Plugin = "wal2json" }, []string{`plugin "wal2json"`, "pg_drop_replication_slot"}},
		{"other database", func(s *SlotInfo) { s.Database = "billing" }, []string{`database "billing"`, `"app"`}},
		{"invalidated", func(s *SlotInfo) { s.WALStatus = "lost" }, []string{"wal_status = lost", "events were skipped"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.edit(&s)
			wantFatal(t, CheckSlot(s, "app"), tt.fatal)
		})
	}
}

// wantFatal fails unless err is nil (want nil) or a FatalError naming every
// part of want.
func wantFatal(t *testing.T, err error, want []string) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if !IsFatal(err) {
		t.Fatalf("error %v; want a FatalError", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
}

func TestIsFatal(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("connect: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("read: connection reset by peer"), false},
		{"wrapped FatalError", fmt.Errorf("prepare slot: %w", Fatalf("slot %q is invalidated", "s")), true},
		{"invalid password 28P01", pg("28P01"), true},
		{"no pg_hba entry 28000", pg("28000"), true},
		{"insufficient privilege 42501", pg("42501"), true},
		{"no such database 3D000", pg("3D000"), true},
		{"admin shutdown 57P01", pg("57P01"), false},
		{"connection failure 08006", pg("08006"), false},
		{"slot in use 55006", pg("55006"), false},
		{"serialization 40001", pg("40001"), false},
	}
	for _, tt := range tests {
		if got := IsFatal(tt.err); got != tt.want {
			t.Errorf("%s: IsFatal(%v) = %v; want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestFatalErrorText(t *testing.T) {
	cause := errors.New("permission denied to create table")
	e := &FatalError{Msg: "the state table is missing", Err: cause}
	if got := e.Error(); got != "the state table is missing: permission denied to create table" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(e, cause) {
		t.Error("FatalError does not unwrap to its cause")
	}
	if got := Fatalf("slot %q", "s").Error(); got != `slot "s"` {
		t.Errorf("Fatalf(...).Error() = %q", got)
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

// TestStateWritesFenced: with a fence every state write is the statement
// that checks the lease's token (passed last), and one that changed no row,
// because the token moved on, is ErrFenced, never success: the old leader
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
			if !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "outbox_slot") {
				t.Fatalf("fenced write that changed nothing: %v; want ErrFenced naming the slot", err)
			}

			cause := errors.New("connection reset")
			failed := &stateExecer{err: cause}
			if err := w.write(failed, Fence{Token: 42}); !errors.Is(err, cause) || errors.Is(err, ErrFenced) {
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
