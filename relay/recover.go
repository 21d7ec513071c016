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

// recoveryWindow is what a recovery, or the snapshot it owes, publishes
// again: the rows written since from, or the whole table (whole: the
// initial snapshot never completed, so the table as it is now is owed).
type recoveryWindow struct {
	whole bool
	from  checkpoint.Point
}

// windowOf is the window a state row owes after its slot was lost.
func windowOf(st checkpoint.State) recoveryWindow {
	if !st.SnapshotDone && !st.Recovering {
		return recoveryWindow{whole: true}
	}
	return recoveryWindow{from: st.Recover}
}

// windowWhere is the condition on an outbox row of being in a window from a
// point ($1: its xmin, $2: the earliest created_at it takes), as SQL. The
// reference for widening xmin is the snapshot's next transaction id: in the
// snapshot's transaction, pg_current_snapshot() is that snapshot.
func windowWhere(hasCreatedAt bool) string {
	const ref = `(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint)`
	cond := fmt.Sprintf(`%s - (((%s %% 4294967296) - xmin::text::bigint + 4294967296) %% 4294967296) >= $1::bigint`, ref, ref)
	if hasCreatedAt {
		cond += " AND created_at >= $2::timestamptz"
	}
	return "(" + cond + ")"
}

// args are windowWhere's parameters.
func (w recoveryWindow) args(margin time.Duration) []any {
	return []any{int64(w.from.Xmin), w.from.At.Add(-margin)}
}

// queryHasCreatedAt: whether the outbox has a timestamptz created_at (the
// window's bound by time; sql/001's table has it). A timestamp without time
// zone would be read in the connector's session time zone, not the
// writers': such a column is not used.
const queryHasCreatedAt = `
SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'created_at' AND attnum > 0 AND NOT attisdropped
               AND atttypid = 'timestamptz'::regtype)`

func (r *Relay) hasCreatedAt(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (bool, error) {
	var has bool
	if err := q.QueryRow(ctx, queryHasCreatedAt, pgx.Identifier{r.schema, r.table}.Sanitize()).Scan(&has); err != nil {
		return false, fmt.Errorf("look up the columns of %s.%s: %w", r.schema, r.table, err)
	}
	return has, nil
}

// slotLost says how the slot was lost ("" when it was not, or when it is
// not this connector's to recover: another cluster's state row).
func slotLost(exists bool, info wal.SlotInfo, st checkpoint.State, hasState, creating bool, systemID string) string {
	switch {
	case !hasState || st.SystemID != systemID:
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

// checkRecoverable refuses a recovery whose window the outbox table cannot
// be shown to hold: rows deleted in the transaction that wrote them
// (delete-after-insert), events written as logical messages, or a retention
// that deleted rows of the window. What shows that it holds them: a row
// older than the window is still there (retention deletes the oldest
// first). It also counts the window, for the log.
func (r *Relay) checkRecoverable(ctx context.Context, conn *pgx.Conn, st checkpoint.State, w recoveryWindow) (int64, error) {
	tbl := pgx.Identifier{r.schema, r.table}.Sanitize()
	if w.whole {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
			return 0, fmt.Errorf("count the rows of %s for the recovery: %w", tbl, err)
		}
		return n, nil
	}
	has, err := r.hasCreatedAt(ctx, conn)
	if err != nil {
		return 0, err
	}
	where := windowWhere(has)
	var inWindow int64
	var older bool
	q := fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE %[2]s), EXISTS (SELECT 1 FROM %[1]s WHERE NOT %[2]s)`, tbl, where)
	if err := conn.QueryRow(ctx, q, w.args(r.cfg.RecoverMargin)...).Scan(&inWindow, &older); err != nil {
		return 0, fmt.Errorf("look for the recovery window's rows in %s: %w", tbl, err)
	}
	var why string
	switch {
	case st.MessagesSeen:
		why = "the slot carried events written as logical decoding messages (outbox mode message), which the table never holds"
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
	since := "the connector recorded no recovery point (a state row of an older version, or a slot adopted as it was and never advanced since), so the window is the whole table"
	if !w.from.IsZero() {
		since = fmt.Sprintf("the window is every event written since %s (WAL %s, transaction %d)", w.from.At.UTC().Format(time.RFC3339), wal.FormatLSN(w.from.LSN), w.from.Xmin)
	}
	return inWindow, fatal.Errorf("cannot recover slot %q from the outbox table: %s, and %s. "+
		"No recovery from the table is complete then (outbox modes delete-after-insert and message: the events exist only in the WAL; or a retention shorter than the gap). "+
		"Find the missing events elsewhere (the services' own tables), publish them, then start once with OUTBOX_ON_SLOT_LOSS=fail and OUTBOX_ACCEPT_SLOT_RESET=true (a new slot, from now on). "+
		"If you know the table holds every event of the window (the outbox was quiet before it, or emptied on purpose), run connector recover -allow-gap once",
		r.cfg.Slot, since, why)
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
