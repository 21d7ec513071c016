package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// FormatLSN writes an LSN as PostgreSQL does.
func FormatLSN(lsn uint64) string { return pglogrepl.LSN(lsn).String() }
