// Package partition maintains the daily-partitioned outbox of
// sql/variants/outbox_partitioned.sql: it creates the coming days' partitions
// and drops the partitions whose whole day is older than the retention.
// Dropping a partition is a catalog change that takes a moment's lock, where
// deleting the same rows one by one would write WAL for each, leave dead
// tuples and keep vacuum busy.
//
// Partitions are UTC days named <table>_pYYYYMMDD; partitions with other
// names (the DEFAULT partition, a partition an operator made by hand) are
// never dropped. On an outbox prepared for the poll relay
// (sql/variants/outbox_poll.sql), an expired partition that holds a row not
// published yet (published_at NULL) is kept, and reported, until the row
// is published: the check is made in the drop's transaction, under an
// ACCESS EXCLUSIVE lock on the partition, so a row written into that day
// while maintenance runs is either committed before the check, which sees
// it, or waits for the drop and then goes to DEFAULT (whose expired rows
// are deleted only once published): never dropped unseen.
//
// Maintenance never queues writers behind it for long. A drop takes
// ACCESS EXCLUSIVE on the outbox, and a lock request that waits (for a
// long transaction that read the outbox, which holds ACCESS SHARE until it
// ends) makes every INSERT wait behind it. So each lock request waits at
// most 50 ms, then leaves the queue and is made again after a pause
// (jittered, growing to about a second) until LockTimeout is spent: an
// INSERT waits at most about 50 ms behind maintenance, plus the DROP
// itself, a catalog change of a moment. A step whose locks are not granted
// in LockTimeout fails for this run, naming the lock and the usual holder,
// a long transaction on the outbox; the next run retries it. (DETACH
// PARTITION ... CONCURRENTLY, which writers would not wait for, is refused
// on a table with a DEFAULT partition.)
//
// A row written for a day that has no partition lands in the DEFAULT
// partition, and PostgreSQL then refuses to create that day's partition
// (SQLSTATE 23514: the DEFAULT partition's new constraint would be violated).
// Maintain therefore makes each new partition as a standalone table, moves
// the day's DEFAULT rows into it and attaches it, in one transaction: the
// rows are never in two places nor in none. The move publishes nothing,
// under any publication (FOR TABLE, FOR TABLES IN SCHEMA, FOR ALL TABLES):
// the table is UNLOGGED while the rows go in, which logical decoding never
// sees, and is made logged (a rewrite, which decoding skips) before it is
// attached, so the connector neither delivers the moved events again nor
// stops at inserts named by the new partition. This is decoding's
// behaviour, proved on PostgreSQL 13 to 18; on another major a move that a
// FOR ALL TABLES or FOR TABLES IN SCHEMA publication could publish is
// refused (that day's create fails with the reason, its rows stay in
// DEFAULT, the rest of maintenance goes on). Attaching takes a SHARE UPDATE
// EXCLUSIVE lock on the parent, which writers do not wait for, and ACCESS
// EXCLUSIVE on the DEFAULT partition, requested as above and held at most
// MoveTimeout. DEFAULT rows whose day expired are deleted like a dropped
// partition's.
//
// Writers: while a move holds the DEFAULT partition, a transaction writing
// a row for a day without a partition waits, and a row of the day being
// moved then fails with SQLSTATE 23514 (it no longer belongs in DEFAULT),
// its transaction rolled back whole: retry it, and the row goes into the
// new partition. Writers of days that have their partition do not wait. A
// move lasts about as long as its rows take to write twice (roughly 15 s
// per million rows of 300 bytes on a small test machine); a day whose rows
// do not fit in MoveTimeout is rolled back at every run and stays in
// DEFAULT until it expires or a run with a longer MoveTimeout moves it.
package partition

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// DB is what Maintain needs: *pgx.Conn and *pgxpool.Pool have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config says what Maintain keeps.
type Config struct {
	// Table is the partitioned outbox, "schema.name" (default "public.outbox").
	Table string
	// Retention: a partition is dropped once its day ended more than
	// Retention ago (default 72h). Keep it longer than the relay's worst lag
	// if the rows are to stay readable during an incident; events are never
	// lost by a drop (the relay reads them from the WAL). A row lives up to
	// Retention plus its day (plus the time between runs), and the
	// connector's initial snapshot republishes every row still there: the
	// consumers' inbox must keep ids longer than that plus the topic's
	// retention (inbox.Window.OutboxRows; 96h with this default).
	Retention time.Duration
	// Ahead is the number of days after today to create (default 2), so
	// that a maintenance run that fails for a day does not send inserts to
	// the DEFAULT partition.
	Ahead int
	// LockTimeout bounds how long each step (a creation, a drop, a batch of
	// expired DEFAULT rows) tries to get its locks (default 5s): each
	// request waits at most 50 ms, which is thus the longest a writer
	// queues behind it, and is made again after a pause, jittered and
	// growing to about a second, until LockTimeout is spent; then the step
	// fails for this run and the next run tries again.
	LockTimeout time.Duration
	// MoveTimeout bounds how long each of maintenance's transactions (a
	// creation with the move of its day's DEFAULT rows, a drop, a batch of
	// expired DEFAULT rows) runs, and so how long it holds its locks: the
	// statements' statement_timeout is what is left of it (default 30s). A
	// transaction cut off is rolled back whole and retried by the next run.
	MoveTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Result lists what Maintain changed.
type Result struct {
	Created []string
	Dropped []string
	// Moved counts the rows moved out of the DEFAULT partition into the
	// partitions created for their days.
	Moved int64
	// DefaultDeleted counts the DEFAULT partition's rows deleted because
	// their day expired (as a dropped partition's rows are).
	DefaultDeleted int64
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (c *Config) defaults() (schema, table string, err error) {
	if c.Table == "" {
		c.Table = "public.outbox"
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) == 1 {
		parts = []string{"public", parts[0]}
	}
	if len(parts) != 2 || !identRE.MatchString(parts[0]) || !identRE.MatchString(parts[1]) {
		return "", "", fmt.Errorf("partition: table %q: want schema.name of plain identifiers", c.Table)
	}
	if c.Retention <= 0 {
		c.Retention = 72 * time.Hour
	}
	if c.Ahead <= 0 {
		c.Ahead = 2
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 5 * time.Second
	}
	if c.MoveTimeout <= 0 {
		c.MoveTimeout = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return parts[0], parts[1], nil
}

// Name is the partition of day (UTC) of table (without schema).
func Name(table string, day time.Time) string {
	return table + "_p" + day.UTC().Format("20060102")
}

const listSQL = `SELECT c.relname
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = $1::regclass`

// Maintain creates the partitions of today and the next Ahead days that are
// missing (moving the rows the DEFAULT partition holds for them), drops the
// expired ones and deletes the DEFAULT partition's expired rows. It is
// idempotent; run it at least daily. A step that fails (a lock not granted
// in time) does not stop the others: every failure is returned, joined, at
// the end, and what was done is in the Result.
func Maintain(ctx context.Context, db DB, cfg Config) (Result, error) {
	schema, table, err := cfg.defaults()
	if err != nil {
		return Result{}, err
	}
	parent := pgx.Identifier{schema, table}.Sanitize()
	existing, err := list(ctx, db, parent)
	if err != nil {
		return Result{}, err
	}
	def, err := defaultPartition(ctx, db, parent)
	if err != nil {
		return Result{}, err
	}
	var res Result
	var errs []error
	today := cfg.Now().UTC().Truncate(24 * time.Hour)
	for i := 0; i <= cfg.Ahead; i++ {
		day := today.AddDate(0, 0, i)
		name := Name(table, day)
		if existing[name] {
			continue
		}
		moved, err := create(ctx, db, cfg, schema, parent, pgx.Identifier{schema, name}.Sanitize(), def, day)
		if err != nil {
			errs = append(errs, fmt.Errorf("partition: create %s: %w", name, err))
			continue
		}
		res.Created = append(res.Created, name)
		res.Moved += moved
	}
	cutoff := cfg.Now().Add(-cfg.Retention)
	var names []string
	for name := range existing {
		names = append(names, name)
	}
	sort.Strings(names)
	prefix := table + "_p"
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) || len(name) != len(prefix)+8 {
			continue
		}
		day, err := time.Parse("20060102", name[len(prefix):])
		if err != nil {
			continue // not one of ours
		}
		if end := day.AddDate(0, 0, 1); !end.Before(cutoff) {
			continue
		}
		switch err := dropExpired(ctx, db, cfg, parent, pgx.Identifier{schema, name}.Sanitize(), def); {
		case errors.Is(err, errGone): // dropped by another run since the list
		case errors.Is(err, errUnpublished):
			errs = append(errs, fmt.Errorf("partition: keep %s: %w", name, err))
		case err != nil:
			errs = append(errs, fmt.Errorf("partition: drop %s: %w", name, err))
		default:
			res.Dropped = append(res.Dropped, name)
		}
	}
	if def != "" {
		n, err := deleteExpiredDefault(ctx, db, cfg, def, expiredBefore(cutoff))
		res.DefaultDeleted = n
		if err != nil {
			errs = append(errs, fmt.Errorf("partition: delete expired rows of the DEFAULT partition %s: %w", def, err))
		}
	}
	return res, errors.Join(errs...)
}

// expiredBefore is the start of the first day that has not expired at
// cutoff: a day expires once its end is before cutoff, as for a partition.
func expiredBefore(cutoff time.Time) time.Time {
	x := cutoff.UTC().Add(-24 * time.Hour)
	b := x.Truncate(24 * time.Hour)
	if b.Before(x) {
		b = b.Add(24 * time.Hour)
	}
	return b
}

const defaultSQL = `SELECT n.nspname, c.relname
FROM pg_partitioned_table p
JOIN pg_class c ON c.oid = p.partdefid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.partrelid = $1::regclass`

// defaultPartition is the quoted name of parent's DEFAULT partition, "" when
// it has none.
func defaultPartition(ctx context.Context, db DB, parent string) (string, error) {
	rows, err := db.Query(ctx, defaultSQL, parent)
	if err != nil {
		return "", fmt.Errorf("partition: look up the DEFAULT partition of %s: %w", parent, err)
	}
	names, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var schema, name string
		err := r.Scan(&schema, &name)
		return pgx.Identifier{schema, name}.Sanitize(), err
	})
	if err != nil || len(names) == 0 {
		if err != nil {
			err = fmt.Errorf("partition: look up the DEFAULT partition of %s: %w", parent, err)
		}
		return "", err
	}
	return names[0], nil
}

// create makes the partition of day as a standalone table, moves the
// DEFAULT partition's rows of that day into it and attaches it, in one
// transaction, and returns how many rows it moved.
//
// CREATE TABLE ... PARTITION OF would fail over such rows (23514), and
// would hold an ACCESS EXCLUSIVE lock on the parent, which every writer
// waits for, while it scans the DEFAULT partition. ATTACH PARTITION holds
// SHARE UPDATE EXCLUSIVE on the parent instead; the ACCESS EXCLUSIVE lock
// on the DEFAULT partition (which ATTACH needs for its scan) is taken first,
// so no row for the day can slip into DEFAULT between the move and the
// attach. The parent is locked before the DEFAULT partition, in the order
// ATTACH itself locks them, so two maintenance runs cannot deadlock.
// Neither request makes writers of days that have their partition wait;
// the DEFAULT one makes writers of partition-less days (whose rows go to
// DEFAULT) queue behind it, for one attempt at most (see lockAttempt),
// and then wait for the move while it holds DEFAULT.
//
// The move must publish nothing, under any publication. A standalone table
// in the outbox's schema is published by FOR ALL TABLES and FOR TABLES IN
// SCHEMA publications under its own name, and the connector stops at an
// insert named by a partition of the outbox (every restart reads it
// again); on 13 and 14 even a FOR TABLE publication is hurt, since pgoutput
// caches "not published" for the table and keeps sending nothing for it
// after the attach, until the walsender restarts. So the table is made
// UNLOGGED, which logical decoding never sees (no WAL for its rows, and no
// publication includes it), the rows are moved into it, and SET LOGGED then
// copies it into a new, logged heap, which decoding skips as a table
// rewrite (pg_class.relrewrite), as for VACUUM FULL or CLUSTER. Only then
// is it attached: the first change decoded for it is a writer's, through
// the parent. SET LOGGED takes ACCESS EXCLUSIVE on the new table alone,
// which nobody else can see before commit; the copy counts against
// MoveTimeout like the move. TestMaintainMovePublishesNothing proves this
// on 13 to 18; on another major (see verifiedMajors) a move under a
// publication that would publish the table is refused instead.
func create(ctx context.Context, db DB, cfg Config, schema, parent, part, def string, day time.Time) (moved int64, err error) {
	from, to := day.Format("2006-01-02 15:04:05Z07:00"), day.AddDate(0, 0, 1).Format("2006-01-02 15:04:05Z07:00")
	err = inTx(ctx, db, cfg, func(step stepFunc, query queryFunc) error {
		if _, err := step("LOCK TABLE ONLY " + parent + " IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
			return err
		}
		if def == "" {
			// EXCLUDING IDENTITY: a partition takes the parent's identity
			// (poll mode's seq, PostgreSQL 17+) when attached, and one that
			// has its own cannot be attached.
			if _, err := step("CREATE TABLE " + part + " (LIKE " + parent + " INCLUDING ALL EXCLUDING IDENTITY)"); err != nil {
				return err
			}
		} else {
			if _, err := step("LOCK TABLE ONLY " + def + " IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			if err := refuseUnverifiedMove(query, schema, parent, part, def, from, to, day); err != nil {
				return err
			}
			if _, err := step("CREATE UNLOGGED TABLE " + part + " (LIKE " + parent + " INCLUDING ALL EXCLUDING IDENTITY)"); err != nil {
				return err
			}
			cols, err := movedColumns(query, parent)
			if err != nil {
				return err
			}
			tag, err := step(`WITH moved AS (DELETE FROM `+def+` WHERE created_at >= $1 AND created_at < $2 RETURNING `+cols+`)
INSERT INTO `+part+` (`+cols+`) SELECT `+cols+` FROM moved`, from, to)
			if err != nil {
				return fmt.Errorf("move the DEFAULT partition's rows of the day: %w", err)
			}
			moved = tag.RowsAffected()
			if _, err := step("ALTER TABLE " + part + " SET LOGGED"); err != nil {
				return fmt.Errorf("make the partition logged after the move: %w", err)
			}
		}
		_, err := step(fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')", parent, part, from, to))
		return err
	})
	if err != nil {
		return 0, err
	}
	return moved, nil
}

// movedColumnsSQL lists the parent's columns an INSERT may set, quoted, in
// its order: not dropped, not generated (computed again in the new
// partition).
const movedColumnsSQL = `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)
FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''`

// movedColumns is the column list of the move. The DEFAULT partition's
// columns need not be in the parent's order (a table attached as DEFAULT
// keeps its own), and INSERT ... SELECT * maps them by position: two
// varchar columns swapped, aggregatetype and aggregateid, would move every
// row with the two exchanged, silently.
func movedColumns(query queryFunc, parent string) (string, error) {
	rows, err := query(movedColumnsSQL, parent)
	if err != nil {
		return "", fmt.Errorf("list the columns of %s: %w", parent, err)
	}
	cols, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[*string])
	if err != nil || cols == nil {
		if err == nil {
			err = errors.New("none an INSERT may set")
		}
		return "", fmt.Errorf("list the columns of %s: %w", parent, err)
	}
	return *cols, nil
}

// verifiedMajors are the PostgreSQL majors on which the move is proved to
// publish nothing (TestMaintainMovePublishesNothing): the UNLOGGED table
// and the skipped rewrite are decoding's behaviour, not a documented
// promise, so on another major a move that a publication could publish is
// refused rather than trusted.
var verifiedMajors = [2]int{13, 18}

const serverVersionSQL = `SELECT current_setting('server_version_num')::int`

// coveringPublicationsSQL lists the publications that would publish a new
// table in schema $1 by themselves: FOR ALL TABLES, and (15 and later) FOR
// TABLES IN SCHEMA.
const coveringPublicationsSQL = `SELECT pubname, 'FOR ALL TABLES' FROM pg_publication WHERE puballtables
UNION ALL
SELECT p.pubname, 'FOR TABLES IN SCHEMA ' || quote_ident(n.nspname)
FROM pg_publication p
JOIN pg_publication_namespace pn ON pn.pnpubid = p.oid
JOIN pg_namespace n ON n.oid = pn.pnnspid
WHERE n.nspname = $1
ORDER BY 1`

const coveringPublicationsSQL14 = `SELECT pubname, 'FOR ALL TABLES' FROM pg_publication WHERE puballtables AND $1::text IS NOT NULL ORDER BY 1`

// refuseUnverifiedMove returns an error when the server is not of a
// verified major, DEFAULT holds rows of the day, and a publication would
// publish the new table by itself: the day's partition is then not
// created, its rows stay in DEFAULT (found by readers, deleted when their
// day expires) and the rest of maintenance goes on.
func refuseUnverifiedMove(query queryFunc, schema, parent, part, def, from, to string, day time.Time) error {
	rows, err := query(serverVersionSQL)
	if err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	version, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	if err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	major := version / 10000
	if major >= verifiedMajors[0] && major <= verifiedMajors[1] {
		return nil
	}
	if rows, err = query(`SELECT EXISTS (SELECT 1 FROM `+def+` WHERE created_at >= $1 AND created_at < $2)`, from, to); err != nil {
		return fmt.Errorf("look for the DEFAULT partition's rows of the day: %w", err)
	}
	if held, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool]); err != nil || !held {
		if err != nil {
			err = fmt.Errorf("look for the DEFAULT partition's rows of the day: %w", err)
		}
		return err
	}
	sqlText := coveringPublicationsSQL
	if version < 150000 {
		sqlText = coveringPublicationsSQL14
	}
	if rows, err = query(sqlText, schema); err != nil {
		return fmt.Errorf("list the publications: %w", err)
	}
	pubs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var name, kind string
		err := r.Scan(&name, &kind)
		return fmt.Sprintf("%q (%s)", name, kind), err
	})
	if err != nil {
		return fmt.Errorf("list the publications: %w", err)
	}
	if len(pubs) == 0 {
		return nil
	}
	return fmt.Errorf("not moving the DEFAULT partition's rows of %s: on PostgreSQL %d the move is not verified to publish nothing (verified on %d to %d), "+
		"and publication %s would publish a new table %s by itself, so the moved rows could reach the connector as inserts into a partition, which stops it; "+
		"the rows stay in %s (readable through %s, deleted once their day expires) and so do new rows of the day. "+
		"Publish only the outbox (a FOR TABLE %s publication with publish_via_partition_root = true, as sql/variants/outbox_partitioned.sql makes), "+
		"and maintenance moves them at its next run",
		day.Format("2006-01-02"), major, verifiedMajors[0], verifiedMajors[1], strings.Join(pubs, ", "), part, def, parent, parent)
}

// errUnpublished is why dropExpired keeps a partition.
var errUnpublished = errors.New("it holds rows a poll-mode relay has not published yet (published_at NULL); it is dropped once they are")

// errGone: the partition dropExpired was to drop no longer exists (another
// maintenance run dropped it since this one listed the partitions).
var errGone = errors.New("no longer exists")

// dropExpired drops part, an expired partition of parent (def is parent's
// DEFAULT partition, "" when none), unless it holds rows a poll-mode relay
// has not published yet (errUnpublished).
//
// The check for such rows and the drop are one transaction, the check made
// under an ACCESS EXCLUSIVE lock on part. Checked outside it, this happened:
// a writer's transaction inserts a row dated in the expired day (still
// uncommitted, the check cannot see it); the check finds no unpublished
// row; the writer commits; the drop takes the row, the event's only copy,
// with it. An insert (and the relay's UPDATE of published_at) holds ROW
// EXCLUSIVE on the partition until its transaction ends, so the lock is
// granted only once the inserts in flight have committed, and the check
// sees their rows, or rolled back. A later one waits for the drop, and then
// routes its row to DEFAULT, or, if it holds the parent already, makes this
// attempt give up (below) and goes first.
//
// The locks are taken in this order, each its own statement so that each
// wait is one attempt's (see lockAttempt) and is named when it fails:
//  1. part: the check, which may read the partition (through the poll
//     variant's index on unpublished rows when there is one), holds only
//     that expired day, which no writer of the current days needs.
//  2. parent: DROP of a partition takes ACCESS EXCLUSIVE on the parent,
//     which every writer needs (INSERT takes ROW EXCLUSIVE on it), held
//     only for the DROP itself, a catalog change of a moment.
//  3. def: DROP locks the DEFAULT partition after the parent (its implicit
//     constraint changes), as create and ATTACH lock them; without a wait,
//     so that writers wait for one attempt's lock request at most, plus
//     the DROP.
//
// Part before parent is the reverse of an inserter's order (the parent,
// then the partition its row is routed to): an inserter of the expired day
// that holds the parent and waits for part, while the drop waits for the
// parent, is a cycle that the attempt's lock timeout ends, well before
// deadlock_timeout; the attempt is rolled back, the insert goes on, and the
// next attempt's check sees its row.
//
// DETACH PARTITION ... CONCURRENTLY would take only SHARE UPDATE EXCLUSIVE
// on the parent, which writers never wait for, but PostgreSQL refuses it on
// a table with a DEFAULT partition ("cannot detach partitions concurrently
// when a default partition exists", SQLSTATE 55000, checked by
// TestMaintainDoesNotQueueWriters), which sql/variants/outbox_partitioned.sql
// creates; it cannot run in a transaction block either, so the check could
// not share its transaction. Short, retried lock attempts bound the writers'
// wait instead.
func dropExpired(ctx context.Context, db DB, cfg Config, parent, part, def string) error {
	return inTx(ctx, db, cfg, func(step stepFunc, query queryFunc) error {
		if _, err := step("LOCK TABLE ONLY " + part + " IN ACCESS EXCLUSIVE MODE"); err != nil {
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" {
				return errGone
			}
			return err
		}
		if pending, err := unpublished(query, part); err != nil || pending {
			if err == nil {
				err = errUnpublished
			}
			return err
		}
		if _, err := step("LOCK TABLE ONLY " + parent + " IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		if def != "" {
			// NOWAIT: every writer waits while the parent is held. Once it
			// is, nobody who goes through the parent holds DEFAULT (they
			// all ended before the parent was granted), so DEFAULT is free
			// but for a session that locked it by name; that makes this
			// attempt give up at once instead of holding the parent for
			// another wait.
			if _, err := step("LOCK TABLE ONLY " + def + " IN ACCESS EXCLUSIVE MODE NOWAIT"); err != nil {
				return err
			}
		}
		_, err := step("DROP TABLE " + part)
		return err
	})
}

// unpublished reports whether the partition part (quoted) holds rows a
// poll-mode relay has not published yet: on a table prepared for poll mode
// (sql/variants/outbox_poll.sql adds published_at) the table is the only
// copy of an event until then, so dropping the partition would lose it.
func unpublished(query queryFunc, part string) (bool, error) {
	exists := func(q string, args ...any) (bool, error) {
		rows, err := query(q, args...)
		if err != nil {
			return false, fmt.Errorf("look for unpublished rows in %s: %w", part, err)
		}
		has, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
		if err != nil {
			return false, fmt.Errorf("look for unpublished rows in %s: %w", part, err)
		}
		return has, nil
	}
	has, err := exists(`SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'published_at' AND NOT attisdropped)`, part)
	if err != nil || !has {
		return false, err
	}
	return exists(`SELECT EXISTS (SELECT 1 FROM ` + part + ` WHERE published_at IS NULL)`)
}

// deleteExpiredBatch is the DEFAULT partition's expired rows per DELETE.
const deleteExpiredBatch = 10000

// deleteExpiredDefault deletes the rows of def dated before before, in
// batches, each its own transaction. Its DELETE takes ROW EXCLUSIVE on def,
// which writers do not wait for.
func deleteExpiredDefault(ctx context.Context, db DB, cfg Config, def string, before time.Time) (int64, error) {
	// Rows a poll-mode relay has not published yet stay (see unpublished).
	stmt := `DELETE FROM ` + def + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + def + ` d WHERE created_at < $1
	  AND (to_jsonb(d) -> 'published_at') IS DISTINCT FROM 'null'::jsonb LIMIT $2))`
	var total int64
	for {
		var n int64
		err := inTx(ctx, db, cfg, func(step stepFunc, _ queryFunc) error {
			tag, err := step(stmt, before, deleteExpiredBatch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < deleteExpiredBatch {
			return total, nil
		}
	}
}

func list(ctx context.Context, db DB, parent string) (map[string]bool, error) {
	rows, err := db.Query(ctx, listSQL, parent)
	if err != nil {
		return nil, fmt.Errorf("partition: list partitions of %s: %w", parent, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("partition: list partitions of %s: %w", parent, err)
	}
	if len(names) == 0 {
		// Either not partitioned or not yet: say which, for the operator.
		rows, err := db.Query(ctx, "SELECT relkind::text FROM pg_class WHERE oid = $1::regclass", parent)
		if err != nil {
			return nil, fmt.Errorf("partition: look up %s: %w", parent, err)
		}
		kind, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("partition: look up %s: %w", parent, err)
		}
		if kind != "p" {
			return nil, fmt.Errorf("partition: %s is not a partitioned table (apply sql/variants/outbox_partitioned.sql)", parent)
		}
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// stepFunc runs one statement of a maintenance transaction.
type stepFunc func(sql string, args ...any) (pgconn.CommandTag, error)

// queryFunc runs one query of a maintenance transaction, under the same
// timeouts as a step.
type queryFunc func(sql string, args ...any) (pgx.Rows, error)

// lockAttempt is how long each lock request of maintenance waits
// (lock_timeout) before it leaves the queue, to try again after a pause
// (lockRetry) while LockTimeout lasts. A request that waits makes every
// later request that conflicts with it wait behind it: while maintenance
// waits for ACCESS EXCLUSIVE on the outbox (for a drop) or on its DEFAULT
// partition (for a create), every INSERT into it queues too, although its
// ROW EXCLUSIVE lock conflicts only with ours, for as long as a long
// transaction that read the outbox keeps its ACCESS SHARE lock. So
// lockAttempt is the longest a writer waits behind a lock request of
// maintenance. It must still outlast the transactions that hold the table
// when the request is made (those that come later queue behind it): an
// outbox write commits within milliseconds of its INSERT, and the
// transactions around it mostly within a few tens. 50 ms does both: on a
// busy outbox most attempts succeed, and a writer's INSERT waits at most
// 50 ms per attempt. It is also far under deadlock_timeout (1 s by
// default), so that a lock-order cycle with an inserter (see dropExpired)
// ends by our timeout, the writer going first, before the deadlock
// detector picks either.
const lockAttempt = 50 * time.Millisecond

// lockRetry spaces the attempts of one step: 25 to 50 ms after the first,
// then twice as long each time up to 0.5 to 1 s, so that writers run
// freely most of the time while a long transaction blocks maintenance
// (about ten attempts in the default 5 s). The jitter keeps two
// maintenance runs, or a periodic blocker, from falling into step.
func lockRetry() *backoff.ExponentialBackOff {
	return retry.Jittered(50*time.Millisecond, time.Second)
}

// lockNotGranted is a lock request of an attempt that timed out (55P03),
// or that the server ended to break a deadlock (40P01): the attempt's
// transaction is rolled back whole, and another attempt is as safe.
type lockNotGranted struct {
	what string
	err  error
}

func (e *lockNotGranted) Error() string { return e.what + " not granted: " + e.err.Error() }
func (e *lockNotGranted) Unwrap() error { return e.err }

var lockStmtRE = regexp.MustCompile(`^LOCK TABLE ONLY (\S+) IN ([A-Z ]+) MODE( NOWAIT)?$`)

// lockOf names what the statement sql waited for.
func lockOf(sql string) string {
	if m := lockStmtRE.FindStringSubmatch(sql); m != nil {
		return m[2] + " lock on " + m[1]
	}
	if first, _, _ := strings.Cut(sql, "\n"); len(first) > 60 || first != sql {
		sql = first[:min(len(first), 60)] + "…"
	}
	return "a lock for " + sql
}

// inTx runs f in a transaction (see attemptTx), and again in a new one
// while one of its lock requests is not granted within lockAttempt, with
// pauses (lockRetry), until LockTimeout is spent: then it fails for this
// run, naming the lock and the usual holder, and the next run tries again.
// No writer waits behind maintenance for longer than one attempt.
func inTx(ctx context.Context, db DB, cfg Config, f func(step stepFunc, query queryFunc) error) error {
	budget := time.Now().Add(cfg.LockTimeout)
	pauses := lockRetry()
	for attempt := 1; ; attempt++ {
		// lock_timeout 0 would be no limit at all.
		err := attemptTx(ctx, db, cfg, max(min(lockAttempt, time.Until(budget)), time.Millisecond), f)
		var notGranted *lockNotGranted
		if !errors.As(err, &notGranted) {
			return err
		}
		left := time.Until(budget)
		if left <= 0 {
			return fmt.Errorf("%s not granted within %s (LockTimeout; %d attempts of at most %s, so that writers never queued behind one longer): "+
				"a long transaction on the outbox holds a conflicting lock (a session that read or wrote it and has not ended: "+
				"an audit snapshot, a session idle in transaction; see pg_locks, pg_stat_activity); the next run retries: %w",
				notGranted.what, cfg.LockTimeout, attempt, lockAttempt, notGranted.err)
		}
		t := time.NewTimer(min(pauses.NextBackOff(), left))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (while retrying after: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// attemptTx runs f in a transaction whose lock waits are bounded by
// lockWait and whose whole run by MoveTimeout: before each statement, the
// statement_timeout is set to what is left of MoveTimeout, so that the
// server itself cancels a statement that would hold the locks longer (a
// client-side deadline alone would leave the statement running on the
// server after the connection is dropped).
func attemptTx(ctx context.Context, db DB, cfg Config, lockWait time.Duration, f func(step stepFunc, query queryFunc) error) error {
	deadline := time.Now().Add(cfg.MoveTimeout)
	// The client-side deadline is a backstop, a second after the server's.
	tctx, cancel := context.WithDeadline(ctx, deadline.Add(time.Second))
	defer cancel()
	tx, err := db.Begin(tctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(tctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", lockWait.Milliseconds())); err != nil {
		return err
	}
	limit := func() error {
		left := time.Until(deadline).Milliseconds()
		if left < 1 {
			return fmt.Errorf("not done within %s; the next run retries", cfg.MoveTimeout)
		}
		_, err := tx.Exec(tctx, fmt.Sprintf("SET LOCAL statement_timeout = '%dms'", left))
		return err
	}
	step := func(sql string, args ...any) (pgconn.CommandTag, error) {
		if err := limit(); err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := tx.Exec(tctx, sql, args...)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01"):
			return tag, &lockNotGranted{what: lockOf(sql), err: err}
		case errors.As(err, &pgErr) && pgErr.Code == "57014":
			return tag, fmt.Errorf("not done within %s (MoveTimeout), rolled back; the next run retries: %w", cfg.MoveTimeout, err)
		}
		return tag, err
	}
	query := func(sql string, args ...any) (pgx.Rows, error) {
		if err := limit(); err != nil {
			return nil, err
		}
		return tx.Query(tctx, sql, args...)
	}
	if err := f(step, query); err != nil {
		return err
	}
	return tx.Commit(tctx)
}
