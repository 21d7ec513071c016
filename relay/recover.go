package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// Recovery of a lost slot (OUTBOX_ON_SLOT_LOSS=recover, connector recover).
//
// A slot is lost when it is gone (dropped; or absent on a standby promoted
// after the primary failed), invalidated (wal_status lost: the server removed
// WAL it still needed) or ahead of the state row (advanced, or recreated, by
// someone else). The events the slot would have given are still in the
// outbox table (table mode keeps its rows until the retention deletes them),
// so the connector creates a new slot and, in the snapshot the new slot
// exports, publishes again every row that may not have been delivered, then
// streams from the new slot's consistent point: nothing is lost, and what is
// published twice is inside the window.
//
// The window is found by transaction id, not by time: created_at is when the
// writing transaction began, and a transaction that began before the last
// delivered position may commit long after it. The state row keeps a
// recovery point (checkpoint.Point): a transaction id such that every event
// written by a smaller one was delivered. The window is every row whose
// xmin is at least that id. Its duplicates are the rows of transactions
// that were running when the point was taken, or began between it and the
// last delivered position: at most a state write's interval (about
// OUTBOX_STATUS_INTERVAL) plus the longest write transaction running then.
//
// A row's xmin is 32 bits wide; it is widened against the snapshot's next
// transaction id, exact for every row written in the last 2^31
// transactions. Freezing keeps the raw xmin (PostgreSQL 9.4+), so an older
// row can alias into the window, and a row rewritten by another
// transaction (a partition move of outbox/partition, pg_repack, an UPDATE)
// carries that transaction's id. Where the table has created_at, the
// window is therefore also bounded by time: rows created more than
// OUTBOX_RECOVER_MARGIN (6h) before the point was taken are not in it. A
// transaction writing outbox rows that stays open longer than the margin
// across a lost slot is the case that bound gives up; raise the margin
// where such transactions exist.
//
// The table is checked where the window is read: in the snapshot that is
// published (openSnapshot), not only before the slot is replaced. A
// recovery whose publish fails (a Kafka outage, a registry refusal, the
// liveness probe's restart) resumes at the next start from the table as it
// is then, while the retention goes on deleting the oldest rows. Its first
// snapshot records the oldest row it owes (checkpoint.Floor); a later
// attempt refuses unless a row at least as old is still there. What that
// proves, and what it does not: a retention that deletes by age (the
// outbox Cleaner, maintain's partition drops) and has kept a row that old
// has deleted none of the rows owed, which are all at least as young. A
// row deleted by hand, or a row of a transaction that began before the
// oldest row read (created_at is its start) and committed after the first
// snapshot, is outside that proof. For a slot lost during its initial
// snapshot the window is the whole table, and nothing older than it can
// be left to show it whole; the proof is the initial snapshot's own floor:
// while a row at least as old as the oldest it read is still there, the
// retention deleted nothing it owed, nor anything written since.

// recoveryWindow is what a recovery, or the snapshot it owes, publishes
// again: the rows written since from, or the whole table (whole: the
// initial snapshot never completed, so the table as it is now is owed).
type recoveryWindow struct {
	whole bool
	from  checkpoint.Point
	// floor is what the state row records of the rows the window owes:
	// for a slot lost during its initial snapshot, what that snapshot read
	// first; for a recovery under way, what its first snapshot read.
	floor checkpoint.Floor
	// resumed: the row records this recovery under way, so its first
	// attempt's check passed (or -allow-gap let it through): a later
	// attempt has to show only, by the floor, that nothing it owes was
	// deleted since.
	resumed bool
	// messages: the slot carried events written as logical decoding
	// messages (State.MessagesSeen), which the table never holds.
	messages bool
}

// windowOf is the window a state row owes after its slot was lost, or
// while its recovery is under way.
func windowOf(st checkpoint.State) recoveryWindow {
	w := recoveryWindow{from: st.Recover, floor: st.Floor, resumed: st.Recovering, messages: st.MessagesSeen}
	// The row owes its initial snapshot (not a recovery's window), or a
	// recovery of the whole table (recovering with no point) is under way.
	if !st.SnapshotDone && (!st.Recovering || st.Recover.IsZero()) {
		w.whole, w.from = true, checkpoint.Point{}
	}
	return w
}

// anyXid is the Xmin of a point that bounds a window by time alone: every
// transaction id passes it (normal ids start at 3).
const anyXid = 1

// acrossClusters is the window of a state row another cluster wrote (a
// logical restore, or a copy of the database, the state table copied
// along): that cluster's transaction ids mean nothing here, nor does what
// its snapshots read. The window is bounded by time alone, the rows
// created since OUTBOX_RECOVER_MARGIN before the point was taken, where
// the table has created_at and the row a point; otherwise it is the whole
// table, and nothing shows it whole.
func (w recoveryWindow) acrossClusters(hasCreatedAt bool) recoveryWindow {
	if w.whole || w.from.IsZero() || !hasCreatedAt {
		return recoveryWindow{whole: true, messages: w.messages}
	}
	return recoveryWindow{from: checkpoint.Point{Xmin: anyXid, At: w.from.At}, messages: w.messages}
}

// widenedXmin is a row's xmin widened to 64 bits, as SQL. The reference is
// the snapshot's next transaction id: in the snapshot's transaction,
// pg_current_snapshot() is that snapshot.
var widenedXmin = fmt.Sprintf(`(%[1]s - (((%[1]s %% 4294967296) - xmin::text::bigint + 4294967296) %% 4294967296))`,
	`(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint)`)

// windowWhere is the condition on an outbox row of being in a window from a
// point ($1: its xmin, $2: the earliest created_at it takes), as SQL.
func windowWhere(hasCreatedAt bool) string {
	cond := widenedXmin + " >= $1::bigint"
	if hasCreatedAt {
		cond += " AND created_at >= $2::timestamptz"
	}
	return "(" + cond + ")"
}

// args are windowWhere's parameters ($2 only where the table has
// created_at: the statement takes no more parameters than it names).
func (w recoveryWindow) args(margin time.Duration, hasCreatedAt bool) []any {
	if !hasCreatedAt {
		return []any{int64(w.from.Xmin)}
	}
	return []any{int64(w.from.Xmin), w.from.At.Add(-margin)}
}

// queryHasCreatedAt: whether the outbox has a timestamptz created_at (the
// window's bound by time; sql/001's table has it). A timestamp without time
// zone would be read in the connector's session time zone, not the
// writers': such a column is not used.
const queryHasCreatedAt = `
SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'created_at' AND attnum > 0 AND NOT attisdropped
               AND atttypid = 'timestamptz'::regtype)`

// querier is a connection or a transaction (a snapshot's).
type querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

func (r *Relay) hasCreatedAt(ctx context.Context, q querier) (bool, error) {
	var has bool
	if err := q.QueryRow(ctx, queryHasCreatedAt, pgx.Identifier{r.schema, r.table}.Sanitize()).Scan(&has); err != nil {
		return false, fmt.Errorf("look up the columns of %s.%s: %w", r.schema, r.table, err)
	}
	return has, nil
}

// slotLost says how the slot was lost ("" when it was not, or when it is
// not this connector's to recover: another cluster's state row beside a
// slot that exists, which checkpoint.CheckSlotAgainstState refuses).
func slotLost(exists bool, info wal.SlotInfo, st checkpoint.State, hasState, creating bool, systemID string) string {
	switch {
	case !hasState:
		return ""
	case st.SystemID != systemID && !exists:
		return fmt.Sprintf("is missing, and the state row was written by another cluster (system identifier %s; this is %s: a logical restore, or a copy of the database)", st.SystemID, systemID)
	case st.SystemID != systemID:
		return ""
	case !exists && !creating:
		return "is gone (dropped, or this server is a standby promoted without it)"
	case exists && info.WALStatus == "lost":
		return "is invalidated (wal_status = lost: PostgreSQL removed WAL it still needed)"
	case exists && !creating && info.ConfirmedFlush > st.Confirmed:
		return fmt.Sprintf("is ahead of the state row (confirmed %s, the connector only ever confirmed %s: advanced, or dropped and created again, behind the connector's back)",
			wal.FormatLSN(info.ConfirmedFlush), wal.FormatLSN(st.Confirmed))
	}
	return ""
}

// checkRecoverable refuses a recovery whose window the outbox table, as q
// reads it (a connection before the slot is replaced; the snapshot the
// window is published from), cannot be shown to hold: rows deleted in the
// transaction that wrote them (delete-after-insert), events written as
// logical messages, or a retention that deleted rows of the window. What
// shows that it holds them: at the first attempt, a row older than the
// window is still there (retention deletes the oldest first); for the
// whole table, and at a later attempt, a row at least as old as the oldest
// one the first snapshot read (see the floor above). It also counts the
// window, for the log.
func (r *Relay) checkRecoverable(ctx context.Context, q querier, w recoveryWindow) (int64, error) {
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	has, err := r.hasCreatedAt(ctx, q)
	if err != nil {
		return 0, err
	}
	var inWindow int64
	older := true
	if w.whole {
		if err := q.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&inWindow); err != nil {
			return 0, fmt.Errorf("count the rows of %s for the recovery: %w", tbl, err)
		}
	} else {
		where := windowWhere(has)
		sql := fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE %[2]s), EXISTS (SELECT 1 FROM %[1]s WHERE NOT %[2]s)`, tbl, where)
		if err := q.QueryRow(ctx, sql, w.args(r.cfg.RecoverMargin, has)...).Scan(&inWindow, &older); err != nil {
			return 0, fmt.Errorf("look for the recovery window's rows in %s: %w", tbl, err)
		}
	}
	holds := func() (bool, error) { return r.floorHolds(ctx, q, w.floor, has) }
	var why string
	resumed := false
	switch {
	case w.resumed && w.floor.Taken:
		ok, err := holds()
		if err != nil || ok {
			return inWindow, err
		}
		resumed = true
		why = fmt.Sprintf("an earlier snapshot of this recovery (or the initial snapshot it replaces) read the rows the window owes, the oldest %s, and %s holds no row that old now: "+
			"a retention (the outbox Cleaner, maintain) deleted rows of the window while it was being published, and they may not all have been delivered", describeFloor(w.floor), tbl)
	case w.messages:
		why = "the slot carried events written as logical decoding messages (outbox mode message), which the table never holds"
	case w.whole && w.floor.Taken:
		ok, err := holds()
		if err != nil || ok {
			return inWindow, err
		}
		why = fmt.Sprintf("the initial snapshot read the rows it owes first, the oldest %s, and %s holds no row that old now: "+
			"a retention (the outbox Cleaner, maintain) deleted rows the initial snapshot owed, and they may not all have been published", describeFloor(w.floor), tbl)
	case w.whole:
		why = "the state row records nothing of the rows its initial snapshot read (a row of an older version, or another cluster's), so nothing shows that a retention deleted none of them"
	case !older:
		why = fmt.Sprintf("%s holds %d rows of the window but none older, so nothing shows that the window's rows are all still there: "+
			"events deleted in the transaction that wrote them (outbox mode delete-after-insert) are never in the table, and a retention that deleted rows older than the window may have deleted rows of it", tbl, inWindow)
	default:
		return inWindow, nil
	}
	if r.allowGap.Load() {
		r.log.Warn("recovering although the outbox table may not hold every event of the window (connector recover -allow-gap): events missing from it are skipped",
			"slot", r.cfg.Slot, "why", why, "window_rows", inWindow)
		return inWindow, nil
	}
	var since string
	switch {
	case w.whole:
		since = "the slot was lost before its initial snapshot was all published, so the window is the whole table"
	case w.from.IsZero():
		since = "the connector recorded no recovery point (a state row of an older version, or a slot adopted as it was and never advanced since), so the window is the whole table"
	case w.from.Xmin == anyXid:
		since = fmt.Sprintf("the window is every event created since %s (by time: the recovery point was taken on another cluster, whose transaction ids mean nothing here)", w.from.At.Add(-r.cfg.RecoverMargin).UTC().Format(time.RFC3339))
	default:
		since = fmt.Sprintf("the window is every event written since %s (WAL %s, transaction %d)", w.from.At.UTC().Format(time.RFC3339), wal.FormatLSN(w.from.LSN), w.from.Xmin)
	}
	if resumed {
		// The new slot exists and the row owes its window: a reset would
		// not skip it, only publishing what is left finishes it.
		return inWindow, fatal.Errorf("cannot recover slot %q from the outbox table: %s, and %s. "+
			"Find the deleted events elsewhere (the services' own tables, a backup of the outbox) and publish them, "+
			"then run connector recover -allow-gap once: it publishes what the table still holds of the window and finishes the recovery. "+
			"Keep the retention (Cleaner.Retention, MAINTAIN_RETENTION) longer than a recovery may take",
			r.cfg.Slot, since, why)
	}
	return inWindow, fatal.Errorf("cannot recover slot %q from the outbox table: %s, and %s. "+
		"No recovery from the table is complete then (outbox modes delete-after-insert and message: the events exist only in the WAL; or a retention shorter than the gap). "+
		"Find the missing events elsewhere (the services' own tables), publish them, then run connector recover -allow-gap once: it publishes what the table still holds of the window and finishes the recovery "+
		"(the way out once the recovery has begun, its new slot created; before that, starting once with OUTBOX_ON_SLOT_LOSS=fail and OUTBOX_ACCEPT_SLOT_RESET=true instead makes a new slot from now on, the window skipped). "+
		"If you know the table holds every event of the window (the outbox was quiet before it, or emptied on purpose), run connector recover -allow-gap once",
		r.cfg.Slot, since, why)
}

// floorHolds reports whether q shows a row at least as old as the floor
// f's: by created_at where the table has it and the floor a time, by
// transaction id otherwise. A floor of no row (the snapshot owed none)
// holds.
func (r *Relay) floorHolds(ctx context.Context, q querier, f checkpoint.Floor, hasCreatedAt bool) (bool, error) {
	if f.Xmin == 0 {
		return true, nil
	}
	cond, arg := widenedXmin+" <= $1::bigint", any(int64(f.Xmin))
	if hasCreatedAt && !f.At.IsZero() {
		cond, arg = "created_at <= $1::timestamptz", f.At
	}
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	var ok bool
	if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+tbl+" WHERE "+cond+")", arg).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for a row of %s as old as the oldest the snapshot owes: %w", tbl, err)
	}
	return ok, nil
}

// takeFloor reads, in a snapshot, the floor of the rows it owes: those of
// window (nil, or whole: every row of the table). The oldest row is the
// one with the earliest created_at where the table has it, the smallest
// transaction id otherwise.
func (r *Relay) takeFloor(ctx context.Context, q querier, window *recoveryWindow) (checkpoint.Floor, error) {
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	has, err := r.hasCreatedAt(ctx, q)
	if err != nil {
		return checkpoint.Floor{}, err
	}
	where, args := "", []any(nil)
	if window != nil && !window.whole {
		where, args = " WHERE "+windowWhere(has), window.args(r.cfg.RecoverMargin, has)
	}
	at, order := "NULL::timestamptz", widenedXmin
	if has {
		at, order = "created_at", "created_at, "+widenedXmin
	}
	var ts *time.Time
	var xmin int64
	err = q.QueryRow(ctx, fmt.Sprintf("SELECT %s, %s FROM %s%s ORDER BY %s LIMIT 1", at, widenedXmin, tbl, where, order), args...).Scan(&ts, &xmin)
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.Floor{Taken: true}, nil
	}
	if err != nil {
		return checkpoint.Floor{}, fmt.Errorf("find the oldest row of %s the snapshot owes: %w", tbl, err)
	}
	f := checkpoint.Floor{Taken: true, Xmin: uint64(xmin)}
	if ts != nil {
		f.At = *ts
	}
	return f, nil
}

// describeFloor names a floor's row for a message.
func describeFloor(f checkpoint.Floor) string {
	if f.At.IsZero() {
		return fmt.Sprintf("written by transaction %d", f.Xmin)
	}
	return fmt.Sprintf("created at %s (transaction %d)", f.At.UTC().Format(time.RFC3339Nano), f.Xmin)
}

// checkOwnKind refuses to replace a lost slot that is not the connector's
// kind (another plugin, type or database), as wal.CheckSlot refuses to
// stream one; its being lost is what the caller handles.
func checkOwnKind(info wal.SlotInfo, db string) error {
	info.WALStatus = ""
	return wal.CheckSlot(info, db)
}

// dropLostSlot drops the slot a recovery replaces (invalidated, or ahead
// of the state row). An active slot is another client's: refused.
func (r *Relay) dropLostSlot(ctx context.Context, conn *pgx.Conn, info wal.SlotInfo) error {
	if info.Active {
		return fatal.Errorf("slot %q is lost and must be replaced, but a client still streams it (pid %d, not this connector's walsender: the lease fenced those): stop it, then start again", info.Name, info.ActivePID)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", info.Name); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fatal.Errorf("slot %q is lost and must be replaced, but this role may not drop it (%s): drop it as a superuser or a role with REPLICATION (SELECT pg_drop_replication_slot('%s');), then start again", info.Name, pgErr.Message, info.Name)
		}
		return fmt.Errorf("drop the lost slot %q: %w", info.Name, err)
	}
	return nil
}
