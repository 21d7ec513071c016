// Package checkpoint owns the position the connector may confirm: the state
// row in public.outbox_connector_state (what the connector promised about
// its slot: the position, the cluster, the snapshot), the promise written
// before a position is confirmed (Writer), the exact write of a graceful
// stop, the fence that makes each of them conditional on the leader lease,
// and the check of a slot against its row at start. wal.Stream asks it what
// may be confirmed (Confirmable) and nothing else.
package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	schema "github.com/pgoutbox/pgoutbox/sql"
)

// State is the connector's promise about its slot, kept in
// outbox_connector_state: the position it confirmed (written durably before
// the confirmation is sent, never moving backwards), the cluster it belongs
// to, and whether the initial snapshot completed.
type State struct {
	Slot         string
	SystemID     string
	Confirmed    uint64
	SnapshotDone bool
	// OffsetsEpoch names the history the exactly-once positions in Kafka
	// belong to (0: none issued yet); OffsetsLSN is the commit LSN of the
	// newest position the connector saw Kafka commit in it (0: none).
	OffsetsEpoch int64
	OffsetsLSN   uint64
}

// Creating reports a state row that records only the intent to create the
// slot and take its initial snapshot: written before CREATE_REPLICATION_SLOT,
// replaced by the slot's position once the slot exists. A slot found with
// such a row is the connector's own, and still owes its snapshot.
func (st State) Creating() bool { return st.Confirmed == 0 && !st.SnapshotDone }

// stateDDL is sql/004_connector_state.sql's state table, for deployments
// that did not apply sql/ and whose role may create it.
var stateDDL = schema.Statements("public.outbox_connector_state")

const queryState = `
SELECT system_identifier, confirmed_lsn::text, snapshot_done, coalesce(offsets_epoch, 0), coalesce(offsets_lsn, '0/0')::text
FROM public.outbox_connector_state WHERE slot_name = $1`

// upsertSet is the update of a state row by a write that never moves
// backwards: the confirmed position and the Kafka position only grow
// (GREATEST ignores a NULL), and an epoch given replaces the row's (a new
// history: its Kafka position starts again).
const upsertSet = `
ON CONFLICT (slot_name) DO UPDATE SET
    system_identifier = EXCLUDED.system_identifier,
    confirmed_lsn = GREATEST(outbox_connector_state.confirmed_lsn, EXCLUDED.confirmed_lsn),
    snapshot_done = outbox_connector_state.snapshot_done OR EXCLUDED.snapshot_done,
    offsets_epoch = coalesce(EXCLUDED.offsets_epoch, outbox_connector_state.offsets_epoch),
    offsets_lsn = CASE
        WHEN EXCLUDED.offsets_epoch IS NULL THEN outbox_connector_state.offsets_lsn
        WHEN EXCLUDED.offsets_epoch IS DISTINCT FROM outbox_connector_state.offsets_epoch THEN EXCLUDED.offsets_lsn
        ELSE GREATEST(outbox_connector_state.offsets_lsn, EXCLUDED.offsets_lsn) END,
    updated_at = now()`

// resetSet overwrites a state row.
const resetSet = `
ON CONFLICT (slot_name) DO UPDATE SET
    system_identifier = EXCLUDED.system_identifier,
    confirmed_lsn = EXCLUDED.confirmed_lsn,
    snapshot_done = EXCLUDED.snapshot_done,
    offsets_epoch = EXCLUDED.offsets_epoch,
    offsets_lsn = EXCLUDED.offsets_lsn,
    updated_at = now()`

// The confirmed position only moves forward (GREATEST), so a late or
// repeated write can never make the check at start pass falsely.
const upsertState = `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn, updated_at)
VALUES ($1, $2, $3::pg_lsn, $4, $5::bigint, $6::pg_lsn, now())` + upsertSet

// resetState is the one write that may move backwards: the operator accepted
// a slot reset (OUTBOX_ACCEPT_SLOT_RESET) or the slot was recreated.
const resetState = `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn, updated_at)
VALUES ($1, $2, $3::pg_lsn, $4, $5::bigint, $6::pg_lsn, now())` + resetSet

// Fence makes a state write conditional on the leader lease of the state's
// slot (public.outbox_lease): the write happens only while the lease's token
// is Token. The check locks the lease row (FOR SHARE) within the write's own
// statement, so a takeover, which updates the row, comes entirely before or
// entirely after the write; and since it is one statement, no client round
// trip (a frozen process) ever holds that lock. The zero Fence writes
// unconditionally.
type Fence struct {
	Token int64
}

// errFenced is a fenced write that found another token in the lease: another
// instance took over, and the write did not happen.
var errFenced = fmt.Errorf("%w; the state was not written", lease.ErrFenced)

// fenceCTE selects one row while the lease of slot $1 has token $7 (the
// fenced statement's last parameter).
const fenceCTE = `
WITH fence AS (SELECT 1 FROM public.outbox_lease WHERE slot_name = $1 AND token = $7::bigint FOR SHARE)`

const upsertStateFenced = fenceCTE + `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn, updated_at)
SELECT $1::text, $2::text, $3::pg_lsn, $4::boolean, $5::bigint, $6::pg_lsn, now() FROM fence` + upsertSet

const resetStateFenced = fenceCTE + `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn, updated_at)
SELECT $1::text, $2::text, $3::pg_lsn, $4::boolean, $5::bigint, $6::pg_lsn, now() FROM fence` + resetSet

// setStateExact also records the newest exactly-once position Kafka
// committed ($3, within the row's history: offsets_lsn only grows).
const setStateExact = `UPDATE public.outbox_connector_state SET confirmed_lsn = $2::pg_lsn,
    offsets_lsn = CASE WHEN $3::pg_lsn IS NULL THEN offsets_lsn ELSE GREATEST(offsets_lsn, $3::pg_lsn) END, updated_at = now() WHERE slot_name = $1`

const setStateExactFenced = `
UPDATE public.outbox_connector_state SET confirmed_lsn = $2::pg_lsn,
    offsets_lsn = CASE WHEN $3::pg_lsn IS NULL THEN offsets_lsn ELSE GREATEST(offsets_lsn, $3::pg_lsn) END, updated_at = now()
WHERE slot_name = $1 AND EXISTS (SELECT 1 FROM public.outbox_lease WHERE slot_name = $1 AND token = $4::bigint FOR SHARE)`

// Execer runs a statement (a *pgx.Conn, a pgx.Tx).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// write runs a state write, fenced when f is set (the token is the fenced
// statement's last parameter): a fenced write that changed no row found
// another token in the lease.
func write(ctx context.Context, conn Execer, f Fence, plain, fenced string, args ...any) error {
	if f.Token == 0 {
		_, err := conn.Exec(ctx, plain, args...)
		return err
	}
	tag, err := conn.Exec(ctx, fenced, append(args, f.Token)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errFenced
	}
	return nil
}

// SetStateExact records exactly st.Confirmed, which may be below the recorded
// promise: at a graceful stop the promise shrinks to what was confirmed.
func SetStateExact(ctx context.Context, conn Execer, st State, f Fence) error {
	var olsn *string
	if st.OffsetsLSN != 0 {
		l := wal.FormatLSN(st.OffsetsLSN)
		olsn = &l
	}
	if err := write(ctx, conn, f, setStateExact, setStateExactFenced, st.Slot, wal.FormatLSN(st.Confirmed), olsn); err != nil {
		return fmt.Errorf("record final position %s for slot %q: %w", wal.FormatLSN(st.Confirmed), st.Slot, err)
	}
	return nil
}

// EnsureStateTable creates the state table when sql/ was not applied and the
// role may; otherwise it says what to run.
func EnsureStateTable(ctx context.Context, conn *pgx.Conn) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public.outbox_connector_state') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("look up outbox_connector_state: %w", err)
	}
	if exists {
		// A table made by an older connector lacks the exactly-once
		// columns: add them (sql/004's ALTER TABLE statements).
		var n int
		if err := conn.QueryRow(ctx, queryStateColumns).Scan(&n); err != nil {
			return fmt.Errorf("look up the columns of outbox_connector_state: %w", err)
		}
		if n == 2 {
			return nil
		}
		for _, q := range stateDDL[1:] {
			if _, err := conn.Exec(ctx, q); err != nil {
				return &fatal.Error{Msg: "the state table public.outbox_connector_state lacks the columns offsets_epoch and offsets_lsn, and this role cannot add them; apply sql/004_connector_state.sql again (its ALTER TABLE statements) as the table's owner", Err: err}
			}
		}
		return nil
	}
	for _, q := range stateDDL {
		if _, err := conn.Exec(ctx, q); err != nil {
			return &fatal.Error{Msg: "the state table public.outbox_connector_state is missing and this role cannot create it; apply sql/004_connector_state.sql", Err: err}
		}
	}
	return nil
}

const queryStateColumns = `
SELECT count(*) FROM pg_attribute
WHERE attrelid = 'public.outbox_connector_state'::regclass AND attname IN ('offsets_epoch', 'offsets_lsn') AND NOT attisdropped`

// LoadState reads the slot's state row; ok is false when there is none.
func LoadState(ctx context.Context, conn *pgx.Conn, slot string) (State, bool, error) {
	st := State{Slot: slot}
	var lsn string
	var olsn string
	err := conn.QueryRow(ctx, queryState, slot).Scan(&st.SystemID, &lsn, &st.SnapshotDone, &st.OffsetsEpoch, &olsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read connector state for slot %q: %w", slot, err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return st, false, fmt.Errorf("parse state LSN %q: %w", lsn, err)
	}
	st.Confirmed = uint64(l)
	if l, err = pglogrepl.ParseLSN(olsn); err != nil {
		return st, false, fmt.Errorf("parse state offsets LSN %q: %w", olsn, err)
	}
	st.OffsetsLSN = uint64(l)
	return st, true, nil
}

// SaveState writes st, never moving the confirmed position backwards.
func SaveState(ctx context.Context, conn Execer, st State, f Fence) error {
	if err := write(ctx, conn, f, upsertState, upsertStateFenced, st.args()...); err != nil {
		return fmt.Errorf("save connector state for slot %q at %s: %w", st.Slot, wal.FormatLSN(st.Confirmed), err)
	}
	return nil
}

// ResetState overwrites the state row (accepted slot reset, new slot).
func ResetState(ctx context.Context, conn Execer, st State, f Fence) error {
	if err := write(ctx, conn, f, resetState, resetStateFenced, st.args()...); err != nil {
		return fmt.Errorf("reset connector state for slot %q: %w", st.Slot, err)
	}
	return nil
}

// args are the parameters of the upserts: the epoch and the Kafka position
// NULL when not set.
func (st State) args() []any {
	var epoch, olsn any
	if st.OffsetsEpoch != 0 {
		epoch = st.OffsetsEpoch
	}
	if st.OffsetsLSN != 0 {
		olsn = wal.FormatLSN(st.OffsetsLSN)
	}
	return []any{st.Slot, st.SystemID, wal.FormatLSN(st.Confirmed), st.SnapshotDone, epoch, olsn}
}

// CheckSlotAgainstState fails closed when the slot moved behind the
// connector's back: a different cluster, or a confirmed position beyond
// anything the connector promised (advanced, or dropped and recreated).
func CheckSlotAgainstState(s wal.SlotInfo, st State, systemID string) error {
	if st.SystemID != systemID {
		return fatal.Errorf("slot %q: the state row was written on PostgreSQL system %s but this server is system %s (restored from a backup, or a new cluster?): events may have been skipped. "+
			"Check the outbox for events that never reached Kafka, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to continue from the slot's position",
			s.Name, st.SystemID, systemID)
	}
	if s.ConfirmedFlush > st.Confirmed {
		return fatal.Errorf("slot %q was moved behind the connector's back: its confirmed position is %s but the connector only ever confirmed %s "+
			"(advanced with pg_replication_slot_advance, consumed by another client, or dropped and recreated). Events between the two positions may never have been published. "+
			"Check the outbox table for events in that range, re-publish what is missing, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to continue from %s",
			s.Name, wal.FormatLSN(s.ConfirmedFlush), wal.FormatLSN(st.Confirmed), wal.FormatLSN(s.ConfirmedFlush))
	}
	return nil
}
