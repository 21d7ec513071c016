// Package poll is the table reader of the connector's second kind of relay
// (OUTBOX_SOURCE=poll): it reads unpublished outbox rows from the table
// itself, for databases where a replication slot is not possible, and marks
// them published once Kafka has them.
//
// The design is claim-and-mark, never a cursor. A cursor over a sequence or
// created_at skips a row whose transaction took its value first and
// committed last (watermill #311): the reader has moved past the value by
// the time the row becomes visible. Here every read takes the unpublished
// rows visible now (published_at IS NULL), whatever their sequence value, so
// a late commit is simply read by a later poll. A rolled-back row is never
// visible, so never read.
//
// Competing relays share the table by buckets of the aggregate id: bucket =
// hashtext(key) mod Buckets. Each bucket is owned by at most one reader at a
// time through a session-level advisory lock on the reader's connection, and
// every read and mark of a bucket's rows goes through that connection: when
// the reader's session ends (its process died, the network cut it), the
// server releases the lock, and the reader can no longer mark anything, so
// the next owner reads again what was not marked (at-least-once, stable
// ids). A reader gives a bucket up only between batches, when nothing of it
// is in flight. So the events of one aggregate are published by one reader
// at a time, in the order of the sequence column: where the application
// serialises an aggregate's writes (a row lock, as applications do), a later
// write takes a larger value and commits later, so when it is visible every
// earlier one is visible too (or already marked).
//
// Readers find each other by a second advisory lock each holds (keyed by its
// backend pid), read from pg_locks, and each takes a fair share of the
// buckets: ceil(Buckets/readers).
package poll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/rowsecurity"
)

// Config is what a Reader reads.
type Config struct {
	Schema, Table string
	// Key is the column whose value picks the bucket (the router's
	// table.field.event.key, aggregateid by default).
	Key string
	// ID is the event id column (the router's table.field.event.id, id by
	// default). A mark names each row by its seq and its id: seq alone is
	// not unique after a cutover that kept the rows but not the sequence.
	ID string
	// Buckets is how many buckets the rows are spread over; every reader
	// of a table must use the same number (Open refuses another).
	Buckets int
	// Batch bounds the rows of one read, BatchBytes their size (at least
	// one row is read, whatever its size).
	Batch      int
	BatchBytes int
	// Silence is how long a reader's session may run no statement before
	// the other readers end it (pg_terminate_backend; the same role may),
	// freeing its buckets: a frozen process, or one cut off by a network
	// that the server has not noticed, would keep them for as long as its
	// session lives. A reader runs a statement at least every third of it
	// (see Touch). It also bounds each statement. 0: never.
	Silence time.Duration
}

// ErrNotPrepared says the table, the server or the settings do not allow
// poll mode; its text says what to do.
var ErrNotPrepared = errors.New("poll mode cannot run here")

// ErrNotSession says the connection is not one server session.
var ErrNotSession = errors.New("poll mode needs one server session per connection (its buckets are session advisory locks), but the statements run in different sessions: connect directly or through a session-mode pooler, not a transaction-mode one (PgBouncer pool_mode=transaction)")

// ErrNotMarked says rows could not be marked published although the
// UPDATE succeeded: something in the database discards it.
var ErrNotMarked = errors.New("poll mode could not mark rows published: the UPDATE of published_at changed fewer rows than it was given, with no error; a row-level security policy without UPDATE, a BEFORE UPDATE trigger returning NULL or a rule discards it, and every row would be published again and again. Let the relay's role update published_at")

// ErrMarkedMore says a mark would have changed more rows than the batch
// read: rows share their seq and id (a copy loaded twice). Nothing is
// marked; publishing on could mark a row never read.
var ErrMarkedMore = errors.New("poll mode: a mark would change more rows than were read, so rows share their seq and event id (a copy of the outbox loaded twice?); nothing was marked, and the batch is tried again until it is fixed. Keep one copy of each: mark the others published by their ctid (UPDATE ... SET published_at = now() WHERE ctid = ...; an unpublished row cannot be deleted in poll mode), then delete them")

// ErrMarkLocked says rows of a batch could not be marked because another
// transaction holds a row lock on them; the others were marked. Mark again
// later, holding the batch: ending the session would publish it again.
var ErrMarkLocked = errors.New("poll mode: rows Kafka has could not be marked published yet")

// ErrProducerStopped says the producer ended before a batch was delivered
// (its own error says why).
var ErrProducerStopped = errors.New("poll mode: the producer stopped")

// Published is the column poll mode marks.
const Published = "published_at"

// Reader reads and marks one table's rows on one connection, which also
// holds its buckets' locks. It is not safe for concurrent use, but Touch's
// clock may be read by another goroutine.
type Reader struct {
	conn *pgx.Conn
	cfg  Config
	seq  string // the sequence-filled column ordering the rows
	key1 int32  // the advisory lock's first key for buckets
	memb int32  // and for membership
	own  []int  // buckets held, sorted

	query    string // the read's SQL for the buckets held
	indexed  bool   // an index on the bucket serves the reads
	skip     int    // the read's leading columns that are not the table's
	mark     string
	markFree string // marks the rows of a batch not locked (markUnlocked)
	unmark   string // counts the rows of a mark still unpublished
	oldest   string // the oldest unpublished row

	last time.Time // the last statement's end

	// Queries counts the statements the reader ran, by kind.
	Queries func(kind string)
}

// Row is one unpublished row: its raw text values, as the simple protocol
// returns them (the same text pgoutput carries), and its sequence value.
type Row struct {
	Seq    int64
	Fields []pgconn.FieldDescription
	Values [][]byte
}

// querySeq finds the sequence-filled integer column (identity or serial,
// CACHE 1), whether the marking column exists as timestamptz, whether the
// key column exists, and whether the server is a standby.
const querySeq = `
SELECT coalesce((SELECT a.attname::text FROM pg_attribute a
                 JOIN pg_sequence q ON q.seqrelid = pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname)::regclass
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.atttypid IN ('int8'::regtype, 'int4'::regtype)
                   AND q.seqcache = 1
                 ORDER BY a.attnum LIMIT 1), ''),
       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = $3 AND NOT attisdropped AND atttypid = 'timestamptz'::regtype),
       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = $4 AND NOT attisdropped),
       pg_is_in_recovery()
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

// queryOtherConfig counts the readers of the table that run with another
// bucket count or key column (another key of the configuration lock).
const queryOtherConfig = `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1::bigint::oid AND objsubid = 2 AND objid <> $2::bigint::oid`

// Open checks the table and joins the readers of it: it takes the
// membership lock and a shared lock naming its configuration, held until
// conn closes. An error wrapping ErrNotPrepared is for an operator to fix.
func Open(ctx context.Context, conn *pgx.Conn, cfg Config) (*Reader, error) {
	if cfg.Buckets < 1 || cfg.Batch < 1 {
		return nil, fmt.Errorf("poll: buckets %d and batch %d must be positive", cfg.Buckets, cfg.Batch)
	}
	name := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	if cfg.Key == "" {
		return nil, fmt.Errorf("%w: the router's table.field.event.key is empty; poll mode needs it to name a column of %s (aggregateid by default), whose value picks each row's bucket", ErrNotPrepared, name)
	}
	r := &Reader{conn: conn, cfg: cfg, Queries: func(string) {}}
	var marked, key, standby bool
	err := r.queryRow(ctx, querySeq, cfg.Schema, cfg.Table, Published, cfg.Key).Scan(&r.seq, &marked, &key, &standby)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: the outbox table %s does not exist; apply sql/001_outbox.sql and sql/variants/outbox_poll.sql, or set OUTBOX_TABLE", ErrNotPrepared, name)
	}
	if err != nil {
		return nil, fmt.Errorf("poll mode: inspect %s: %w", name, err)
	}
	if standby {
		return nil, fmt.Errorf("%w: the server is a standby (pg_is_in_recovery), and poll mode marks the rows it publishes; point OUTBOX_PG_DSN at the primary (target_session_attrs=read-write)", ErrNotPrepared)
	}
	if r.seq == "" || !marked {
		return nil, fmt.Errorf("%w: %s needs a column filled at INSERT from a sequence of CACHE 1 (identity or serial) to keep each aggregate's order, and a column %s timestamptz that marks published rows; apply sql/variants/outbox_poll.sql (it adds both, an index and the NOTIFY trigger)", ErrNotPrepared, name, Published)
	}
	if !key {
		return nil, fmt.Errorf("%w: %s has no column %q (the router's table.field.event.key), which picks each row's bucket", ErrNotPrepared, name, cfg.Key)
	}
	// Row-level security that applies to the relay's role would hide rows
	// from every read and from the oldest-row check alike: their events
	// never published, nothing noticing. Refused now; and with
	// row_security off, a policy enabled later fails the reads instead.
	r.Queries("check")
	if err := rowsecurity.Check(ctx, r.conn, name, "poll mode"); err != nil {
		if errors.Is(err, rowsecurity.ErrApplies) {
			return nil, fmt.Errorf("%w: %w", ErrNotPrepared, err)
		}
		return nil, err
	}
	if _, err := r.exec(ctx, rowsecurity.Off); err != nil {
		return nil, fmt.Errorf("poll mode: %s: %w", rowsecurity.Off, err)
	}
	if cfg.ID == "" {
		cfg.ID, r.cfg.ID = "id", "id"
	}
	// The id column's type: a mark compares the id read (its text) cast
	// back to it. Compared as text instead, a char(n) id (whose text cast
	// drops the padding the value read carries) matched no row, and every
	// batch was published again for ever, the mark saying nothing.
	var idType string
	err = r.queryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND attnum > 0 AND NOT attisdropped`, name, cfg.ID).Scan(&idType)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("poll mode: inspect %s: %w", name, err)
	}
	if idType == "" {
		return nil, fmt.Errorf("%w: %s has no column %q (the router's table.field.event.id), which names each row a mark publishes", ErrNotPrepared, name, cfg.ID)
	}
	if err := r.checkSequence(ctx, name); err != nil {
		return nil, err
	}
	q := pgx.Identifier{r.seq}.Sanitize()
	id := pgx.Identifier{cfg.ID}.Sanitize()
	// A row is named by its seq and its event id: seq alone is not unique
	// once a cutover kept the rows but not the sequence (or an operator
	// inserted OVERRIDING SYSTEM VALUE), and marking by it marked rows of
	// other buckets that nobody had read. The seq lets the partial index
	// find the row; the id tells it apart.
	// The rows of a batch ($1 the seqs, $2 the ids read) still unpublished,
	// as t.
	batch := fmt.Sprintf("%[1]s t JOIN unnest($1::bigint[], $2::text[]) AS m(seq, id) ON t.%[3]s = m.seq AND t.%[4]s = m.id::%[5]s WHERE t.%[2]s IS NULL", name, Published, q, id, idType)
	r.mark = fmt.Sprintf("UPDATE %[1]s t SET %[2]s = now() FROM unnest($1::bigint[], $2::text[]) AS m(seq, id) WHERE t.%[3]s = m.seq AND t.%[4]s = m.id::%[5]s AND t.%[2]s IS NULL", name, Published, q, id, idType)
	// The rows of a batch no other transaction has locked, marked, and
	// how many are locked (unpublished, not taken).
	r.markFree = fmt.Sprintf(`WITH want AS (SELECT 1 FROM %[6]s),
free AS (SELECT t.%[3]s AS seq, t.%[4]s AS id FROM %[6]s FOR UPDATE OF t SKIP LOCKED),
done AS (UPDATE %[1]s t SET %[2]s = now() FROM free WHERE t.%[3]s = free.seq AND t.%[4]s = free.id AND t.%[2]s IS NULL RETURNING 1)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM want) - (SELECT count(*) FROM free)`, name, Published, q, id, idType, batch)
	// A type without equality (json, point) would fail every mark, the
	// batch published again and again: said now, before anything is.
	r.Queries("check")
	if _, err := r.exec(ctx, "EXPLAIN "+r.mark, []int64{}, []string{}); err != nil {
		return nil, fmt.Errorf("%w: a mark names each row by %s and its event id %s (%s), and cannot: %v; give %s a type with equality (uuid, text)", ErrNotPrepared, r.seq, cfg.ID, idType, err, cfg.ID)
	}
	r.unmark = "SELECT count(*) FROM " + batch
	created := "NULL::timestamptz"
	var hasCreated bool
	if err := r.queryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'created_at' AND NOT attisdropped AND atttypid = 'timestamptz'::regtype)`, name).Scan(&hasCreated); err != nil {
		return nil, fmt.Errorf("poll mode: inspect %s: %w", name, err)
	}
	if hasCreated {
		created = "created_at"
	}
	r.key1 = lockKey("outbox-poll-buckets:" + name)
	// The oldest unpublished row, when it was written (if the table says),
	// and whether a reader that is not silent (see queryShares) holds its
	// bucket.
	r.oldest = fmt.Sprintf(`SELECT o.seq, o.at, clock_timestamp(), EXISTS (SELECT 1 FROM pg_locks l LEFT JOIN pg_stat_activity s ON s.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = %[6]d::bigint::oid AND l.objsubid = 2 AND l.objid = o.bucket::bigint::oid
      AND NOT coalesce(l.pid <> pg_backend_pid() AND (s.state <> 'active' OR s.wait_event = 'ClientWrite') AND s.state_change < now() - $1::interval, false))
FROM (SELECT %[1]s::bigint AS seq, %[2]s AS at, (hashtext(coalesce(%[3]s::text, '')) & 2147483647) %% %[4]d AS bucket
      FROM %[5]s WHERE %[7]s IS NULL ORDER BY %[1]s LIMIT 1) o`, q, created, pgx.Identifier{cfg.Key}.Sanitize(), cfg.Buckets, name, r.key1, Published)
	// A mark that cannot work is said now, before anything is published:
	// no privilege (fatal), a read-only transaction (retried).
	r.Queries("check")
	if _, err := r.exec(ctx, fmt.Sprintf("UPDATE %s SET %s = %s WHERE false", name, Published, Published)); err != nil {
		return nil, fmt.Errorf("poll mode: the relay must be able to mark rows (UPDATE %s of %s): %w", Published, name, err)
	}
	if r.indexed, err = r.bucketIndexed(ctx, name); err != nil {
		return nil, err
	}
	r.memb = lockKey("outbox-poll-readers:" + name)
	conf, mine := lockKey("outbox-poll-config:"+name), lockKey(fmt.Sprintf("%d/%s", cfg.Buckets, cfg.Key))
	// The lock first, then the look: two instances starting together with
	// different settings each see the other's.
	r.Queries("lock")
	if _, err := r.exec(ctx, "SELECT pg_advisory_lock_shared($1, $2), pg_advisory_lock($3, pg_backend_pid())", conf, mine, r.memb); err != nil {
		return nil, fmt.Errorf("poll mode: join the readers of %s: %w", name, err)
	}
	var others int
	r.Queries("check")
	if err := r.queryRow(ctx, queryOtherConfig, conf, mine).Scan(&others); err != nil {
		return nil, fmt.Errorf("poll mode: read the readers' configurations: %w", err)
	}
	if others > 0 {
		// Two bucket counts (or key columns) would put one aggregate in
		// two readers' buckets: published twice, out of order.
		return nil, fmt.Errorf("%w: %d reader(s) of %s run with another OUTBOX_POLL_BUCKETS or table.field.event.key than this one (%d, %q); every instance of a table must use the same: stop them all to change it", ErrNotPrepared, others, name, cfg.Buckets, cfg.Key)
	}
	return r, nil
}

// bucketExpr is a row's bucket, as SQL. A NULL key hashes as the empty string: every
// row is in a bucket. An index on exactly this expression and seq, of the
// unpublished rows, serves the reads (see BucketIndex).
func (r *Reader) bucketExpr() string {
	return fmt.Sprintf("((hashtext(coalesce(%s::text, '')) & 2147483647) %% %d)", pgx.Identifier{r.cfg.Key}.Sanitize(), r.cfg.Buckets)
}

// BucketIndex is the statement that creates the index serving the reads
// of this configuration (sql/variants/outbox_poll.sql creates it for the
// default 16 buckets of aggregateid).
func (r *Reader) BucketIndex() string {
	return fmt.Sprintf("CREATE INDEX CONCURRENTLY outbox_unpublished_bucket%d_idx ON %s (%s, %s) WHERE %s IS NULL",
		r.cfg.Buckets, pgx.Identifier{r.cfg.Schema, r.cfg.Table}.Sanitize(), r.bucketExpr(), pgx.Identifier{r.seq}.Sanitize(), Published)
}

// BucketIndexed reports whether an index serves the reads by bucket; when
// not, a read walks every unpublished row of the table to find its
// buckets' (say so, with BucketIndex).
func (r *Reader) BucketIndexed() bool { return r.indexed }

// bucketIndexed asks the planner whether a read of one bucket can use an
// index on the bucket expression: with sequential and bitmap scans off, its
// plan has an index condition on hashtext exactly when such an index
// exists (comparing index definitions as text would depend on how the
// server spells them).
func (r *Reader) bucketIndexed(ctx context.Context, name string) (bool, error) {
	tctx, cancel := r.bound(ctx)
	defer cancel()
	defer func() { r.last = time.Now() }()
	tx, err := r.conn.Begin(tctx)
	if err != nil {
		return false, fmt.Errorf("poll mode: look for the bucket index of %s: %w", name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var plan string
	_, err = tx.Exec(tctx, "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off", pgx.QueryExecModeSimpleProtocol)
	if err == nil {
		err = tx.QueryRow(tctx, fmt.Sprintf("EXPLAIN (FORMAT JSON) SELECT 1 FROM %s WHERE %s IS NULL AND %s = 0 ORDER BY %s LIMIT 1",
			name, Published, r.bucketExpr(), pgx.Identifier{r.seq}.Sanitize())).Scan(&plan)
	}
	if err != nil {
		return false, fmt.Errorf("poll mode: look for the bucket index of %s: %w", name, err)
	}
	var nodes []any
	if err := json.Unmarshal([]byte(plan), &nodes); err != nil {
		return false, fmt.Errorf("poll mode: read the plan of a read of %s: %w", name, err)
	}
	return indexCondOn(nodes, "hashtext("), nil
}

// indexCondOn reports whether a node of an EXPLAIN (FORMAT JSON) plan has
// an index condition that mentions what.
func indexCondOn(v any, what string) bool {
	switch n := v.(type) {
	case []any:
		return slices.ContainsFunc(n, func(e any) bool { return indexCondOn(e, what) })
	case map[string]any:
		if c, ok := n["Index Cond"].(string); ok && strings.Contains(c, what) {
			return true
		}
		for _, e := range n {
			if indexCondOn(e, what) {
				return true
			}
		}
	}
	return false
}

// lockKey is a stable advisory-lock key for a name (non-negative, so that
// pg_locks shows it as the same number).
func lockKey(name string) int32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int32(h.Sum32() & 0x7fffffff)
}

// bound is ctx with the statement deadline (Silence).
func (r *Reader) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.cfg.Silence <= 0 {
		return ctx, func() {}
	}
	// Generous: the others never take an active statement for silence;
	// this only ends a session stuck on a network that stopped answering.
	return context.WithTimeout(ctx, max(3*r.cfg.Silence, 30*time.Second))
}

func (r *Reader) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	tag, err := r.conn.Exec(ctx, sql, args...)
	r.last = time.Now()
	return tag, err
}

type scanner struct {
	row    pgx.Row
	cancel context.CancelFunc
	r      *Reader
}

func (s scanner) Scan(dest ...any) error {
	defer s.cancel()
	err := s.row.Scan(dest...)
	s.r.last = time.Now()
	return err
}

func (r *Reader) queryRow(ctx context.Context, sql string, args ...any) scanner {
	ctx, cancel := r.bound(ctx)
	return scanner{r.conn.QueryRow(ctx, sql, args...), cancel, r}
}

// silence is Silence as an interval parameter (a century when 0: never).
func (r *Reader) silence() string {
	d := r.cfg.Silence
	if d <= 0 {
		d = 100 * 365 * 24 * time.Hour
	}
	return fmt.Sprintf("%d milliseconds", d.Milliseconds())
}

// Touch runs a statement when none ran for a third of Silence, so that the
// other readers do not take this one for dead while it waits (for Kafka).
func (r *Reader) Touch(ctx context.Context) error {
	if r.cfg.Silence <= 0 || time.Since(r.last) < r.cfg.Silence/3 {
		return nil
	}
	r.Queries("touch")
	if _, err := r.exec(ctx, "SELECT 1"); err != nil {
		return fmt.Errorf("poll mode: keep the session alive: %w", err)
	}
	return nil
}

// Closed reports whether the reader's connection is closed (a failed
// statement closed it: the session, and its locks, are gone).
func (r *Reader) Closed() bool { return r.conn.IsClosed() }

// Owned returns the buckets held.
func (r *Reader) Owned() []int { return slices.Clone(r.own) }

// SeqColumn is the column ordering the rows.
func (r *Reader) SeqColumn() string { return r.seq }

// queryShares is what Rebalance reads from pg_locks and pg_stat_activity:
// whether this backend holds its membership lock, the live readers (those
// not silent for longer than $3), which buckets are held (by anyone), the
// fewest buckets a live reader holds, and the silent readers: their pids and
// their sessions' application_name (which their LISTEN connection shares).
// A session is silent when it has run nothing for $3 (idle, or idle in a
// transaction), or has been stuck writing a result to its client for as
// long. pg_stat_activity shows another role's sessions' state only to
// pg_read_all_stats: run every instance as the same role.
const queryShares = `
WITH m AS (SELECT DISTINCT pid FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = $1::bigint::oid AND objsubid = 2),
     a AS (SELECT m.pid, coalesce(s.application_name, '') AS app,
                  coalesce(m.pid <> pg_backend_pid() AND (s.state <> 'active' OR s.wait_event = 'ClientWrite')
                           AND s.state_change < now() - $3::interval, false) AS silent
           FROM m LEFT JOIN pg_stat_activity s ON s.pid = m.pid),
     b AS (SELECT pid, objid::bigint::int AS bucket FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = $2::bigint::oid AND objsubid = 2)
SELECT (SELECT count(*) FROM m WHERE pid = pg_backend_pid()) = 1,
       (SELECT count(*) FROM a WHERE NOT silent)::int,
       coalesce((SELECT array_agg(bucket) FROM b), '{}'::int[]),
       coalesce((SELECT min(c) FROM (SELECT count(b.bucket) AS c FROM a LEFT JOIN b USING (pid) WHERE NOT a.silent GROUP BY a.pid) x), 0)::int,
       coalesce((SELECT array_agg(pid) FROM a WHERE silent), '{}'::int[]),
       coalesce((SELECT array_agg(app) FROM a WHERE silent AND app <> ''), '{}'::text[]),
       (SELECT count(*) FROM m JOIN pg_stat_activity s USING (pid) WHERE s.usesysid <> (SELECT oid FROM pg_roles WHERE rolname = current_user))::int`

// queryScanned is the rows the scans of the table (its partitions too;
// pg_partition_tree gives nothing for a plain table) fetched so far, by the
// server's statistics (a backend reports its counts about once a second
// while busy, within 10 s when idle): every reader's reads and marks, and
// anything else that scans it.
const queryScanned = `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::bigint
FROM pg_stat_user_tables WHERE relid = $1::regclass OR relid IN (SELECT relid FROM pg_partition_tree($1::regclass))`

// Shares is what Rebalance saw.
type Shares struct {
	// Scanned is the rows the table's scans fetched so far (see
	// queryScanned).
	Scanned int64
	Readers int   // live readers of the table, this one included
	Held    []int // buckets held by any reader
	Fewest  int   // the fewest buckets a live reader holds
	// Ended are the silent readers' sessions this call terminated (pids).
	Ended []int
	// Oldest is the unpublished row that comes first (Seq 0: none), and
	// when it was written.
	OldestSeq   int64
	OldestAt    time.Time
	OldestOwned bool // a reader holds its bucket
	// EndErr is why ending silent readers failed (logged, never fatal: a
	// session of another role may not be signalled).
	EndErr error
	// Silent counts the silent readers found; more than len(Ended) were
	// left alone (not ours to signal).
	Silent int
	// OtherRoles counts the readers running as another role: their
	// silence may not be seen, nor their sessions ended.
	OtherRoles int
}

// Rebalance ends silent readers' sessions (their buckets come free), then
// takes or gives up buckets so that every live reader holds about
// Buckets/readers: at most ceil(Buckets/readers), and while a reader holds
// fewer than floor(Buckets/readers), the others give up what they hold
// beyond the floor (one a round) and nobody takes beyond it. Only free
// buckets are tried. It also reads the oldest unpublished row. Call it only
// between batches: a bucket it gives up may be read by another reader at
// once.
func (r *Reader) Rebalance(ctx context.Context) (Shares, error) {
	var sh Shares
	var session bool
	var silent []int
	var apps []string
	r.Queries("shares")
	if err := r.queryRow(ctx, queryShares, r.memb, r.key1, r.silence()).Scan(&session, &sh.Readers, &sh.Held, &sh.Fewest, &silent, &apps, &sh.OtherRoles); err != nil {
		return sh, fmt.Errorf("poll mode: read the readers' shares: %w", err)
	}
	if !session {
		// The membership lock taken at Open is not this backend's: a
		// transaction pooler hands each statement to another server
		// session, and session locks (the buckets' fence) mean nothing.
		return sh, ErrNotSession
	}
	sh.Silent = len(silent)
	if len(silent) > 0 {
		r.Queries("terminate")
		// MATERIALIZED: the sessions are chosen first, then ended; a
		// filter the planner might evaluate after the call could not end
		// another.
		rows, err := r.conn.Query(ctx, `WITH t AS MATERIALIZED (SELECT pid FROM pg_stat_activity s
			WHERE (pid = ANY($1) OR application_name = ANY($2)) AND pid <> pg_backend_pid() AND datname = current_database()
			  AND (pg_has_role(s.usesysid, 'USAGE') OR pg_has_role('pg_signal_backend', 'USAGE'))
			  AND (NOT (SELECT rolsuper FROM pg_roles WHERE oid = s.usesysid) OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)))
			SELECT pid FROM t WHERE pg_terminate_backend(pid)`, silent, apps)
		if err == nil {
			sh.Ended, err = pgx.CollectRows(rows, pgx.RowTo[int])
		}
		r.last = time.Now()
		if err != nil {
			// Not fatal, and not the end of the look: the readers that
			// can be signalled are, the others are said.
			sh.EndErr = fmt.Errorf("poll mode: end the sessions of silent readers %v: %w", silent, err)
		}
	}
	var err error
	if sh.OldestSeq, sh.OldestAt, sh.OldestOwned, err = r.Oldest(ctx); err != nil {
		return sh, err
	}
	r.Queries("scanned")
	if err := r.queryRow(ctx, queryScanned, pgx.Identifier{r.cfg.Schema, r.cfg.Table}.Sanitize()).Scan(&sh.Scanned); err != nil {
		return sh, fmt.Errorf("poll mode: read the table's scan statistics: %w", err)
	}
	n := max(sh.Readers, 1)
	lo, hi := r.cfg.Buckets/n, (r.cfg.Buckets+n-1)/n
	limit := hi
	if sh.Fewest < lo {
		// Someone is short of the floor: hold no more than it.
		limit = max(lo, 1)
	}
	changed := false
	for len(r.own) > hi || (len(r.own) > limit && !changed) {
		b := r.own[len(r.own)-1]
		var was bool
		r.Queries("unlock")
		if err := r.queryRow(ctx, "SELECT pg_advisory_unlock($1, $2)", r.key1, b).Scan(&was); err != nil {
			return sh, fmt.Errorf("poll mode: give up bucket %d: %w", b, err)
		}
		if !was {
			// This session did not hold it: see ErrNotSession.
			return sh, ErrNotSession
		}
		r.own = r.own[:len(r.own)-1]
		changed = true
	}
	if !changed && len(r.own) < limit {
		// The free buckets, in a random order, so that readers starting
		// together do not all ask for the same ones.
		for _, b := range rand.Perm(r.cfg.Buckets) {
			if len(r.own) >= limit {
				break
			}
			if slices.Contains(sh.Held, b) {
				continue
			}
			var got bool
			r.Queries("lock")
			if err := r.queryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", r.key1, b).Scan(&got); err != nil {
				return sh, fmt.Errorf("poll mode: take bucket %d: %w", b, err)
			}
			if got {
				r.own = append(r.own, b)
				changed = true
			}
		}
	}
	if changed {
		slices.Sort(r.own)
		r.query = ""
	}
	return sh, nil
}

// Oldest returns the unpublished row that comes first in the table (seq 0:
// none), when it was written on this process's clock (zero when the table
// does not say), and
// whether a reader holds its bucket.
func (r *Reader) Oldest(ctx context.Context) (seq int64, at time.Time, owned bool, err error) {
	var atp *time.Time
	var server time.Time
	r.Queries("oldest")
	if err := r.queryRow(ctx, r.oldest, r.silence()).Scan(&seq, &atp, &server, &owned); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, time.Time{}, false, nil
		}
		return 0, time.Time{}, false, fmt.Errorf("poll mode: read the oldest unpublished row: %w", err)
	}
	if atp != nil {
		// On this process's clock: created_at is the server's, and the
		// age is taken here, later, against time.Now; a skew between the
		// two clocks would add to (or hide) the age.
		at = atp.Add(time.Since(server))
	}
	return seq, at, owned, nil
}

// Read returns the unpublished rows of the buckets held, in the order of
// the sequence column: at most Batch rows, and no more once BatchBytes is
// reached (the server counts, so that rows beyond are not sent at all; the
// first row is always returned).
func (r *Reader) Read(ctx context.Context) ([]Row, error) {
	if len(r.own) == 0 {
		return nil, nil
	}
	if r.query == "" {
		// The buckets are literals, not a parameter: the planner then sees
		// the same statement until the buckets change, and the simple
		// protocol (text values, as pgoutput sends them) takes no
		// parameters of arrays kindly. A NULL key hashes as '': every
		// row is in a bucket.
		in := make([]string, len(r.own))
		for i, b := range r.own {
			in[i] = strconv.Itoa(b)
		}
		seq := pgx.Identifier{r.seq}.Sanitize()
		tbl := pgx.Identifier{r.cfg.Schema, r.cfg.Table}.Sanitize()
		from := fmt.Sprintf("%s o WHERE %s IS NULL AND %s IN (%s)", tbl, Published, r.bucketExpr(), strings.Join(in, ","))
		if r.indexed && len(r.own) < r.cfg.Buckets {
			// A reader of every bucket (one instance) reads in seq order
			// alone: its rows are all of them, and the seq index walks the
			// heap in the order rows were written, where one branch a
			// bucket visits every page once a bucket (measured behind a
			// held horizon with 300k marks: 37 ms against 155 ms).
			//
			// One branch a bucket, each an index scan in seq order on the
			// bucket index, merged: a bucket with nothing costs one probe,
			// however large another's backlog (one IN over all of them
			// walks every unpublished row of the table).
			// Each branch sizes its own rows (a whole-row reference to
			// the union would keep the planner from merging the
			// branches' ordered scans) and is ordered and limited: the
			// planner merges them lazily, reading about a batch in all,
			// and where it sorts instead (it did, over 16 busy buckets),
			// it sorts at most a batch a bucket, never a backlog.
			branches := make([]string, len(in))
			for i, b := range in {
				branches[i] = fmt.Sprintf("(SELECT pg_column_size(x.*) AS \"outbox.poll.size\", x.* FROM %s x WHERE %s IS NULL AND %s = %s ORDER BY %s LIMIT %d)", tbl, Published, r.bucketExpr(), b, seq, r.cfg.Batch)
			}
			r.query = fmt.Sprintf(`SELECT * FROM (
  SELECT %[1]s AS "outbox.poll.seq", sum("outbox.poll.size") OVER (ORDER BY %[1]s) - "outbox.poll.size" AS "outbox.poll.before", o.*
  FROM (%[2]s) o
  ORDER BY %[1]s LIMIT %[3]d) s
WHERE "outbox.poll.before" < %[4]d ORDER BY "outbox.poll.seq"`,
				seq, strings.Join(branches, " UNION ALL "), r.cfg.Batch, r.cfg.BatchBytes)
			r.skip = 3
		} else {
			r.query = fmt.Sprintf(`SELECT * FROM (
  SELECT %[1]s AS "outbox.poll.seq", sum(pg_column_size(o.*)) OVER (ORDER BY %[1]s) - pg_column_size(o.*) AS "outbox.poll.before", o.*
  FROM %[2]s
  ORDER BY %[1]s LIMIT %[3]d) s
WHERE "outbox.poll.before" < %[4]d ORDER BY "outbox.poll.seq"`,
				seq, from, r.cfg.Batch, r.cfg.BatchBytes)
			r.skip = 2
		}
	}
	r.Queries("read")
	ctx, cancel := r.bound(ctx)
	defer cancel()
	defer func() { r.last = time.Now() }()
	rows, err := r.conn.Query(ctx, r.query, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, fmt.Errorf("poll mode: read %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	defer rows.Close()
	// A copy: pgx reuses its field descriptions for the next statement.
	fields := slices.Clone(rows.FieldDescriptions()[r.skip:])
	var out []Row
	size := 0
	for rows.Next() {
		raw := rows.RawValues()
		seq, err := strconv.ParseInt(string(raw[0]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("poll mode: the sequence column %s holds %q: %w", r.seq, raw[0], err)
		}
		row := Row{Seq: seq, Fields: fields, Values: make([][]byte, len(fields))}
		for i, v := range raw[r.skip:] {
			if v != nil {
				row.Values[i] = append([]byte{}, v...)
			}
		}
		out = append(out, row)
		// The hard bound: the server's count is of stored (compressed)
		// sizes, and the text sent may be far larger.
		if size += rowSize(row); size >= r.cfg.BatchBytes {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("poll mode: read %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	return out, nil
}

func rowSize(row Row) int {
	n := 0
	for _, v := range row.Values {
		n += len(v)
	}
	return n
}

// Mark records rows as published. It runs on the connection holding the
// buckets' locks: if that session is gone, so are the locks, and the mark
// fails (another reader may own the rows now and publish them again). An
// UPDATE that changed fewer rows than given while some are still
// unpublished is ErrNotMarked.
func (r *Reader) Mark(ctx context.Context, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	seqs := make([]int64, len(rows))
	ids := make([]string, len(rows))
	for i, row := range rows {
		seqs[i] = row.Seq
		at := slices.IndexFunc(row.Fields, func(f pgconn.FieldDescription) bool { return f.Name == r.cfg.ID })
		if at < 0 || row.Values[at] == nil {
			return fmt.Errorf("poll mode: a row of %s.%s (seq %d) has no event id in column %q; nothing was marked", r.cfg.Schema, r.cfg.Table, row.Seq, r.cfg.ID)
		}
		ids[i] = string(row.Values[at])
	}
	r.Queries("mark")
	// A transaction, so that a mark that would change more rows than were
	// read (rows sharing their seq and id) is undone, not committed.
	tctx, cancel := r.bound(ctx)
	defer cancel()
	tx, err := r.conn.Begin(tctx)
	if err != nil {
		r.last = time.Now()
		return fmt.Errorf("poll mode: mark %d rows of %s.%s published: %w", len(rows), r.cfg.Schema, r.cfg.Table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	// A row lock held on a row of the batch (an operator fixing a payload
	// in place, an UPDATE ... SET published_at = NULL left open) is not
	// waited for until the statement's bound cancels the mark and ends the
	// session, whose next owner would publish the whole batch again, and
	// again: the wait is bounded, and then what is not locked is marked.
	tag, err := tx.Exec(tctx, markLockTimeout)
	if err == nil {
		tag, err = tx.Exec(tctx, r.mark, seqs, ids)
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		_ = tx.Rollback(tctx)
		r.last = time.Now()
		return r.markUnlocked(ctx, seqs, ids, err)
	}
	if err == nil && int(tag.RowsAffected()) > len(rows) {
		r.last = time.Now()
		return fmt.Errorf("%w (%d rows matched the %d read of %s.%s)", ErrMarkedMore, tag.RowsAffected(), len(rows), r.cfg.Schema, r.cfg.Table)
	}
	if err == nil {
		err = tx.Commit(tctx)
	}
	r.last = time.Now()
	if err != nil {
		return fmt.Errorf("poll mode: mark %d rows of %s.%s published: %w", len(rows), r.cfg.Schema, r.cfg.Table, err)
	}
	if int(tag.RowsAffected()) == len(rows) {
		return nil
	}
	var left int
	r.Queries("mark")
	if err := r.queryRow(ctx, r.unmark, seqs, ids).Scan(&left); err != nil {
		return fmt.Errorf("poll mode: count the rows of %s.%s left unmarked: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	if left > 0 {
		return fmt.Errorf("%w (%d of %d rows of %s.%s)", ErrNotMarked, left, len(rows), r.cfg.Schema, r.cfg.Table)
	}
	return nil
}

// markLockTimeout bounds a mark's wait for a row lock another transaction
// holds on a row of its batch. Nothing in the relay's own path locks outbox
// rows for long (writers insert, upkeep's table locks wait at most 50 ms):
// a lock held past a second is an operator's, which may last an hour.
const markLockTimeout = "SET LOCAL lock_timeout = '1s'"

// markUnlocked marks the rows of the batch that no other transaction has
// locked (SKIP LOCKED), after a mark timed out waiting for one, and
// returns ErrMarkLocked: the caller holds the batch and marks again later,
// rather than ending the session (see Mark).
func (r *Reader) markUnlocked(ctx context.Context, seqs []int64, ids []string, cause error) error {
	tctx, cancel := r.bound(ctx)
	defer cancel()
	defer func() { r.last = time.Now() }()
	tx, err := r.conn.Begin(tctx)
	if err != nil {
		return fmt.Errorf("poll mode: mark the rows not locked of %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var marked, locked int64
	_, err = tx.Exec(tctx, markLockTimeout)
	if err == nil {
		err = tx.QueryRow(tctx, r.markFree, seqs, ids).Scan(&marked, &locked)
	}
	if err == nil && marked > int64(len(seqs)) {
		return fmt.Errorf("%w (%d rows matched the %d read of %s.%s)", ErrMarkedMore, marked, len(seqs), r.cfg.Schema, r.cfg.Table)
	}
	if err == nil {
		err = tx.Commit(tctx)
	}
	if err != nil {
		return fmt.Errorf("poll mode: mark the rows not locked of %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	return fmt.Errorf("%w: %d of the batch's rows are locked by another transaction (an open UPDATE or SELECT ... FOR UPDATE on %s.%s: see pg_locks), %d others marked: %w", ErrMarkLocked, locked, r.cfg.Schema, r.cfg.Table, marked, cause)
}

// querySequence names the sequence filling the seq column ($2 of the table $1),
// its increment, and whether the role may read it. By the sequence's oid:
// a cast of every pg_sequences row's name to regclass checks USAGE on its
// schema, and another schema's sequence refused the whole query.
const querySequence = `SELECT s.seq::text, q.seqincrement, has_sequence_privilege(s.seq, 'SELECT')
FROM (SELECT pg_get_serial_sequence($1, $2)::regclass AS seq) s
JOIN pg_sequence q ON q.seqrelid = s.seq`

// checkSequence refuses a sequence behind the table: a cutover that kept
// the rows but not the sequence (logical replication carries no sequence
// values; a restore of the table alone; ALTER SEQUENCE ... RESTART) would
// hand new events values that older unpublished events of their aggregate
// already have or exceed, so they would be published before them, and
// share their values.
func (r *Reader) checkSequence(ctx context.Context, name string) error {
	col := pgx.Identifier{r.seq}.Sanitize()
	var indexed bool
	if err := r.queryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1::regclass AND a.attname = $2 AND i.indpred IS NULL AND i.indexprs IS NULL)`, name, r.seq).Scan(&indexed); err != nil {
		return fmt.Errorf("poll mode: inspect the indexes of %s: %w", name, err)
	}
	q := fmt.Sprintf("SELECT max(%s)::bigint FROM %s", col, name)
	if !indexed {
		q += fmt.Sprintf(" WHERE %s IS NULL", Published)
	}
	// The table first, then the sequence: writers go on meanwhile, and a
	// sequence read after the table is at least every value the table
	// held then (read before, a busy table is always ahead of it).
	var most *int64
	if err := r.queryRow(ctx, q).Scan(&most); err != nil {
		return fmt.Errorf("poll mode: read the largest %s of %s: %w", r.seq, name, err)
	}
	var seqName string
	var inc int64
	var readable bool
	r.Queries("check")
	if err := r.queryRow(ctx, querySequence, name, r.seq).Scan(&seqName, &inc, &readable); err != nil {
		return fmt.Errorf("poll mode: find the sequence of %s.%s: %w", name, r.seq, err)
	}
	if !readable {
		return fmt.Errorf("%w: the relay's role cannot read the sequence %s that fills %s.%s, so it cannot check that the sequence is ahead of the table (a cutover that kept the rows but not the sequence reorders and loses events); GRANT SELECT ON SEQUENCE %s TO the relay's role (sql/variants/outbox_poll.sql does it for outbox_poller)", ErrNotPrepared, seqName, name, r.seq, seqName)
	}
	if inc <= 0 {
		return fmt.Errorf("%w: the sequence %s that fills %s.%s counts down (INCREMENT %d): later events would sort first; it must count up", ErrNotPrepared, seqName, name, r.seq, inc)
	}
	// The value it hands out next, from the sequence itself: after ALTER
	// SEQUENCE ... RESTART or setval(..., false) it has handed out nothing
	// since, and next is last_value itself (pg_sequences shows NULL then).
	// seqName is pg_get_serial_sequence's, quoted as SQL needs.
	var last int64
	var called bool
	if err := r.queryRow(ctx, "SELECT last_value, is_called FROM "+seqName).Scan(&last, &called); err != nil {
		return fmt.Errorf("poll mode: read the sequence %s: %w", seqName, err)
	}
	next := last
	if called {
		next = last + inc
	}
	if most != nil && next <= *most {
		return fmt.Errorf("%w: the sequence %s hands out %d next, but %s already holds %s = %d (a cutover or copy that kept the rows but not the sequence?): new events would be published before older ones of their aggregate, and share values with them. Move the sequence past the table, as its owner: SELECT setval('%s', (SELECT max(%s) FROM %s)); "+
			"rows written since the cutover took values below older unpublished rows of their aggregate: with the writers paused, renumber them after the setval (UPDATE %s SET %s = DEFAULT WHERE %s IS NULL AND <written since the cutover>, in the order they were written)",
			ErrNotPrepared, seqName, next, name, r.seq, *most, seqName, col, name, name, col, Published)
	}
	return nil
}

// Readers counts the poll-mode readers of schema.table running now (their
// sessions hold the membership lock Open takes): the WAL relay asks before
// it takes over from them.
func Readers(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema, table string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(DISTINCT pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1::bigint::oid AND objsubid = 2`, lockKey("outbox-poll-readers:"+pgx.Identifier{schema, table}.Sanitize())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the poll-mode readers of %s.%s: %w", schema, table, err)
	}
	return n, nil
}

// SeqColumn is the sequence-filled column poll mode orders schema.table's
// rows by ("" when the table is not prepared for poll mode).
func SeqColumn(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema, table string) (string, error) {
	var seq string
	var marked, key, standby bool
	err := q.QueryRow(ctx, querySeq, schema, table, Published, "").Scan(&seq, &marked, &key, &standby)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("poll mode: inspect %s.%s: %w", schema, table, err)
	}
	if !marked {
		return "", nil
	}
	return seq, nil
}
