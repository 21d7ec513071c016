package wal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
)

// SlotInfo is a row of pg_replication_slots.
type SlotInfo struct {
	Name           string
	Plugin         string
	SlotType       string
	Database       string
	ConfirmedFlush uint64
	RestartLSN     uint64
	WALStatus      string
	Active         bool
	ActivePID      int32
	// Failover: the slot is synchronized to standbys that run
	// sync_replication_slots (PostgreSQL 17+). Synced: it was synchronized
	// from a primary; on a promoted standby, the former primary's slot.
	Failover, Synced bool
}

// querySlot reads the slot; failover and synced (PostgreSQL 17+) through
// to_jsonb, so that before 17 they are absent (false) instead of an error.
const querySlot = `
SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''),
       coalesce(confirmed_flush_lsn, '0/0'::pg_lsn)::text, coalesce(restart_lsn, '0/0'::pg_lsn)::text,
       coalesce(wal_status, ''), active, coalesce(active_pid, 0),
       coalesce((to_jsonb(s) ->> 'failover')::boolean, false), coalesce((to_jsonb(s) ->> 'synced')::boolean, false)
FROM pg_replication_slots s WHERE slot_name = $1`

// GetSlot reads the slot; ok is false when it does not exist.
func GetSlot(ctx context.Context, conn *pgx.Conn, name string) (SlotInfo, bool, error) {
	s := SlotInfo{Name: name}
	var confirmed, restart string
	err := conn.QueryRow(ctx, querySlot, name).Scan(&s.Plugin, &s.SlotType, &s.Database, &confirmed, &restart, &s.WALStatus, &s.Active, &s.ActivePID, &s.Failover, &s.Synced)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("read slot %q from pg_replication_slots: %w", name, err)
	}
	c, _ := pglogrepl.ParseLSN(confirmed)
	r, _ := pglogrepl.ParseLSN(restart)
	s.ConfirmedFlush, s.RestartLSN = uint64(c), uint64(r)
	return s, true, nil
}

// CheckSlot refuses a slot the connector cannot stream from.
func CheckSlot(s SlotInfo, db string) error {
	switch {
	case s.SlotType != "logical":
		return fatal.Errorf("slot %q is a %s slot; the connector needs a logical slot with plugin pgoutput. Choose another OUTBOX_SLOT", s.Name, s.SlotType)
	case s.Plugin != "pgoutput":
		return fatal.Errorf("slot %q uses plugin %q; the connector needs pgoutput. Choose another OUTBOX_SLOT, or drop the slot (SELECT pg_drop_replication_slot('%s')) knowing that events not yet read from it are lost", s.Name, s.Plugin, s.Name)
	case s.Database != db:
		return fatal.Errorf("slot %q belongs to database %q, but OUTBOX_PG_DSN connects to %q", s.Name, s.Database, db)
	case s.WALStatus == "lost":
		return fatal.Errorf("slot %q is invalidated (wal_status = lost): PostgreSQL removed WAL it still needed, so the events in it cannot be read from the WAL. "+
			"Start with OUTBOX_ON_SLOT_LOSS=recover (or run connector recover once): it replaces the slot and publishes again, from the outbox table, every event that may not have been delivered. "+
			"Where the table cannot hold them (outbox modes delete-after-insert and message), publish the missing events yourself, then start once with OUTBOX_ACCEPT_SLOT_RESET=true: the slot is dropped and created anew. "+
			"Raise max_slot_wal_keep_size and watch slotwatch's alerts to prevent it", s.Name)
	}
	return nil
}

// queryRelKind reads the outbox table's kind, and its name and the
// publication's as SQL must spell them (quote_ident quotes only where the
// name needs it: a capital, a reserved word), for the statements the
// connector's errors tell the operator to run.
const queryRelKind = `
SELECT c.relkind, quote_ident(n.nspname) || '.' || quote_ident(c.relname), quote_ident($3)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

const queryPublication = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`

const queryPublicationInsert = `SELECT pubinsert FROM pg_publication WHERE pubname = $1`

// queryPublicationViaRoot reads pubviaroot (PostgreSQL 13+, the first
// release that publishes a partitioned table): asked only of a partitioned
// outbox.
const queryPublicationViaRoot = `SELECT pubviaroot FROM pg_publication WHERE pubname = $1`

// queryPublicationTable reads the outbox's entry in the publication as the
// publication publishes it (a partitioned table published via its root is
// listed itself, one published as its partitions is listed as those
// partitions; no row: not published): its row filter, and the columns of the
// table that its column list leaves out. Row filters and column lists came
// with PostgreSQL 15; the columns rowfilter and attnames are read through
// to_jsonb so that on 13 and 14, which have neither, the keys are simply
// absent (no filter, nothing left out) instead of the query failing.
// Generated columns are never published (and may not be listed), so they
// are not required of a list.
const queryPublicationTable = `
SELECT to_jsonb(pt) ->> 'rowfilter',
       ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = format('%I.%I', pt.schemaname, pt.tablename)::regclass
               AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
               AND to_jsonb(pt) ? 'attnames' AND NOT (to_jsonb(pt) -> 'attnames') ? a.attname::text
             ORDER BY a.attnum)
FROM pg_publication_tables pt WHERE pt.pubname = $1 AND pt.schemaname = $2 AND pt.tablename = $3`

// EnsurePublication checks that the publication exists and publishes the
// outbox table's inserts, whole and every one (no row filter, no column list
// that leaves a column out), as the outbox table's, creating it (inserts only)
// when it is missing and the role may. It returns whether it created the
// publication.
//
// It creates it only for a slot about to be created (slot nil): a slot's
// changes are decoded with the publication as it was when each was written,
// so a publication created after the slot (or dropped and created again)
// cannot give what was written before it. PostgreSQL 13 to 17 fail the
// stream at the first such change, 18 skips it silently. For a slot that
// exists, a missing publication is refused with the slot's position and the
// way out.
//
// A partitioned outbox needs publish_via_partition_root: without it
// pgoutput names the partition a row went into, which the stream cannot
// take for the outbox; such a publication is refused with the ALTER that
// fixes it.
func EnsurePublication(ctx context.Context, conn *pgx.Conn, pub, schema, table string, slot *SlotInfo) (bool, error) {
	// qtable and qpub are for the statements an error suggests; the
	// statements run here quote every name (pgx.Identifier).
	var kind, qtable, qpub string
	err := conn.QueryRow(ctx, queryRelKind, schema, table, pub).Scan(&kind, &qtable, &qpub)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fatal.Errorf("table %s.%s does not exist; create the outbox table (sql/001_outbox.sql, or sql/variants/outbox_partitioned.sql) or point OUTBOX_TABLE at it", schema, table)
	}
	if err != nil {
		return false, fmt.Errorf("look up table %s.%s: %w", schema, table, err)
	}
	partitioned := kind == "p"
	var exists bool
	if err := conn.QueryRow(ctx, queryPublication, pub).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up publication %q: %w", pub, err)
	}
	with := "publish = 'insert'"
	if partitioned {
		with += ", publish_via_partition_root = true"
	}
	createSQL := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)", pgx.Identifier{pub}.Sanitize(), pgx.Identifier{schema, table}.Sanitize(), with)
	created := false
	if !exists && slot != nil {
		return false, missingPublication(slot.Name, pub, slot.ConfirmedFlush, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s);", qpub, qtable, with))
	}
	if !exists {
		if _, err := conn.Exec(ctx, createSQL); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01") {
				return false, fatal.Errorf("publication %q does not exist and this role cannot create it (%s). Run as the table's owner: CREATE PUBLICATION %s FOR TABLE %s WITH (%s);", pub, pgErr.Message, qpub, qtable, with)
			}
			return false, fmt.Errorf("create publication %q: %w", pub, err)
		}
		created = true
	}
	// Checked after creating it too: what matters is what the server will
	// publish, not what the statement asked for. A publication that does not
	// publish inserts, or publishes a partitioned outbox as its partitions,
	// sends the stream nothing it takes for an outbox row, and the
	// keepalives would then confirm every event unpublished.
	var inserts bool
	if err := conn.QueryRow(ctx, queryPublicationInsert, pub).Scan(&inserts); err != nil {
		return created, fmt.Errorf("check the operations publication %q publishes: %w", pub, err)
	}
	if !inserts {
		return created, fatal.Errorf("publication %q does not publish inserts; run: ALTER PUBLICATION %s SET (publish = 'insert');", pub, qpub)
	}
	if partitioned {
		var viaRoot bool
		if err := conn.QueryRow(ctx, queryPublicationViaRoot, pub).Scan(&viaRoot); err != nil {
			return created, fmt.Errorf("check publish_via_partition_root of publication %q: %w", pub, err)
		}
		if !viaRoot {
			return created, fatal.Errorf("publication %q publishes the partitions of the partitioned table %s.%s under their own names (publish_via_partition_root is off), so the connector would not see their inserts as the outbox's; run: ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pub, schema, table, qpub)
		}
	}
	// A row filter makes pgoutput send nothing for the rows it rejects, and
	// a column list that leaves out a column sends rows without it (the
	// router then misses id or payload): either way the keepalives would
	// confirm past events never published whole. FOR ALL TABLES and FOR
	// TABLES IN SCHEMA publications have neither.
	var rowFilter *string
	var leftOut []string
	err = conn.QueryRow(ctx, queryPublicationTable, pub, schema, table).Scan(&rowFilter, &leftOut)
	if errors.Is(err, pgx.ErrNoRows) {
		return created, fatal.Errorf("publication %q does not include %s.%s; run: ALTER PUBLICATION %s ADD TABLE %s;", pub, schema, table, qpub, qtable)
	}
	if err != nil {
		return created, fmt.Errorf("check publication %q for %s.%s: %w", pub, schema, table, err)
	}
	var what string
	switch {
	case rowFilter != nil:
		what = fmt.Sprintf("publishes %s.%s with a row filter (WHERE %s): PostgreSQL never sends the events it rejects", schema, table, *rowFilter)
	case len(leftOut) > 0:
		what = fmt.Sprintf("publishes %s.%s with a column list that leaves out %s: PostgreSQL sends its events without them", schema, table, strings.Join(leftOut, ", "))
	default:
		return created, nil
	}
	return created, fatal.Errorf("publication %q %s, and the connector would confirm past them. "+
		"Publish the whole table: ALTER PUBLICATION %s SET TABLE %s; (SET TABLE replaces the publication's list of tables: if it publishes other tables too, list them after it, as they are). "+
		"PostgreSQL decodes each transaction with the publication as it was when the transaction was written, so events written before the fix stay filtered in the slot; they are still in the outbox table",
		pub, what, qpub, qtable)
}

// missingPublication is the error for a publication that is missing for a
// slot that exists (at the start, or at a point of the WAL the stream
// reached): confirmed is the position up to which everything is published
// (the slot's confirmed position, or what the stream acked); create is the
// statement that makes the publication.
func missingPublication(slot, pub string, confirmed uint64, create string) error {
	return fatal.Errorf("publication %q does not exist for changes that replication slot %q still has to send after %s: it was dropped, or created after the slot. "+
		"PostgreSQL decodes each change with the publication as it was when the change was written, so changes written while it was missing cannot be read through it, and creating it now does not bring them back "+
		"(PostgreSQL 13 to 17 fail the stream at the first of them, 18 skips them without an error); the connector stopped before confirming any of them, and creates a publication only together with a new slot. "+
		"Events written since %s may be in the outbox table only. The way out: drop the slot (SELECT pg_drop_replication_slot('%s');) and start the connector once with OUTBOX_ACCEPT_SLOT_RESET=true: "+
		"it creates the publication, then a new slot, and publishes the rows the outbox table holds as the initial snapshot (OUTBOX_SNAPSHOT=initial, the default): those published before are published again (duplicates), and events already deleted from the table are not recovered; check for them. "+
		"If nothing was written to the database while it was missing, creating it again (%s) is enough; if something was, the stream stops at it with this error",
		pub, slot, FormatLSN(confirmed), FormatLSN(confirmed), slot, create)
}

// CreateSlot creates the logical slot with pgoutput on the replication
// connection, exporting a snapshot when export is true, as a failover slot
// when failover is true (PostgreSQL 17+). The snapshot stays valid only
// until the next command on rconn.
func CreateSlot(ctx context.Context, rconn *pgconn.PgConn, slot string, export, failover bool) (consistent uint64, snapshot string, err error) {
	action := "NOEXPORT_SNAPSHOT"
	if export {
		action = "EXPORT_SNAPSHOT"
	}
	var res pglogrepl.CreateReplicationSlotResult
	if failover {
		// pglogrepl's command has no options list: FAILOVER needs the
		// parenthesised syntax (PostgreSQL 15+), which 17 accepts it in.
		snap := "nothing"
		if export {
			snap = "export"
		}
		res, err = pglogrepl.ParseCreateReplicationSlot(rconn.Exec(ctx,
			fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s', FAILOVER true)", pgx.Identifier{slot}.Sanitize(), snap)))
	} else {
		res, err = pglogrepl.CreateReplicationSlot(ctx, rconn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
			Mode:           pglogrepl.LogicalReplication,
			SnapshotAction: action,
		})
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return 0, "", fatal.Errorf("slot %q does not exist and this role may not create it (%s). Grant REPLICATION (ALTER ROLE <role> REPLICATION) or create it: SELECT pg_create_logical_replication_slot('%s', 'pgoutput');", slot, pgErr.Message, slot)
		}
		return 0, "", fmt.Errorf("create replication slot %q: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, "", fmt.Errorf("parse consistent point %q: %w", res.ConsistentPoint, err)
	}
	return uint64(lsn), res.SnapshotName, nil
}

// SetFailover makes an existing slot a failover slot (PostgreSQL 17+;
// ALTER_REPLICATION_SLOT needs the slot free).
func SetFailover(ctx context.Context, rconn *pgconn.PgConn, slot string) error {
	if _, err := rconn.Exec(ctx, fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER true)", pgx.Identifier{slot}.Sanitize())).ReadAll(); err != nil {
		return fmt.Errorf("make slot %q a failover slot (ALTER_REPLICATION_SLOT): %w", slot, err)
	}
	return nil
}

// What PostgreSQL holds a walsender for. Two waits of the server hold the
// connector with no word on the replication connection, which is busy in
// the command waited on: CREATE_REPLICATION_SLOT waits until every
// transaction that was running when it began, and holds a transaction id,
// has ended (a forgotten prepared transaction, or a session idle in
// transaction, holds it for ever); and on PostgreSQL 17+ the walsender of a
// failover slot sends no change the physical standbys named in
// synchronized_standby_slots have not confirmed (a standby stopped, or its
// slot unused, holds the stream for ever). A second, ordinary connection
// sees both by the walsender's wait event (pg_stat_activity): Lock /
// transactionid, the transaction waited on being in pg_locks; and
// WaitForStandbyConfirmation. The wait event is the walsender's own word
// for why it waits; the standbys' positions alone could not tell whether
// it has anything to send. They are read to say what to repair, and a
// standby that confirms more WAL between two looks is progress: the
// hold's clock starts again (a healthy standby makes the walsender wait a
// moment at every commit).

// HoldKind is what PostgreSQL holds a walsender for.
type HoldKind string

const (
	// HoldTransactions: creating a slot, the walsender waits for the
	// transactions running when it began to end.
	HoldTransactions HoldKind = "transactions"
	// HoldStandby: streaming a failover slot, the walsender waits for the
	// standbys of synchronized_standby_slots to confirm the WAL.
	HoldStandby HoldKind = "standby"
)

// Blocker is a transaction a slot being created waits for.
type Blocker struct {
	// GID names a prepared transaction, PID a session's backend.
	GID string
	PID int32
	XID string
	// Age is how long ago it was prepared, or its session's transaction
	// began (0: not shown to this role, which sees other roles' sessions
	// whole only with pg_read_all_stats).
	Age time.Duration
	// User is a prepared transaction's owner or a session's user;
	// Application and State (idle in transaction, active...) a session's.
	User, Application, State string
	// Now: the walsender waits on this one at the moment (pg_locks); the
	// others were running when the command began and may come next.
	Now bool
}

// StandbySlot is a slot synchronized_standby_slots names.
type StandbySlot struct {
	Name           string
	Exists, Active bool // Active: a standby streams from it
	WALStatus      string
	// Confirmed is the WAL its standby confirmed (restart_lsn); Behind
	// how far the primary's flushed WAL is past that, in bytes (-1:
	// unknown).
	Confirmed uint64
	Behind    int64
}

// Hold is what a look saw PostgreSQL hold a walsender for.
type Hold struct {
	Kind HoldKind // "": nothing
	// Since is when the wait began: the command's start (transactions),
	// or the first look that saw the standbys hold it with no progress
	// (standby).
	Since    time.Time
	Slot     string
	Blockers []Blocker
	Standbys []StandbySlot
}

// maxNamed bounds the transactions or standbys a hold's reason names.
const maxNamed = 5

// Reason says what the walsender waits for, for how long at now, and what
// ends the wait.
func (h Hold) Reason(now time.Time) string {
	var b strings.Builder
	d := now.Sub(h.Since).Round(time.Second)
	switch h.Kind {
	case HoldTransactions:
		fmt.Fprintf(&b, "creating replication slot %q has waited %s for the transactions that were running when it began to end (CREATE_REPLICATION_SLOT waits for every one holding a transaction id)", h.Slot, d)
		if len(h.Blockers) == 0 {
			b.WriteString(": the one it waits on is not shown (a subtransaction's, or it ended just now)")
		}
		for i, x := range h.Blockers {
			if i == maxNamed {
				fmt.Fprintf(&b, "; and %d more", len(h.Blockers)-i)
				break
			}
			b.WriteString(map[bool]string{true: ": ", false: "; "}[i == 0])
			if x.GID != "" {
				fmt.Fprintf(&b, "prepared transaction %q (xid %s, prepared %s ago, owner %s", x.GID, x.XID, x.Age.Round(time.Second), x.User)
			} else {
				fmt.Fprintf(&b, "session pid %d (xid %s", x.PID, x.XID)
				if x.State != "" {
					fmt.Fprintf(&b, ", %s", x.State)
				}
				if x.Age > 0 {
					fmt.Fprintf(&b, ", its transaction began %s ago", x.Age.Round(time.Second))
				}
				fmt.Fprintf(&b, ", user %s, application %q", x.User, x.Application)
			}
			if x.Now {
				b.WriteString(", waited on now")
			}
			b.WriteString(")")
		}
		b.WriteString(". End them: COMMIT PREPARED or ROLLBACK PREPARED a prepared transaction; commit or roll back a session's, or end the session (SELECT pg_terminate_backend(pid))")
	case HoldStandby:
		fmt.Fprintf(&b, "PostgreSQL has held back the changes of slot %q for %s: its walsender waits for the physical standbys named in synchronized_standby_slots (it is a failover slot) to confirm the WAL, and none confirmed more meanwhile", h.Slot, d)
		for i, s := range h.Standbys {
			if i == maxNamed {
				fmt.Fprintf(&b, "; and %d more", len(h.Standbys)-i)
				break
			}
			b.WriteString(map[bool]string{true: ": ", false: "; "}[i == 0])
			switch {
			case !s.Exists:
				fmt.Fprintf(&b, "%q (no such slot)", s.Name)
			case s.WALStatus == "lost":
				fmt.Fprintf(&b, "%q (invalidated)", s.Name)
			case !s.Active:
				fmt.Fprintf(&b, "%q (no standby streams from it; %s behind)", s.Name, formatBytes(s.Behind))
			default:
				fmt.Fprintf(&b, "%q (%s behind)", s.Name, formatBytes(s.Behind))
			}
		}
		b.WriteString(". Start or repair the standby, or take its slot out of synchronized_standby_slots (ALTER SYSTEM SET synchronized_standby_slots = '...'; SELECT pg_reload_conf())")
	}
	return b.String()
}

// formatBytes writes a size in bytes for people (n < 0: unknown).
func formatBytes(n int64) string {
	switch {
	case n < 0:
		return "an unknown amount"
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// queryWalsenderWait reads what a backend waits on, and how long it has
// run its command (by the server's clock, as every age here):
// pg_stat_get_activity of the one pid, not the whole view. A role sees its
// own backends' wait events, and the walsender is the connector's own.
const queryWalsenderWait = `
SELECT coalesce(wait_event_type, ''), coalesce(wait_event, ''), coalesce(extract(epoch FROM now() - query_start)::float8, 0)
FROM pg_stat_get_activity($1)`

// queryCreateBlockers reads the transactions a walsender ($1) creating a
// slot waits for: the one it waits on now (its ungranted transactionid
// lock), and every other that holds a transaction id and was running when
// its command began. Prepared transactions (pid 0) and sessions of any
// database: the snapshot waits for the whole cluster's. backend_xid and
// the user are shown to every role; a session's start and state only to
// its own role or pg_read_all_stats (otherwise it is named only when
// waited on now). Oldest first.
const queryCreateBlockers = `
WITH waited AS (SELECT transactionid AS xid FROM pg_locks WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted),
     began AS (SELECT query_start FROM pg_stat_get_activity($1))
SELECT x.gid, 0, x.transaction::text, extract(epoch FROM now() - x.prepared)::float8, x.owner::text, '', '',
       x.transaction IN (SELECT xid FROM waited)
FROM pg_prepared_xacts x
WHERE x.transaction IN (SELECT xid FROM waited) OR x.prepared <= (SELECT query_start FROM began)
UNION ALL
SELECT '', a.pid, a.backend_xid::text, coalesce(extract(epoch FROM now() - a.xact_start)::float8, 0),
       coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(a.state, ''),
       a.backend_xid IN (SELECT xid FROM waited)
FROM pg_stat_activity a
WHERE a.backend_xid IS NOT NULL AND a.pid <> $1
  AND (a.backend_xid IN (SELECT xid FROM waited) OR a.xact_start <= (SELECT query_start FROM began))
ORDER BY 4 DESC`

// queryStandbySlots reads the slots synchronized_standby_slots names
// (PostgreSQL 17+; read with missing_ok, so none before) and how far the
// primary's flushed WAL is past what each standby confirmed. Asked only
// when a walsender waits for them, which only a primary's does.
const queryStandbySlots = `
SELECT n.name, s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
       coalesce(s.restart_lsn, '0/0'::pg_lsn)::text,
       coalesce(pg_wal_lsn_diff(pg_current_wal_flush_lsn(), s.restart_lsn)::bigint, -1)
FROM unnest(string_to_array(replace(coalesce(current_setting('synchronized_standby_slots', true), ''), ' ', ''), ',')) WITH ORDINALITY AS n(name, i)
LEFT JOIN pg_replication_slots s ON s.slot_name = n.name
WHERE n.name <> ''
ORDER BY n.i`

// WalsenderWatch looks, on an ordinary connection, at what PostgreSQL
// holds a walsender for (see Hold), and says it: the hold to Held at every
// look, a warning in the log once it lasted WarnAfter and again every
// WarnEvery, a line when it ends.
type WalsenderWatch struct {
	// DB is an ordinary connection (a pool): never the replication
	// connection, which is busy in the command waited on.
	DB Querier
	// PID is the walsender: the replication connection's backend.
	PID  uint32
	Slot string
	Log  *slog.Logger
	// Every is how often it looks (default 1 s); WarnAfter how long a
	// hold lasts before it is logged (default 5 s), WarnEvery how often
	// it is logged again while it lasts (default 30 s).
	Every, WarnAfter, WarnEvery time.Duration
	// Held is told the hold at every look that sees one, and a zero Hold
	// once it ended and when Run returns.
	Held func(Hold)
}

// Defaults of WalsenderWatch.
const (
	holdEvery     = time.Second
	holdWarnAfter = 5 * time.Second
	holdWarnEvery = 30 * time.Second
	// holdMisses is how many looks in a row must not see a hold for it
	// to end: between two transactions waited on, or two waits for the
	// standbys, the walsender is awake for a moment.
	holdMisses = 2
)

// Run looks until ctx ends. A look that fails (the database unreachable:
// the session fails too) is said at warn level once, and the last hold
// seen stands until a look succeeds.
func (w *WalsenderWatch) Run(ctx context.Context) error {
	every, warnAfter, warnEvery := cmp.Or(w.Every, holdEvery), cmp.Or(w.WarnAfter, holdWarnAfter), cmp.Or(w.WarnEvery, holdWarnEvery)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var cur Hold
	var warned time.Time
	misses, failing := 0, false
	defer func() {
		if cur.Kind != "" {
			w.held(Hold{})
		}
	}()
	for {
		h, err := w.look(ctx)
		now := time.Now()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !failing {
				w.Log.Warn("cannot see what PostgreSQL holds the replication connection for (slot creation, synchronized_standby_slots); looking again", "walsender_pid", w.PID, "err", err)
			}
			failing = true
		case h.Kind == "":
			failing = false
			if cur.Kind == "" {
				break
			}
			if misses++; misses < holdMisses {
				break
			}
			if !warned.IsZero() {
				w.Log.Info("PostgreSQL no longer holds the replication connection", "for", string(cur.Kind), "slot", w.Slot, "held", now.Sub(cur.Since).Round(time.Second))
			}
			cur, warned = Hold{}, time.Time{}
			w.held(cur)
		default:
			failing, misses = false, 0
			switch {
			case h.Kind != cur.Kind:
				warned = time.Time{}
			case h.Kind == HoldStandby && minConfirmed(h.Standbys) == minConfirmed(cur.Standbys):
				h.Since = cur.Since
			}
			if h.Since.IsZero() {
				h.Since = now
			}
			cur = h
			w.held(cur)
			if now.Sub(cur.Since) >= warnAfter && now.Sub(warned) >= warnEvery {
				warned = now
				w.Log.Warn(cur.Reason(now), "for", string(cur.Kind), "slot", w.Slot, "walsender_pid", w.PID)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (w *WalsenderWatch) held(h Hold) {
	if w.Held != nil {
		w.Held(h)
	}
}

// look reads what PostgreSQL holds the walsender for now.
func (w *WalsenderWatch) look(ctx context.Context) (Hold, error) {
	ctx, cancel := context.WithTimeout(ctx, partitionLookupTimeout)
	defer cancel()
	var typ, event string
	var running float64
	err := w.DB.QueryRow(ctx, queryWalsenderWait, int32(w.PID)).Scan(&typ, &event, &running)
	if errors.Is(err, pgx.ErrNoRows) {
		return Hold{}, nil // ended
	}
	if err != nil {
		return Hold{}, fmt.Errorf("read what walsender %d waits on: %w", w.PID, err)
	}
	h := Hold{Slot: w.Slot}
	switch {
	case typ == "Lock" && event == "transactionid":
		h.Kind = HoldTransactions
		h.Since = time.Now().Add(-time.Duration(running * float64(time.Second)))
		h.Blockers, err = createBlockers(ctx, w.DB, w.PID)
	case event == "WaitForStandbyConfirmation":
		h.Kind = HoldStandby
		h.Standbys, err = standbySlots(ctx, w.DB)
	}
	return h, err
}

// createBlockers reads the transactions walsender pid, creating a slot,
// waits for (queryCreateBlockers).
func createBlockers(ctx context.Context, q Querier, pid uint32) ([]Blocker, error) {
	rows, err := q.Query(ctx, queryCreateBlockers, int32(pid))
	if err != nil {
		return nil, fmt.Errorf("read the transactions slot creation waits for: %w", err)
	}
	var out []Blocker
	for rows.Next() {
		var x Blocker
		var age float64
		if err := rows.Scan(&x.GID, &x.PID, &x.XID, &age, &x.User, &x.Application, &x.State, &x.Now); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the transactions slot creation waits for: %w", err)
		}
		x.Age = time.Duration(age * float64(time.Second))
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the transactions slot creation waits for: %w", err)
	}
	return out, nil
}

// standbySlots reads the slots of synchronized_standby_slots
// (queryStandbySlots).
func standbySlots(ctx context.Context, q Querier) ([]StandbySlot, error) {
	rows, err := q.Query(ctx, queryStandbySlots)
	if err != nil {
		return nil, fmt.Errorf("read the slots of synchronized_standby_slots: %w", err)
	}
	var out []StandbySlot
	for rows.Next() {
		var s StandbySlot
		var confirmed string
		if err := rows.Scan(&s.Name, &s.Exists, &s.Active, &s.WALStatus, &confirmed, &s.Behind); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the slots of synchronized_standby_slots: %w", err)
		}
		lsn, _ := pglogrepl.ParseLSN(confirmed)
		s.Confirmed = uint64(lsn)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the slots of synchronized_standby_slots: %w", err)
	}
	return out, nil
}

// minConfirmed is the least WAL position the standbys confirmed: the one
// the walsender waits for (0 for none, or a slot missing).
func minConfirmed(s []StandbySlot) uint64 {
	var m uint64
	for i, x := range s {
		if i == 0 || x.Confirmed < m {
			m = x.Confirmed
		}
	}
	return m
}

// FormatLSN writes an LSN as PostgreSQL does.
func FormatLSN(lsn uint64) string { return pglogrepl.LSN(lsn).String() }
