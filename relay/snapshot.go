package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/rowsecurity"
	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// snapshot is an open repeatable-read transaction on a second connection,
// importing the snapshot the slot exported, so that the rows it reads are
// exactly those committed before the slot's consistent point.
type snapshot struct {
	conn *pgx.Conn
	tx   pgx.Tx
	// window is a recovery's (nil: every row of the table).
	window *recoveryWindow
	// point is the recovery point the snapshot gives once published: every
	// row it does not show has an id at least its xmin (checkpoint.Point).
	point checkpoint.Point
	// floor is what the state row is to record of the rows the snapshot
	// owes (checkpoint.Floor): the one given, or the one this snapshot took.
	floor checkpoint.Floor
}

// openSnapshot opens the snapshot name (the table as it is now when name is
// empty) for publishing window (nil: the whole table, an initial snapshot).
// floor is what the state row records of the rows the snapshot owes; when
// it has none (not taken), this snapshot is the first to read them and
// takes it. A recovery's window is checked here, in the snapshot its rows
// are read from (checkRecoverable): a check before it cannot see what a
// retention deletes in between, nor, when the publish failed and this is
// a later attempt, what it deleted since the first.
func (r *Relay) openSnapshot(ctx context.Context, name string, window *recoveryWindow, floor checkpoint.Floor) (*snapshot, error) {
	conn, err := pgx.Connect(ctx, r.cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("connect for the initial snapshot: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("begin the initial snapshot: %w", err)
	}
	if name != "" {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION SNAPSHOT '%s'", name)); err != nil {
			conn.Close(ctx)
			return nil, fmt.Errorf("import snapshot %q: %w", name, err)
		}
	}
	// Row-level security must not filter what the snapshot publishes: a
	// policy that applies to this role is refused, and with row_security
	// off the reads fail rather than skip should one apply anyway.
	if err := r.checkRowSecurity(ctx, tx); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET LOCAL row_security = off"); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("snapshot: SET LOCAL row_security = off: %w", err)
	}
	p, err := checkpoint.ScanPoint(tx.QueryRow(ctx, checkpoint.QueryPoint))
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("read the snapshot's transaction horizon: %w", err)
	}
	if window != nil {
		if _, err := r.checkRecoverable(ctx, tx, *window); err != nil {
			conn.Close(ctx)
			return nil, err
		}
	}
	if !floor.Taken {
		if floor, err = r.takeFloor(ctx, tx, window); err != nil {
			conn.Close(ctx)
			return nil, err
		}
	}
	return &snapshot{conn: conn, tx: tx, window: window, point: p, floor: floor}, nil
}

// checkRowSecurity refuses, as the deployment's to fix, a read of the
// outbox table (the initial snapshot, a recovery's window) that row-level
// security could filter for the connector's role: the rows it hides would
// be skipped, and the snapshot or the recovery recorded complete.
func (r *Relay) checkRowSecurity(ctx context.Context, q rowsecurity.Querier) error {
	what := "the initial snapshot"
	if r.cfg.OnSlotLoss == "recover" {
		what = "the initial snapshot and slot recovery"
	}
	err := rowsecurity.Check(ctx, q, pgx.Identifier{r.schema, r.table}.Sanitize(), what)
	if errors.Is(err, rowsecurity.ErrApplies) {
		return &fatal.Error{Msg: "OUTBOX_TABLE", Err: err}
	}
	return err
}

// close ends the snapshot's transaction and connection, within a few
// seconds even when the connection is dead (a read-only transaction has
// nothing to keep: the server rolls it back when the connection goes).
func (s *snapshot) close(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.tx.Rollback(cctx)
	_ = s.conn.Close(cctx)
}

// publishSnapshot publishes every row of the outbox table in the snapshot,
// in the order snapshotOrder chooses, and waits until Kafka acked them all.
func (r *Relay) publishSnapshot(ctx context.Context, s *snapshot, tr *tracker.Tracker, out chan<- wal.Event, at uint64) error {
	order, exact, err := r.snapshotOrder(ctx, s.tx)
	if err != nil {
		return err
	}
	// What the catalog says of the columns (NOT NULL, defaults), in the
	// snapshot, as the stream reads it for its relations.
	var relID uint32
	if err := s.tx.QueryRow(ctx, "SELECT $1::regclass::oid", pgx.Identifier{r.schema, r.table}.Sanitize()).Scan(&relID); err != nil {
		return fmt.Errorf("find the outbox table %s.%s for the initial snapshot: %w", r.schema, r.table, err)
	}
	infos, err := wal.ColumnInfoOf(s.tx)(ctx, relID)
	if err != nil {
		return fmt.Errorf("initial snapshot of %s.%s: %w", r.schema, r.table, err)
	}
	where, args := "", []any{pgx.QueryExecModeSimpleProtocol}
	what := "initial snapshot"
	if s.window != nil && !s.window.whole {
		has, err := r.hasCreatedAt(ctx, s.tx)
		if err != nil {
			return err
		}
		where, args = " WHERE "+windowWhere(has), append(args, s.window.args(r.cfg.RecoverMargin, has)...)
		what = "recovery window"
	}
	q := fmt.Sprintf("SELECT * FROM %s%s ORDER BY %s", pgx.Identifier{r.schema, r.table}.Sanitize(), where, order)
	// The simple protocol returns every value in text format, as pgoutput
	// does, so snapshot rows route exactly like streamed ones.
	rows, err := s.tx.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read the initial snapshot of %s.%s: %w", r.schema, r.table, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	txn := tr.Begin(at)
	n := 0
	for rows.Next() {
		row := wal.TextRow(fields, rows.RawValues(), infos, route.Source{CommitLSN: at, Table: r.schema + "." + r.table})
		txn.Add()
		select {
		case out <- wal.Event{Txn: txn, Row: row}:
		case <-ctx.Done():
			txn.Abandon()
			return ctx.Err()
		}
		n++
		if err := r.faults.At(fault.SnapshotRow); err != nil {
			// The snapshot's transaction is never committed in the
			// tracker, so nothing of it is ever acked.
			return err
		}
	}
	if err := rows.Err(); err != nil {
		// Every row counted is handed over by now, and the transaction is
		// never committed in the tracker, so nothing of it is ever acked
		// (withdrawing a row here would count one Done too many).
		return fmt.Errorf("read the initial snapshot of %s.%s: %w", r.schema, r.table, err)
	}
	// Said only when the order could matter (two rows or more): on an empty
	// table, every first start (make demo's included) warned of nothing.
	if !exact && n > 1 {
		r.log.Warn("the "+what+" ordered rows by "+order+": an aggregate's events written by transactions that began in another order than they committed may have been published out of order. "+
			"Add a column filled at insert from a sequence (sql/variants/outbox_snapshot_order.sql) or set track_commit_timestamp = on", "table", r.schema+"."+r.table, "rows", n)
	}
	txn.Commit(at)
	r.metrics.SnapshotEvents.Add(float64(n))
	for !tr.Idle() {
		select {
		case <-tr.Changed():
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.log.Info(what+" published", "rows", n, "lsn", wal.FormatLSN(at))
	return nil
}

// querySnapshotOrder finds how the snapshot can order the table's rows: an
// integer column filled at INSERT from a sequence the table owns (an
// identity or serial column) that hands out values one at a time (CACHE 1:
// with a larger cache each session takes a range, and a later write may get
// a smaller value), the first by position; whether commit timestamps are
// kept; whether the table has created_at.
const querySnapshotOrder = `
SELECT coalesce((SELECT a.attname::text FROM pg_attribute a
                 JOIN pg_sequence q ON q.seqrelid = pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname)::regclass
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.atttypid IN ('int8'::regtype, 'int4'::regtype)
                   AND q.seqcache = 1
                 ORDER BY a.attnum LIMIT 1), ''),
       current_setting('track_commit_timestamp')::bool,
       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = 'created_at' AND NOT attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

// snapshotOrder is the ORDER BY of the initial snapshot. The promise to keep
// is per aggregate: where the application serialises an aggregate's writes
// (each transaction writing its events after the previous one committed),
// the aggregate's events come out in the order they were written, across
// transactions and within one. created_at (now(), the time the transaction
// began) is not that order: a transaction that began first may commit last.
// In order of preference:
//   - a sequence-filled column: its value is taken at INSERT, so a later
//     write, within a transaction or after another committed, has a larger
//     one (sequence values are not in commit order across concurrent
//     transactions, but those are not serialised, and no order is owed);
//   - with track_commit_timestamp, the commit time of the row's
//     transaction, then the command within it (cmin: the transaction's
//     command counter, one per statement, counted across its savepoints),
//     then the physical position, which orders the rows of one multi-row
//     INSERT only as far as they were appended (a table whose free space is
//     reused places a later row on an earlier page once the page being
//     filled is full);
//   - created_at, then cmin, then the physical position: not exact across
//     transactions (the caller warns), within one as exact as the above.
//
// Not xmin between the time and cmin, although it would keep two
// transactions of one microsecond apart: a row written in a savepoint has
// the subtransaction's xid, larger than that of the rows written before and
// after the savepoint, and an ORM's nested transaction block is a
// savepoint. Two transactions that began (or committed) in one microsecond
// ran concurrently, and no order is owed between them. cmin is the raw
// command id: a transaction deleting the row at this moment overwrites it
// with its own, which can misplace only rows on their way out.
func (r *Relay) snapshotOrder(ctx context.Context, tx pgx.Tx) (order string, exact bool, err error) {
	var seq string
	var commitTS, hasCreated bool
	if err := tx.QueryRow(ctx, querySnapshotOrder, r.schema, r.table).Scan(&seq, &commitTS, &hasCreated); err != nil {
		return "", false, fmt.Errorf("inspect %s.%s for the snapshot's order: %w", r.schema, r.table, err)
	}
	switch {
	case seq != "":
		return pgx.Identifier{seq}.Sanitize(), true, nil
	case commitTS:
		// A row whose commit time was not kept (committed before the
		// setting was turned on) sorts first: it is older.
		return "pg_xact_commit_timestamp(xmin) NULLS FIRST, cmin::text::bigint, ctid", true, nil
	case hasCreated:
		return "created_at, cmin::text::bigint, ctid", false, nil
	}
	return "ctid", false, nil
}
