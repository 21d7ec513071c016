// Package backfill publishes outbox rows again on demand (connector
// backfill): the rows a time range, and optionally an aggregate type or an
// SQL condition, choose, through the router the connector routes with, while
// the connector goes on streaming. Events keep their ids, so consumers that
// deduplicate by id see each once. Progress (rows done of the total, the
// rate) is printed, and kept in public.outbox_backfill after every batch
// Kafka acknowledged: a run that is interrupted, even by kill -9, resumes
// after the last such batch when started again with the same selection.
package backfill

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
	schema "github.com/pgoutbox/pgoutbox/sql"
)

// Selection chooses the rows a backfill publishes.
type Selection struct {
	// Schema and Table name the outbox table.
	Schema, Table string
	// TimeColumn is the column the range applies to (created_at).
	TimeColumn string
	// IDColumn is the event id column (the router's FieldEventID): with
	// TimeColumn, the order rows are published in and the key a resumed
	// run continues after, unless the table has a sequence-filled column
	// (see orderColumn).
	IDColumn string
	// From and To are the range, From included, To excluded. A zero To is
	// the end a resumed run recorded, or now for a new one.
	From, To time.Time
	// TypeColumn and AggregateType, when AggregateType is set, keep only
	// the rows whose TypeColumn (the router's route-by column) equals it.
	TypeColumn, AggregateType string
	// Where is an SQL condition on the table's columns, ANDed; empty:
	// none. It is the operator's own SQL, run as the connector's role.
	Where string
}

// String is the selection as the progress row records it, without the end
// of the range (recorded apart): a resumed run must have the same.
func (s Selection) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table=%s.%s time=%s id=%s from=%s", s.Schema, s.Table, s.TimeColumn, s.IDColumn, s.From.UTC().Format(time.RFC3339Nano))
	if s.AggregateType != "" {
		fmt.Fprintf(&b, " %s=%q", s.TypeColumn, s.AggregateType)
	}
	if s.Where != "" {
		fmt.Fprintf(&b, " where=%q", s.Where)
	}
	return b.String()
}

// DefaultName names a selection's run when no name is given: the same
// selection, started again, resumes.
func DefaultName(s Selection) string {
	h := sha256.Sum256([]byte(s.String()))
	return "backfill-" + hex.EncodeToString(h[:6])
}

// column names a column of the outbox table, aliased t, as SQL spells it.
func column(c string) string { return "t." + pgx.Identifier{c}.Sanitize() }

// where is the selection's condition, with its parameters.
func (s Selection) where() (string, []any) {
	conds := []string{column(s.TimeColumn) + " >= $1", column(s.TimeColumn) + " < $2"}
	args := []any{s.From, s.To}
	if s.AggregateType != "" {
		args = append(args, s.AggregateType)
		conds = append(conds, fmt.Sprintf("%s = $%d", column(s.TypeColumn), len(args)))
	}
	if s.Where != "" {
		conds = append(conds, "("+s.Where+")")
	}
	return strings.Join(conds, " AND "), args
}

// Backfiller publishes a selection's rows with a router and a producer
// client.
type Backfiller struct {
	Pool   *pgxpool.Pool
	Router *route.Router
	Client *kgo.Client
	// MaxMessageBytes: a larger record is not produced (counted failed, as
	// the connector dead-letters it).
	MaxMessageBytes int
	// Batch is how many rows are read, published and recorded at a time
	// (default 1000).
	Batch int
	// Progress receives a line every Every (default 2s) and at the end.
	Progress io.Writer
	Every    time.Duration
	Log      *slog.Logger
	// TopicCreate, TopicPartitions, TopicReplication and TopicConfigs
	// create a missing topic as the connector would (OUTBOX_TOPIC_*).
	TopicCreate      bool
	TopicPartitions  int32
	TopicReplication int16
	TopicConfigs     map[string]*string

	topics map[string]bool
}

// Result is what a run did.
type Result struct {
	Name string
	// Total is the rows the selection had when the run (the first, for a
	// resumed one) began; Done those published, by every run of the name.
	Total, Done int64
	// Failed is rows this run could not route (or larger than
	// MaxMessageBytes): skipped, each logged with its id and why.
	Failed int64
	// Resumed: an earlier run of the name had published some.
	Resumed bool
}

// queryProgress reads a run's progress row.
const queryProgress = `SELECT selection, range_to, total, done, failed, last_key, coalesce(last_id, ''), finished_at IS NOT NULL FROM public.outbox_backfill WHERE name = $1`

// queryOrderColumn finds the column rows are published in the order of,
// as the initial snapshot does: an integer column filled at INSERT from a
// sequence the table owns handing out values one at a time (its value is
// taken at INSERT, so an aggregate's events written one after another have
// growing values, within a transaction and across). Empty: none.
const queryOrderColumn = `
SELECT coalesce((SELECT a.attname::text FROM pg_attribute a
                 JOIN pg_sequence q ON q.seqrelid = pg_get_serial_sequence($1, a.attname)::regclass
                 WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.atttypid IN ('int8'::regtype, 'int4'::regtype) AND q.seqcache = 1
                 ORDER BY a.attnum LIMIT 1), '')`

// queryColumnType is a column's type as SQL writes it (the keyset casts
// the recorded key back to it, so that it compares in the column's own
// type: a timestamp without time zone is never converted).
const queryColumnType = `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND attnum > 0 AND NOT attisdropped`

// Run publishes the rows of sel not yet published by a run named name
// (DefaultName(sel) when empty), and records the run finished.
func (b *Backfiller) Run(ctx context.Context, name string, sel Selection) (Result, error) {
	// PostgreSQL keeps microseconds: a range given with nanoseconds is
	// the same range, recorded and compared as PostgreSQL has it.
	sel.From, sel.To = sel.From.Truncate(time.Microsecond), sel.To.Truncate(time.Microsecond)
	if name == "" {
		name = DefaultName(sel)
	}
	res := Result{Name: name}
	if b.Batch <= 0 {
		b.Batch = 1000
	}
	if b.Every <= 0 {
		b.Every = 2 * time.Second
	}
	b.topics = map[string]bool{}
	if err := ensureTable(ctx, b.Pool); err != nil {
		return res, err
	}
	tbl := pgx.Identifier{sel.Schema, sel.Table}.Sanitize()
	var rangeTo time.Time
	var selection string
	// The key of the last row recorded done: the order column's value as
	// text, and the id as text.
	var lastKey *string
	var lastID string
	var finished bool
	err := b.Pool.QueryRow(ctx, queryProgress, name).Scan(&selection, &rangeTo, &res.Total, &res.Done, &res.Failed, &lastKey, &lastID, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if sel.To.IsZero() {
			sel.To = time.Now()
		}
		where, args := sel.where()
		if err := b.Pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl+" t WHERE "+where, args...).Scan(&res.Total); err != nil {
			return res, fmt.Errorf("count the rows to backfill (%s): %w", sel, err)
		}
		if _, err := b.Pool.Exec(ctx, `INSERT INTO public.outbox_backfill (name, selection, range_to, total) VALUES ($1, $2, $3, $4)`, name, sel.String(), sel.To, res.Total); err != nil {
			return res, fmt.Errorf("record backfill %q: %w", name, err)
		}
	case err != nil:
		return res, fmt.Errorf("read the progress of backfill %q: %w", name, err)
	case selection != sel.String() || !sel.To.IsZero() && !sel.To.Equal(rangeTo):
		return res, fmt.Errorf("backfill %q exists with another selection (%s, to %s); give this one another -name, or delete that one: DELETE FROM public.outbox_backfill WHERE name = '%s'",
			name, selection, rangeTo.UTC().Format(time.RFC3339Nano), name)
	case finished:
		fmt.Fprintf(b.Progress, "backfill %s: already finished (%d of %d rows); to run it again: DELETE FROM public.outbox_backfill WHERE name = '%s'\n", name, res.Done, res.Total, name)
		return res, nil
	default:
		sel.To = rangeTo
		res.Resumed = true
		b.Log.Info("resuming backfill after the last batch Kafka acknowledged", "name", name, "done", res.Done, "total", res.Total, "after_key", lastKey, "after_id", lastID)
	}

	where, args := sel.where()
	var relID uint32
	if err := b.Pool.QueryRow(ctx, "SELECT $1::regclass::oid", tbl).Scan(&relID); err != nil {
		return res, fmt.Errorf("find the outbox table %s: %w", tbl, err)
	}
	infos, err := wal.ColumnInfoOf(b.Pool)(ctx, relID)
	if err != nil {
		return res, err
	}
	var seqCol string
	if err := b.Pool.QueryRow(ctx, queryOrderColumn, tbl).Scan(&seqCol); err != nil {
		return res, fmt.Errorf("inspect %s for the backfill's order: %w", tbl, err)
	}
	// The order, and the key a resumed run continues after: the sequence
	// column (exact per aggregate), else the time column and the id (the
	// events of one transaction share their created_at, and come out in id
	// order then: not the order they were written in; the README says so).
	keyName, idCol := sel.TimeColumn, column(sel.IDColumn)
	if seqCol != "" {
		keyName = seqCol
	}
	var keyType string
	if err := b.Pool.QueryRow(ctx, queryColumnType, tbl, keyName).Scan(&keyType); err != nil {
		return res, fmt.Errorf("look up column %q of %s: %w", keyName, tbl, err)
	}
	keyCol := column(keyName)
	started, startDone := time.Now(), res.Done
	lastPrint := time.Now()
	report := func(final bool) {
		rate := float64(res.Done-startDone) / max(time.Since(started).Seconds(), 1e-3)
		pct := 100.0
		if res.Total > 0 {
			pct = 100 * float64(res.Done+res.Failed) / float64(res.Total)
		}
		state := ""
		if final {
			state = " done"
		}
		fmt.Fprintf(b.Progress, "backfill %s: %d of %d rows (%.1f%%), %.0f rows/s, %d failed%s\n", name, res.Done+res.Failed, res.Total, pct, rate, res.Failed, state)
	}
	for {
		page := where
		pargs := append([]any(nil), args...)
		if lastKey != nil {
			pargs = append(pargs, *lastKey, lastID)
			n := len(pargs)
			// The first condition lets an index on the key column bound
			// the scan; the second is the key.
			page += fmt.Sprintf(" AND %s >= $%d::%s AND (%s, %s::text) > ($%d::%s, $%d)", keyCol, n-1, keyType, keyCol, idCol, n-1, keyType, n)
		}
		sql := fmt.Sprintf(`SELECT t.*, %s::text AS "__backfill_key", %s::text AS "__backfill_id" FROM %s t WHERE %s ORDER BY %s, %s::text LIMIT %d`,
			keyCol, idCol, tbl, page, keyCol, idCol, b.Batch)
		before := res.Failed
		n, lk, lid, err := b.batch(ctx, sql, pargs, infos, sel, &res)
		if err != nil {
			return res, err
		}
		if n == 0 {
			break
		}
		res.Done += int64(n) - (res.Failed - before)
		lastKey, lastID = &lk, lid
		if _, err := b.Pool.Exec(ctx, `UPDATE public.outbox_backfill SET done = $2, failed = $3, last_key = $4, last_id = $5, updated_at = now() WHERE name = $1`,
			name, res.Done, res.Failed, lk, lid); err != nil {
			return res, fmt.Errorf("record the progress of backfill %q: %w", name, err)
		}
		if time.Since(lastPrint) >= b.Every {
			lastPrint = time.Now()
			report(false)
		}
		if n < b.Batch {
			break
		}
	}
	if _, err := b.Pool.Exec(ctx, `UPDATE public.outbox_backfill SET finished_at = now(), updated_at = now() WHERE name = $1`, name); err != nil {
		return res, fmt.Errorf("record backfill %q finished: %w", name, err)
	}
	report(true)
	return res, nil
}

// batch reads one page, publishes its rows and waits until Kafka acked
// them all; it returns how many rows the page had and the key of its last.
func (b *Backfiller) batch(ctx context.Context, sql string, args []any, infos map[string]*route.ColumnInfo, sel Selection, res *Result) (int, string, string, error) {
	// The simple protocol gives every value in text format, as pgoutput
	// does (wal.TextRow).
	rows, err := b.Pool.Query(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		return 0, "", "", fmt.Errorf("read rows to backfill (%s): %w", sel, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	cols := fields[:len(fields)-2]
	src := route.Source{Table: sel.Schema + "." + sel.Table}
	var recs []*kgo.Record
	n := 0
	var lastKey, lastID string
	for rows.Next() {
		raw := rows.RawValues()
		n++
		lastKey, lastID = string(raw[len(raw)-2]), string(raw[len(raw)-1])
		row := wal.TextRow(cols, raw[:len(cols)], infos, src)
		rec, err := b.Router.Route(ctx, row)
		if err == nil && b.MaxMessageBytes > 0 && len(rec.Key)+len(rec.Value) > b.MaxMessageBytes {
			err = fmt.Errorf("record of %d bytes is over OUTBOX_KAFKA_MAX_MESSAGE_BYTES=%d", len(rec.Key)+len(rec.Value), b.MaxMessageBytes)
		}
		if err != nil {
			res.Failed++
			b.Log.Warn("row not backfilled: it cannot be published (the connector dead-lettered it when it streamed it)", "id", lastID, "key", lastKey, "err", err)
			continue
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return 0, "", "", fmt.Errorf("read rows to backfill (%s): %w", sel, err)
	}
	rows.Close()
	for _, r := range recs {
		if err := b.ensureTopic(ctx, r.Topic); err != nil {
			return 0, "", "", err
		}
	}
	var failed []string
	var first error
	for _, r := range b.Client.ProduceSync(ctx, recs...) {
		if r.Err != nil {
			failed = append(failed, r.Record.Topic+" id "+inbox.Header(r.Record, "id"))
			first = cmp.Or(first, r.Err)
		}
	}
	if first != nil {
		// Nothing of the batch is recorded done: a new run publishes it
		// again. An error Kafka gives for one record every time (a topic
		// with a smaller max.message.bytes, a policy) stops every run
		// here; the ids say which.
		return 0, "", "", fmt.Errorf("publish a batch of the backfill (nothing of it recorded done; a new run resumes before it): %d records failed (%s): %w",
			len(failed), strings.Join(failed[:min(len(failed), 5)], ", "), first)
	}
	return n, lastKey, lastID, nil
}

// ensureTopic creates a topic the first time the run publishes to it, as
// the connector does (topics that exist are left as they are).
func (b *Backfiller) ensureTopic(ctx context.Context, topic string) error {
	if b.topics[topic] || !b.TopicCreate {
		return nil
	}
	resp, err := kadm.NewClient(b.Client).CreateTopic(ctx, b.TopicPartitions, b.TopicReplication, b.TopicConfigs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %q: %w", topic, err)
	}
	b.topics[topic] = true
	return nil
}

// ensureTable creates the progress table when sql/ was not applied and the
// role may.
func ensureTable(ctx context.Context, pool *pgxpool.Pool) error {
	for _, q := range schema.Statements("public.outbox_backfill") {
		if _, err := pool.Exec(ctx, q); err != nil {
			var exists bool
			if qerr := pool.QueryRow(ctx, `SELECT to_regclass('public.outbox_backfill') IS NOT NULL`).Scan(&exists); qerr == nil && exists {
				return nil
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return fmt.Errorf("create the backfill progress table public.outbox_backfill: %w", err)
			}
			return fmt.Errorf("the backfill progress table public.outbox_backfill is missing and this role cannot create it; apply sql/004_connector_state.sql: %w", err)
		}
	}
	return nil
}
