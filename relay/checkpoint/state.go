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
	"strconv"
	"time"

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
	// Recover is the recovery point: every event written by a transaction
	// with an id below Recover.Xmin was delivered (zero: none recorded).
	Recover Point
	// Recovering says that the snapshot the row owes (SnapshotDone false)
	// is the window of a slot recovery, the rows written since Recover, not
	// the whole table.
	Recovering bool
	// MessagesSeen: the slot carried events written as logical decoding
	// messages (outbox mode message), which the table never holds, so a
	// lost slot cannot be recovered from it. Sticky.
	MessagesSeen bool
	// Timeline is the server's timeline when the row was last written (0:
	// not recorded, an older row): a promoted standby's row was written on
	// an earlier one.
	Timeline int32
	// Floor is what the snapshot the row owes (SnapshotDone false) read
	// first of the rows it owes; not kept once the snapshot is done.
	Floor Floor
}

// Floor is the evidence a snapshot owed by the state row (the initial
// snapshot, or a recovery's window) keeps of the rows it owes, from the
// first snapshot that read them: the oldest one's created_at (zero when the
// table has no such column) and transaction id (xid8). A later attempt
// (the publish failed, the process died) reads the table as it is then,
// while a retention deletes rows by age, oldest first (the outbox Cleaner,
// maintain's partition drops): a row at least as old still there shows
// that it deleted none of the rows owed. Taken with Xmin 0: the snapshot
// owed no row.
type Floor struct {
	Taken bool
	At    time.Time
	Xmin  uint64
}

// args are a floor's parameters: NULL for none taken, the time NULL
// without one.
func (f Floor) args() (xmin, at any) {
	if !f.Taken {
		return nil, nil
	}
	if !f.At.IsZero() {
		at = f.At
	}
	return int64(f.Xmin), at
}

// Point is a recovery point: Xmin is a full transaction id (xid8) such that
// every event written by a transaction with a smaller id was delivered
// (acked by Kafka or dead-lettered), so that when the slot is lost the
// events that may not have been are exactly those of the outbox rows whose
// xmin is at least Xmin. LSN and At say where the WAL and the clock were
// when it was taken.
//
// A point is taken in a statement: Xmin is the statement snapshot's xmin,
// the oldest transaction still running when it was taken, and LSN the WAL
// insert position read after it. A transaction that committed after LSN
// committed after the snapshot was taken, so it was running then or began
// later: its id is at least Xmin. Once everything up to LSN is acked, the
// transactions below Xmin, all committed before LSN, are delivered, and the
// point may be recorded. The snapshot a slot's initial (or recovery)
// snapshot reads the table in gives a point too, valid once that snapshot
// is published: every row it does not show has an id at least its xmin.
type Point struct {
	Xmin uint64
	LSN  uint64
	At   time.Time
}

// IsZero reports no point.
func (p Point) IsZero() bool { return p.Xmin == 0 }

// capturePoint is appended to each state write: the statement's snapshot
// is taken before the WAL position is read (see Point).
const capturePoint = ` RETURNING pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_wal_insert_lsn()::text, now()`

// QueryPoint takes a recovery point in its own statement (in a snapshot's
// transaction: that snapshot's xmin).
const QueryPoint = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_wal_insert_lsn()::text, now()`

// ScanPoint reads the columns of QueryPoint or capturePoint.
func ScanPoint(row pgx.Row) (Point, error) {
	var p Point
	var lsn string
	var xmin int64
	if err := row.Scan(&xmin, &lsn, &p.At); err != nil {
		return p, err
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return p, fmt.Errorf("parse WAL position %q: %w", lsn, err)
	}
	p.Xmin, p.LSN = uint64(xmin), uint64(l)
	return p, nil
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
SELECT system_identifier, confirmed_lsn::text, snapshot_done, coalesce(offsets_epoch, 0), coalesce(offsets_lsn, '0/0')::text,
       coalesce(recover_xmin, 0), coalesce(recover_lsn, '0/0')::text, coalesce(recover_at, 'epoch'), recovering, messages_seen, coalesce(timeline, 0),
       recover_floor_xmin, recover_floor_at
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
    recover_xmin = coalesce(EXCLUDED.recover_xmin, outbox_connector_state.recover_xmin),
    recover_lsn = CASE WHEN EXCLUDED.recover_xmin IS NULL THEN outbox_connector_state.recover_lsn ELSE EXCLUDED.recover_lsn END,
    recover_at = CASE WHEN EXCLUDED.recover_xmin IS NULL THEN outbox_connector_state.recover_at ELSE EXCLUDED.recover_at END,
    recovering = EXCLUDED.recovering AND NOT (outbox_connector_state.snapshot_done OR EXCLUDED.snapshot_done),
    messages_seen = outbox_connector_state.messages_seen OR EXCLUDED.messages_seen,
    timeline = coalesce(EXCLUDED.timeline, outbox_connector_state.timeline),
    recover_floor_xmin = CASE WHEN outbox_connector_state.snapshot_done OR EXCLUDED.snapshot_done THEN NULL
        ELSE coalesce(EXCLUDED.recover_floor_xmin, outbox_connector_state.recover_floor_xmin) END,
    recover_floor_at = CASE WHEN outbox_connector_state.snapshot_done OR EXCLUDED.snapshot_done THEN NULL
        WHEN EXCLUDED.recover_floor_xmin IS NULL THEN outbox_connector_state.recover_floor_at ELSE EXCLUDED.recover_floor_at END,
    updated_at = now()`

// resetSet overwrites a state row.
const resetSet = `
ON CONFLICT (slot_name) DO UPDATE SET
    system_identifier = EXCLUDED.system_identifier,
    confirmed_lsn = EXCLUDED.confirmed_lsn,
    snapshot_done = EXCLUDED.snapshot_done,
    offsets_epoch = EXCLUDED.offsets_epoch,
    offsets_lsn = EXCLUDED.offsets_lsn,
    recover_xmin = EXCLUDED.recover_xmin,
    recover_lsn = EXCLUDED.recover_lsn,
    recover_at = EXCLUDED.recover_at,
    recovering = EXCLUDED.recovering,
    messages_seen = EXCLUDED.messages_seen,
    timeline = EXCLUDED.timeline,
    recover_floor_xmin = EXCLUDED.recover_floor_xmin,
    recover_floor_at = EXCLUDED.recover_floor_at,
    updated_at = now()`

// The confirmed position only moves forward (GREATEST), so a late or
// repeated write can never make the check at start pass falsely.
const upsertState = `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn,
    recover_xmin, recover_lsn, recover_at, recovering, messages_seen, timeline, recover_floor_xmin, recover_floor_at, updated_at)
VALUES ($1, $2, $3::pg_lsn, $4, $5::bigint, $6::pg_lsn, $7::bigint, $8::pg_lsn, $9::timestamptz, $10::boolean, $11::boolean, $12::integer, $13::bigint, $14::timestamptz, now())` + upsertSet + capturePoint

// resetState is the one write that may move backwards: the operator accepted
// a slot reset (OUTBOX_ACCEPT_SLOT_RESET) or the slot was recreated.
const resetState = `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn,
    recover_xmin, recover_lsn, recover_at, recovering, messages_seen, timeline, recover_floor_xmin, recover_floor_at, updated_at)
VALUES ($1, $2, $3::pg_lsn, $4, $5::bigint, $6::pg_lsn, $7::bigint, $8::pg_lsn, $9::timestamptz, $10::boolean, $11::boolean, $12::integer, $13::bigint, $14::timestamptz, now())` + resetSet + capturePoint

// Fence makes a state write conditional on the leader lease of the state's
// slot (public.outbox_lease): the write happens only while the lease's token
// is Token (the fenced statement's last parameter, $15). The check locks the lease row (FOR SHARE) within the write's own
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

// fenceCTE selects one row while the lease of slot $1 has token $15 (the
// fenced statement's last parameter).
const fenceCTE = `
WITH fence AS (SELECT 1 FROM public.outbox_lease WHERE slot_name = $1 AND token = $15::bigint FOR SHARE)`

const upsertStateFenced = fenceCTE + `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn,
    recover_xmin, recover_lsn, recover_at, recovering, messages_seen, timeline, recover_floor_xmin, recover_floor_at, updated_at)
SELECT $1::text, $2::text, $3::pg_lsn, $4::boolean, $5::bigint, $6::pg_lsn, $7::bigint, $8::pg_lsn, $9::timestamptz, $10::boolean, $11::boolean, $12::integer,
    $13::bigint, $14::timestamptz, now() FROM fence` + upsertSet + capturePoint

const resetStateFenced = fenceCTE + `
INSERT INTO public.outbox_connector_state (slot_name, system_identifier, confirmed_lsn, snapshot_done, offsets_epoch, offsets_lsn,
    recover_xmin, recover_lsn, recover_at, recovering, messages_seen, timeline, recover_floor_xmin, recover_floor_at, updated_at)
SELECT $1::text, $2::text, $3::pg_lsn, $4::boolean, $5::bigint, $6::pg_lsn, $7::bigint, $8::pg_lsn, $9::timestamptz, $10::boolean, $11::boolean, $12::integer,
    $13::bigint, $14::timestamptz, now() FROM fence` + resetSet + capturePoint

// setStateExact also records the newest exactly-once position Kafka
// committed ($3, within the row's history: offsets_lsn only grows), and a
// recovery point when one is given ($4 to $6).
const setStateExactSet = `UPDATE public.outbox_connector_state SET confirmed_lsn = $2::pg_lsn,
    offsets_lsn = CASE WHEN $3::pg_lsn IS NULL THEN offsets_lsn ELSE GREATEST(offsets_lsn, $3::pg_lsn) END,
    recover_xmin = coalesce($4::bigint, recover_xmin),
    recover_lsn = CASE WHEN $4::bigint IS NULL THEN recover_lsn ELSE $5::pg_lsn END,
    recover_at = CASE WHEN $4::bigint IS NULL THEN recover_at ELSE $6::timestamptz END,
    messages_seen = messages_seen OR $7::boolean,
    timeline = coalesce($8::integer, timeline),
    updated_at = now()`

const setStateExact = setStateExactSet + ` WHERE slot_name = $1` + capturePoint

const setStateExactFenced = setStateExactSet + `
WHERE slot_name = $1 AND EXISTS (SELECT 1 FROM public.outbox_lease WHERE slot_name = $1 AND token = $9::bigint FOR SHARE)` + capturePoint

// Execer runs a statement (a *pgx.Conn, a pgx.Tx).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LockWait bounds how long a state write waits for a row lock (its
// lock_timeout): on the state row, which another session may hold (an
// operator's SELECT ... FOR UPDATE left open, a trigger's or a job's
// UPDATE), and on the lease row, which a fenced write locks FOR SHARE
// first. While it waits it holds that share lock, and the lease's renewal,
// an UPDATE of the lease row, waits behind it: with no bound the leader
// lost its lease within a TTL of an operator's lock (a client deadline is
// no cure: pgx then closes the connection, and the server goes on waiting
// for the lock, holding the lease row, which a takeover's UPDATE waits for
// too). Half a second is far above a healthy write's milliseconds and
// inside the renewal's margin (OUTBOX_LEASE_TTL is at least 1 s, and a
// renewal is due every third of it). The write then fails (SQLSTATE
// 55P03), which ends the session; the stall watch reports writes that keep
// failing.
const LockWait = 500 * time.Millisecond

// setLockWait sets lock_timeout for the rest of the transaction: with the
// write, in one batch, the write's alone.
const setLockWait = `SELECT set_config('lock_timeout', $1, true)`

// batcher is an Execer that sends statements in one batch (*pgx.Conn,
// pgx.Tx).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// queryPoint runs the state write q, which returns a point, with
// lock_timeout LockWait where conn batches. Both statements go in one
// batch, which the server runs as one implicit transaction whatever the
// client does meanwhile (the setting ends with it), so that, as for a
// single statement, no client round trip holds the write's locks. In a
// pgx.Tx the setting lasts until that transaction ends.
func queryPoint(ctx context.Context, conn Execer, q string, args ...any) (Point, error) {
	bc, ok := conn.(batcher)
	if !ok {
		return ScanPoint(conn.QueryRow(ctx, q, args...))
	}
	b := &pgx.Batch{}
	b.Queue(setLockWait, strconv.FormatInt(LockWait.Milliseconds(), 10))
	b.Queue(q, args...)
	br := bc.SendBatch(ctx, b)
	_, err := br.Exec()
	var p Point
	if err == nil {
		p, err = ScanPoint(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		err = fmt.Errorf("waited %s (lock_timeout) for a lock another session holds on the state row public.outbox_connector_state or the lease row public.outbox_lease; find it in pg_locks: %w", LockWait, err)
	}
	return p, err
}

// write runs a state write, fenced when f is set (the token is the fenced
// statement's last parameter), and returns the recovery point the
// statement took (see Point): a fenced write that changed no row found
// another token in the lease. It waits at most LockWait for a lock.
func write(ctx context.Context, conn Execer, f Fence, plain, fenced string, args ...any) (Point, error) {
	q := plain
	if f.Token != 0 {
		q, args = fenced, append(args, f.Token)
	}
	p, err := queryPoint(ctx, conn, q, args...)
	if errors.Is(err, pgx.ErrNoRows) {
		if f.Token != 0 {
			return p, errFenced
		}
		// An exact write to a row that is not there: as Exec, no error.
		return p, nil
	}
	return p, err
}

// SetStateExact records exactly st.Confirmed, which may be below the recorded
// promise: at a graceful stop the promise shrinks to what was confirmed.
func SetStateExact(ctx context.Context, conn Execer, st State, f Fence) error {
	_, err := setStateExactPoint(ctx, conn, st, f)
	return err
}

// setStateExactPoint is SetStateExact, returning the point it took.
func setStateExactPoint(ctx context.Context, conn Execer, st State, f Fence) (Point, error) {
	var olsn *string
	if st.OffsetsLSN != 0 {
		l := wal.FormatLSN(st.OffsetsLSN)
		olsn = &l
	}
	xmin, rlsn, rat := st.Recover.args()
	p, err := write(ctx, conn, f, setStateExact, setStateExactFenced, st.Slot, wal.FormatLSN(st.Confirmed), olsn, xmin, rlsn, rat, st.MessagesSeen, st.timeline())
	if err != nil {
		return p, fmt.Errorf("record final position %s for slot %q: %w", wal.FormatLSN(st.Confirmed), st.Slot, err)
	}
	return p, nil
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
		if n == len(stateDDL)-1 {
			return nil
		}
		for _, q := range stateDDL[1:] {
			if _, err := conn.Exec(ctx, q); err != nil {
				return &fatal.Error{Msg: "the state table public.outbox_connector_state lacks columns of this version (offsets_epoch, offsets_lsn, recover_xmin, recover_lsn, recover_at, recovering, messages_seen, timeline, recover_floor_xmin, recover_floor_at), and this role cannot add them; apply sql/004_connector_state.sql again (its ALTER TABLE statements) as the table's owner", Err: err}
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
WHERE attrelid = 'public.outbox_connector_state'::regclass AND NOT attisdropped
  AND attname IN ('offsets_epoch', 'offsets_lsn', 'recover_xmin', 'recover_lsn', 'recover_at', 'recovering', 'messages_seen', 'timeline', 'recover_floor_xmin', 'recover_floor_at')`

// LoadState reads the slot's state row; ok is false when there is none.
func LoadState(ctx context.Context, conn *pgx.Conn, slot string) (State, bool, error) {
	st := State{Slot: slot}
	var lsn, olsn, rlsn string
	var rxmin int64
	var fxmin *int64
	var fat *time.Time
	err := conn.QueryRow(ctx, queryState, slot).Scan(&st.SystemID, &lsn, &st.SnapshotDone, &st.OffsetsEpoch, &olsn,
		&rxmin, &rlsn, &st.Recover.At, &st.Recovering, &st.MessagesSeen, &st.Timeline, &fxmin, &fat)
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
	if l, err = pglogrepl.ParseLSN(rlsn); err != nil {
		return st, false, fmt.Errorf("parse state recovery LSN %q: %w", rlsn, err)
	}
	st.Recover.Xmin, st.Recover.LSN = uint64(rxmin), uint64(l)
	if st.Recover.IsZero() {
		st.Recover = Point{}
	}
	if fxmin != nil {
		st.Floor = Floor{Taken: true, Xmin: uint64(*fxmin)}
		if fat != nil {
			st.Floor.At = *fat
		}
	}
	return st, true, nil
}

// SaveState writes st, never moving the confirmed position backwards.
func SaveState(ctx context.Context, conn Execer, st State, f Fence) error {
	_, err := saveStatePoint(ctx, conn, st, f)
	return err
}

// saveStatePoint is SaveState, returning the recovery point the write took
// (see Point).
func saveStatePoint(ctx context.Context, conn Execer, st State, f Fence) (Point, error) {
	p, err := write(ctx, conn, f, upsertState, upsertStateFenced, st.args()...)
	if err != nil {
		return p, fmt.Errorf("save connector state for slot %q at %s: %w", st.Slot, wal.FormatLSN(st.Confirmed), err)
	}
	return p, nil
}

// ResetState overwrites the state row (accepted slot reset, new slot).
func ResetState(ctx context.Context, conn Execer, st State, f Fence) error {
	if _, err := write(ctx, conn, f, resetState, resetStateFenced, st.args()...); err != nil {
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
	xmin, rlsn, rat := st.Recover.args()
	fxmin, fat := st.Floor.args()
	return []any{st.Slot, st.SystemID, wal.FormatLSN(st.Confirmed), st.SnapshotDone, epoch, olsn, xmin, rlsn, rat, st.Recovering, st.MessagesSeen, st.timeline(), fxmin, fat}
}

// timeline is the Timeline parameter: NULL when not known.
func (st State) timeline() any {
	if st.Timeline == 0 {
		return nil
	}
	return st.Timeline
}

// args are a point's parameters: all NULL for none.
func (p Point) args() (xmin, lsn, at any) {
	if p.IsZero() {
		return nil, nil, nil
	}
	return int64(p.Xmin), wal.FormatLSN(p.LSN), p.At
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
			"Start with OUTBOX_ON_SLOT_LOSS=recover (or run connector recover once) to replace the slot and publish again, from the outbox table, every event that may not have been delivered; "+
			"or check the outbox table for events in that range, re-publish what is missing, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to continue from %s",
			s.Name, wal.FormatLSN(s.ConfirmedFlush), wal.FormatLSN(st.Confirmed), wal.FormatLSN(s.ConfirmedFlush))
	}
	return nil
}
