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
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Config is what a Reader reads.
type Config struct {
	Schema, Table string
	// Key is the column whose value picks the bucket (the router's
	// table.field.event.key, aggregateid by default).
	Key string
	// Buckets is how many buckets the rows are spread over; every reader
	// of a table must use the same number.
	Buckets int
	// Batch bounds the rows of one read, BatchBytes their size (at least
	// one row is read, whatever its size).
	Batch      int
	BatchBytes int
}

// ErrNotPrepared says the table lacks what poll mode needs; its text says
// what to apply.
var ErrNotPrepared = errors.New("the outbox table is not prepared for poll mode")

// ErrNotSession says the connection is not one server session.
var ErrNotSession = errors.New("poll mode needs one server session per connection (its buckets are session advisory locks), but the statements run in different sessions: connect directly or through a session-mode pooler, not a transaction-mode one (PgBouncer pool_mode=transaction)")

// Published is the column poll mode marks.
const Published = "published_at"

// Reader reads and marks one table's rows on one connection, which also
// holds its buckets' locks. It is not safe for concurrent use.
type Reader struct {
	conn *pgx.Conn
	cfg  Config
	seq  string // the sequence-filled column ordering the rows
	key1 int32  // the advisory lock's first key for buckets
	memb int32  // and for membership
	own  []int  // buckets held, sorted

	query string // the read's SQL for the buckets held
	mark  string

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
// CACHE 1) and whether the marking column exists as timestamptz.
const querySeq = `
SELECT coalesce((SELECT a.attname::text FROM pg_attribute a
                 JOIN pg_sequence q ON q.seqrelid = pg_get_serial_sequence(format('%I.%I', n.nspname, c.relname), a.attname)::regclass
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.atttypid IN ('int8'::regtype, 'int4'::regtype)
                   AND q.seqcache = 1
                 ORDER BY a.attnum LIMIT 1), ''),
       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = $3 AND NOT attisdropped AND atttypid = 'timestamptz'::regtype),
       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = c.oid AND attname = $4 AND NOT attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

// Open checks the table and joins the readers of it: it takes the
// membership lock, held until conn closes.
func Open(ctx context.Context, conn *pgx.Conn, cfg Config) (*Reader, error) {
	if cfg.Buckets < 1 || cfg.Batch < 1 {
		return nil, fmt.Errorf("poll: buckets %d and batch %d must be positive", cfg.Buckets, cfg.Batch)
	}
	name := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	var seq string
	var marked, key bool
	err := conn.QueryRow(ctx, querySeq, cfg.Schema, cfg.Table, Published, cfg.Key).Scan(&seq, &marked, &key)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("poll mode: the outbox table %s does not exist; apply sql/001_outbox.sql and sql/variants/outbox_poll.sql, or set OUTBOX_TABLE", name)
	}
	if err != nil {
		return nil, fmt.Errorf("poll mode: inspect %s: %w", name, err)
	}
	if seq == "" || !marked {
		return nil, fmt.Errorf("%w: %s needs a column filled at INSERT from a sequence of CACHE 1 (identity or serial) to keep each aggregate's order, and a column %s timestamptz that marks published rows; apply sql/variants/outbox_poll.sql (it adds both, an index and the NOTIFY trigger)", ErrNotPrepared, name, Published)
	}
	if !key {
		return nil, fmt.Errorf("%w: %s has no column %q (the router's table.field.event.key), which picks each row's bucket", ErrNotPrepared, name, cfg.Key)
	}
	r := &Reader{conn: conn, cfg: cfg, seq: seq, Queries: func(string) {}}
	r.key1 = lockKey("outbox-poll-buckets:" + name)
	r.memb = lockKey("outbox-poll-readers:" + name)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, pg_backend_pid())", r.memb); err != nil {
		return nil, fmt.Errorf("poll mode: join the readers of %s: %w", name, err)
	}
	q := pgx.Identifier{seq}.Sanitize()
	r.mark = fmt.Sprintf("UPDATE %s SET %s = now() WHERE %s = ANY($1) AND %s IS NULL", name, Published, q, Published)
	return r, nil
}

// lockKey is a stable advisory-lock key for a name (non-negative, so that
// pg_locks shows it as the same number).
func lockKey(name string) int32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int32(h.Sum32() & 0x7fffffff)
}

// Owned returns the buckets held.
func (r *Reader) Owned() []int { return slices.Clone(r.own) }

// SeqColumn is the column ordering the rows.
func (r *Reader) SeqColumn() string { return r.seq }

// queryShares is what Rebalance reads from pg_locks: how many readers
// there are, which buckets are held (by anyone), and the fewest buckets any
// reader holds.
const queryShares = `
WITH m AS (SELECT DISTINCT pid FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = $1::bigint::oid AND objsubid = 2),
     b AS (SELECT pid, objid::bigint::int AS bucket FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND classid = $2::bigint::oid AND objsubid = 2)
SELECT (SELECT count(*) FROM m WHERE pid = pg_backend_pid()) = 1,
       (SELECT count(*) FROM m)::int,
       coalesce((SELECT array_agg(bucket) FROM b), '{}'::int[]),
       coalesce((SELECT min(c) FROM (SELECT count(b.bucket) AS c FROM m LEFT JOIN b USING (pid) GROUP BY m.pid) x), 0)::int`

// Shares is what Rebalance saw.
type Shares struct {
	Readers int   // readers of the table, this one included
	Held    []int // buckets held by any reader
	Fewest  int   // the fewest buckets a reader holds
}

// Rebalance takes or gives up buckets so that every reader holds about
// Buckets/readers: at most ceil(Buckets/readers), and while a reader holds
// fewer than floor(Buckets/readers), the others give up what they hold
// beyond the floor (one a round) and nobody takes beyond it. Only free
// buckets are tried. Call it only between batches: a bucket it gives up may
// be read by another reader at once.
func (r *Reader) Rebalance(ctx context.Context) (Shares, error) {
	var sh Shares
	r.Queries("shares")
	var session bool
	if err := r.conn.QueryRow(ctx, queryShares, r.memb, r.key1).Scan(&session, &sh.Readers, &sh.Held, &sh.Fewest); err != nil {
		return sh, fmt.Errorf("poll mode: read the readers' shares: %w", err)
	}
	if !session {
		// The membership lock taken at Open is not this backend's: a
		// transaction pooler hands each statement to another server
		// session, and session locks (the buckets' fence) mean nothing.
		return sh, ErrNotSession
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
		r.Queries("unlock")
		if _, err := r.conn.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", r.key1, b); err != nil {
			return sh, fmt.Errorf("poll mode: give up bucket %d: %w", b, err)
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
			if err := r.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", r.key1, b).Scan(&got); err != nil {
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

// Read returns the unpublished rows of the buckets held, in the order of
// the sequence column, at most Batch rows and about BatchBytes.
func (r *Reader) Read(ctx context.Context) ([]Row, error) {
	if len(r.own) == 0 {
		return nil, nil
	}
	if r.query == "" {
		// The buckets are literals, not a parameter: the planner then sees
		// the same statement until the buckets change, and the simple
		// protocol (text values, as pgoutput sends them) takes no
		// parameters of arrays kindly.
		in := make([]string, len(r.own))
		for i, b := range r.own {
			in[i] = strconv.Itoa(b)
		}
		r.query = fmt.Sprintf(`SELECT %s AS "outbox.poll.seq", * FROM %s WHERE %s IS NULL AND (hashtext(%s::text) & 2147483647) %% %d IN (%s) ORDER BY %s LIMIT %d`,
			pgx.Identifier{r.seq}.Sanitize(), pgx.Identifier{r.cfg.Schema, r.cfg.Table}.Sanitize(), Published,
			pgx.Identifier{r.cfg.Key}.Sanitize(), r.cfg.Buckets, strings.Join(in, ","), pgx.Identifier{r.seq}.Sanitize(), r.cfg.Batch)
	}
	r.Queries("read")
	rows, err := r.conn.Query(ctx, r.query, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, fmt.Errorf("poll mode: read %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()[1:]
	var out []Row
	size := 0
	for rows.Next() {
		raw := rows.RawValues()
		seq, err := strconv.ParseInt(string(raw[0]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("poll mode: the sequence column %s holds %q: %w", r.seq, raw[0], err)
		}
		row := Row{Seq: seq, Fields: fields, Values: make([][]byte, len(fields))}
		for i, v := range raw[1:] {
			if v != nil {
				row.Values[i] = append([]byte{}, v...)
				size += len(v)
			}
		}
		out = append(out, row)
		if size >= r.cfg.BatchBytes {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("poll mode: read %s.%s: %w", r.cfg.Schema, r.cfg.Table, err)
	}
	return out, nil
}

// Mark records rows as published. It runs on the connection holding the
// buckets' locks: if that session is gone, so are the locks, and the mark
// fails (another reader may own the rows now and publish them again).
func (r *Reader) Mark(ctx context.Context, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	seqs := make([]int64, len(rows))
	for i, row := range rows {
		seqs[i] = row.Seq
	}
	r.Queries("mark")
	if _, err := r.conn.Exec(ctx, r.mark, seqs); err != nil {
		return fmt.Errorf("poll mode: mark %d rows of %s.%s published: %w", len(rows), r.cfg.Schema, r.cfg.Table, err)
	}
	return nil
}
