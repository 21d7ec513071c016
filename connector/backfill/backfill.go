// Package backfill publishes outbox rows again on demand (connector
// backfill): the rows a time range, and optionally an aggregate type or an
// SQL condition, choose, through the router the connector routes with, while
// the connector goes on streaming. Events keep their ids, so consumers that
// deduplicate by id see each once. Progress (rows done of the total, the
// rate) is printed, and kept in public.outbox_backfill after every batch
// Kafka acknowledged: a run that is interrupted, even by kill -9, resumes
// after the last such batch when started again with the same selection.
//
// A transient failure never becomes a hole: a row whose routing failed for
// a reason outside it (the schema registry) is retried, and the progress
// never moves past it; a row that cannot be published as it is (unroutable,
// too large) is recorded with its id and why in
// public.outbox_backfill_failed, in the transaction that moves the progress
// past it, and a run with such rows says so rather than "done".
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

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/internal/rowsecurity"
	"github.com/pgoutbox/pgoutbox/relay/publish"
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
	// MaxMessageBytes: a larger record (measured as the connector's
	// producer measures it, headers included: publish.RecordSize) is not
	// produced; it is recorded failed, as the connector dead-letters it.
	MaxMessageBytes int
	// Batch is how many rows are read, published and recorded at a time
	// (default 1000).
	Batch int
	// RetryFor is how long a row whose routing failed for a reason outside
	// it (the schema registry: route's Retryable classes) is retried, with
	// a capped backoff with jitter, before the run stops unfinished
	// (default 5m). The run's progress never moves past such a row: the
	// same command resumes before it.
	RetryFor time.Duration
	// RetryFailed publishes again, before anything else, the rows earlier
	// runs of the name recorded failed (public.outbox_backfill_failed),
	// routed with the current settings; those that go out are deleted
	// from there and counted done.
	RetryFailed bool
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

// The schedule a row whose routing failed for a passing reason is retried
// on (the connector's producer waits the same, without jitter: it is one).
const (
	retryFirst = 100 * time.Millisecond
	retryMost  = 10 * time.Second
)

// Result is what a run did.
type Result struct {
	Name string
	// Total is the rows the selection had when the run (the first, for a
	// resumed one) began; Done those published, by every run of the name.
	Total, Done int64
	// Failed is the rows of the run not published because they cannot be
	// as they are (unroutable, or larger than MaxMessageBytes): each is in
	// public.outbox_backfill_failed with its id and why, by every run of
	// the name, until -retry-failed publishes it.
	Failed int64
	// Retried is the failed rows this run published again (RetryFailed).
	Retried int64
	// Resumed: an earlier run of the name had published some.
	Resumed bool
	// Finished: the run read its range to the end (Failed rows excepted).
	Finished bool
}

// FailedTable is where a run's rows that could not be published are kept.
const FailedTable = "public.outbox_backfill_failed"

// FailedQuery is the query an operator runs to see a run's failed rows.
func FailedQuery(name string) string {
	return "SELECT id, reason FROM " + FailedTable + " WHERE name = " + sqlString(name)
}

// sqlString is s as an SQL string literal, for the commands the run prints.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

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

// The statements that record a page: its failed rows (again: the reason of
// the latest attempt), the failed rows it published (a -retry-failed page),
// and the run's counts, with the key of its last row when the page was of
// the range (NULL: a -retry-failed page leaves the key where it is). One
// transaction: the progress never moves past a row whose failure is not
// recorded, and failed is always the count of the run's rows in the table.
const (
	stmtRecordFailed = `INSERT INTO public.outbox_backfill_failed (name, id, reason) SELECT $1, f.id, f.reason FROM unnest($2::text[], $3::text[]) AS f(id, reason)
ON CONFLICT (name, id) DO UPDATE SET reason = excluded.reason, failed_at = now()`
	stmtForgetFailed = `DELETE FROM public.outbox_backfill_failed WHERE name = $1 AND id = ANY($2::text[])`
	stmtProgress     = `UPDATE public.outbox_backfill SET done = done + $2, failed = (SELECT count(*) FROM public.outbox_backfill_failed WHERE name = $1),
last_key = coalesce($3, last_key), last_id = coalesce($4, last_id), updated_at = now() WHERE name = $1 RETURNING done, failed`
	queryFailedIDs = `SELECT id FROM public.outbox_backfill_failed WHERE name = $1 AND id > $2 ORDER BY id LIMIT $3`
)

// Run publishes the rows of sel not yet published by a run named name
// (DefaultName(sel) when empty), and records the run finished. With
// RetryFailed it first publishes the rows earlier runs recorded failed.
// A run that finished with rows failed returns Failed > 0 and no error:
// the caller says so (it is not done).
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
	if b.RetryFor <= 0 {
		b.RetryFor = 5 * time.Minute
	}
	b.topics = map[string]bool{}
	tbl := pgx.Identifier{sel.Schema, sel.Table}.Sanitize()
	// Before anything is read or recorded: a policy hiding rows from this
	// role would make the run skip them and call itself finished.
	if err := rowsecurity.Check(ctx, b.Pool, tbl, "connector backfill"); err != nil {
		return res, err
	}
	if err := ensureTable(ctx, b.Pool); err != nil {
		return res, err
	}
	var rangeTo time.Time
	var selection string
	// The key of the last row recorded done: the order column's value as
	// text, and the id as text.
	var lastKey *string
	var lastID string
	err := b.Pool.QueryRow(ctx, queryProgress, name).Scan(&selection, &rangeTo, &res.Total, &res.Done, &res.Failed, &lastKey, &lastID, &res.Finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if b.RetryFailed {
			return res, fmt.Errorf("-retry-failed: there is no backfill named %q (%s) to retry the failed rows of; give the run's -name, or the flags it was started with", name, sel)
		}
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
		return res, fmt.Errorf("backfill %q exists with another selection (%s, to %s); give this one another -name, or delete that one: DELETE FROM public.outbox_backfill WHERE name = %s",
			name, selection, rangeTo.UTC().Format(time.RFC3339Nano), sqlString(name))
	case res.Finished && !b.RetryFailed:
		b.reportFinished(res)
		return res, nil
	default:
		sel.To = rangeTo
		res.Resumed = !res.Finished
	}

	r, err := b.inspect(ctx, name, sel, tbl)
	if err != nil {
		return res, err
	}
	r.res = &res
	if b.RetryFailed {
		if err := r.retryFailed(ctx); err != nil {
			return res, err
		}
		if res.Finished {
			fmt.Fprintf(b.Progress, "backfill %s: -retry-failed: %d published, %d still failed\n", name, res.Retried, res.Failed)
			b.reportFinished(res)
			return res, nil
		}
	}
	if res.Resumed {
		b.Log.Info("resuming backfill after the last batch Kafka acknowledged", "name", name, "done", res.Done, "failed", res.Failed, "total", res.Total, "after_key", lastKey, "after_id", lastID)
	}
	where, args := sel.where()
	started, startDone := time.Now(), res.Done
	lastPrint := time.Now()
	report := func(final bool) {
		rate := float64(res.Done-startDone) / max(time.Since(started).Seconds(), 1e-3)
		pct := 100.0
		if res.Total > 0 {
			pct = 100 * float64(res.Done+res.Failed) / float64(res.Total)
		}
		state := ""
		switch {
		case final && res.Failed == 0:
			state = "; done"
		case final:
			state = fmt.Sprintf("; finished, but %d not published: %s", res.Failed, b.failedHint(name))
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
			page += fmt.Sprintf(" AND %s >= $%d::%s AND (%s, %s::text) > ($%d::%s, $%d)", r.keyCol, n-1, r.keyType, r.keyCol, r.idCol, n-1, r.keyType, n)
		}
		p, err := r.publish(ctx, r.pageSQL(page), pargs)
		if err != nil {
			return res, err
		}
		if p.n == 0 {
			break
		}
		if err := r.record(ctx, p, true); err != nil {
			return res, err
		}
		lastKey, lastID = &p.lastKey, p.lastID
		if time.Since(lastPrint) >= b.Every {
			lastPrint = time.Now()
			report(false)
		}
		if p.n < b.Batch {
			break
		}
	}
	if _, err := b.Pool.Exec(ctx, `UPDATE public.outbox_backfill SET finished_at = now(), updated_at = now() WHERE name = $1`, name); err != nil {
		return res, fmt.Errorf("record backfill %q finished: %w", name, err)
	}
	res.Finished = true
	report(true)
	return res, nil
}

// failedHint says where a run's failed rows are and how to publish them.
func (b *Backfiller) failedHint(name string) string {
	return fmt.Sprintf("their ids and why are in %s (%s); once fixed, publish them with the same command and -retry-failed", FailedTable, FailedQuery(name))
}

// reportFinished is what a finished run prints when started again.
func (b *Backfiller) reportFinished(res Result) {
	again := "to run it again: DELETE FROM public.outbox_backfill WHERE name = " + sqlString(res.Name)
	if res.Failed == 0 {
		fmt.Fprintf(b.Progress, "backfill %s: already finished (%d of %d rows); %s\n", res.Name, res.Done, res.Total, again)
		return
	}
	fmt.Fprintf(b.Progress, "backfill %s: already finished, with %d of %d rows published and %d NOT published: %s; %s (the failed rows' record goes with it)\n",
		res.Name, res.Done, res.Total, res.Failed, b.failedHint(res.Name), again)
}

// run is a run's view of the outbox table.
type run struct {
	b    *Backfiller
	name string
	sel  Selection
	tbl  string
	// keyCol orders the rows and is the key a resumed run continues
	// after, with idCol; keyType is its type as SQL writes it.
	keyCol, keyType, idCol string
	infos                  map[string]*route.ColumnInfo
	res                    *Result
}

// inspect finds what reading the table needs: its columns, and the order.
func (b *Backfiller) inspect(ctx context.Context, name string, sel Selection, tbl string) (*run, error) {
	var relID uint32
	if err := b.Pool.QueryRow(ctx, "SELECT $1::regclass::oid", tbl).Scan(&relID); err != nil {
		return nil, fmt.Errorf("find the outbox table %s: %w", tbl, err)
	}
	infos, err := wal.ColumnInfoOf(b.Pool)(ctx, relID)
	if err != nil {
		return nil, err
	}
	var seqCol string
	if err := b.Pool.QueryRow(ctx, queryOrderColumn, tbl).Scan(&seqCol); err != nil {
		return nil, fmt.Errorf("inspect %s for the backfill's order: %w", tbl, err)
	}
	// The order, and the key a resumed run continues after: the sequence
	// column (exact per aggregate), else the time column and the id (the
	// events of one transaction share their created_at, and come out in id
	// order then: not the order they were written in; the README says so).
	keyName := sel.TimeColumn
	if seqCol != "" {
		keyName = seqCol
	}
	r := &run{b: b, name: name, sel: sel, tbl: tbl, keyCol: column(keyName), idCol: column(sel.IDColumn), infos: infos}
	if err := b.Pool.QueryRow(ctx, queryColumnType, tbl, keyName).Scan(&r.keyType); err != nil {
		return nil, fmt.Errorf("look up column %q of %s: %w", keyName, tbl, err)
	}
	return r, nil
}

// pageSQL reads the rows cond chooses, in the run's order, a batch at most,
// with the key and the id as text after the table's columns.
func (r *run) pageSQL(cond string) string {
	return fmt.Sprintf(`SELECT t.*, %s::text AS "__backfill_key", %s::text AS "__backfill_id" FROM %s t WHERE %s ORDER BY %s, %s::text LIMIT %d`,
		r.keyCol, r.idCol, r.tbl, cond, r.keyCol, r.idCol, r.b.Batch)
}

// retryFailed publishes again the rows recorded failed, a batch at a time
// in id order; those that fail again stay, with the new reason.
func (r *run) retryFailed(ctx context.Context) error {
	after := ""
	for {
		rows, err := r.b.Pool.Query(ctx, queryFailedIDs, r.name, after, r.b.Batch)
		if err != nil {
			return fmt.Errorf("read the failed rows of backfill %q: %w", r.name, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read the failed rows of backfill %q: %w", r.name, err)
		}
		if len(ids) == 0 {
			return nil
		}
		after = ids[len(ids)-1]
		p, err := r.publish(ctx, r.pageSQL(r.idCol+"::text = ANY($1::text[])"), []any{ids})
		if err != nil {
			return err
		}
		if p.n < len(ids) {
			found := make(map[string]bool, p.n)
			for _, id := range p.published {
				found[id] = true
			}
			for _, f := range p.failed {
				found[f.id] = true
			}
			for _, id := range ids {
				if !found[id] {
					r.b.Log.Warn("a failed row of the backfill is no longer in the outbox table; it stays recorded failed (delete it from "+FailedTable+" once dealt with)", "name", r.name, "id", id)
				}
			}
		}
		before := r.res.Done
		if err := r.record(ctx, p, false); err != nil {
			return err
		}
		r.res.Retried += r.res.Done - before
		if len(ids) < r.b.Batch {
			return nil
		}
	}
}

// failure is a row that cannot be published as it is, and why.
type failure struct{ id, reason string }

// page is what publishing one page of rows did.
type page struct {
	// n is the rows read; lastKey and lastID the key of the last.
	n               int
	lastKey, lastID string
	// published are the ids Kafka acknowledged (or the router skips on
	// purpose); failed the rows that cannot be published as they are.
	published []string
	failed    []failure
}

// record writes what a page did: see stmtProgress. advance: the page was
// of the range, and the run continues after its last row.
func (r *run) record(ctx context.Context, p page, advance bool) error {
	ids, reasons := make([]string, len(p.failed)), make([]string, len(p.failed))
	for i, f := range p.failed {
		ids[i], reasons[i] = f.id, f.reason
	}
	var key, id *string
	if advance {
		key, id = &p.lastKey, &p.lastID
	}
	err := pgx.BeginFunc(ctx, r.b.Pool, func(tx pgx.Tx) error {
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, stmtRecordFailed, r.name, ids, reasons); err != nil {
				return err
			}
		}
		if !advance && len(p.published) > 0 {
			if _, err := tx.Exec(ctx, stmtForgetFailed, r.name, p.published); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, stmtProgress, r.name, len(p.published), key, id).Scan(&r.res.Done, &r.res.Failed)
	})
	if err != nil {
		return fmt.Errorf("record the progress of backfill %q (%d rows published, %d failed, not recorded: a new run publishes them again): %w", r.name, len(p.published), len(p.failed), err)
	}
	return nil
}

// publish reads one page, routes its rows, publishes them and waits until
// Kafka acked them all. A row that cannot be published as it is comes back
// failed, for the caller to record; an error (Kafka's, the database's, a
// row whose routing failed for a passing reason longer than RetryFor)
// stops the run with nothing of the page recorded: a new run publishes it
// again.
func (r *run) publish(ctx context.Context, sql string, args []any) (page, error) {
	b, sel := r.b, r.sel
	var p page
	// The simple protocol gives every value in text format, as pgoutput
	// does (wal.TextRow).
	rows, err := b.Pool.Query(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	if err != nil {
		return p, fmt.Errorf("read rows to backfill (%s): %w", sel, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	cols := fields[:len(fields)-2]
	src := route.Source{Table: sel.Schema + "." + sel.Table}
	var recs []*kgo.Record
	var ids []string
	for rows.Next() {
		raw := rows.RawValues()
		p.n++
		p.lastKey, p.lastID = string(raw[len(raw)-2]), string(raw[len(raw)-1])
		row := wal.TextRow(cols, raw[:len(cols)], r.infos, src)
		rec, err := b.route(ctx, row, p.lastID)
		if err == nil && b.MaxMessageBytes > 0 {
			if size := publish.RecordSize(rec); size > b.MaxMessageBytes {
				err = &route.Error{Class: route.ClassTooLarge, Msg: fmt.Sprintf("record of about %d bytes (headers included) is over the %d-byte limit (OUTBOX_KAFKA_MAX_MESSAGE_BYTES)", size, b.MaxMessageBytes)}
			}
		}
		switch class := route.ClassOf(err); {
		case err == nil:
			recs, ids = append(recs, rec), append(ids, p.lastID)
		case class.Skip():
			// Debezium's router drops such a row on purpose: nothing to
			// publish, nothing failed.
			p.published = append(p.published, p.lastID)
		case class != "" && !class.Retryable():
			p.failed = append(p.failed, failure{p.lastID, err.Error()})
			b.Log.Warn("row not backfilled: it cannot be published as it is (the connector dead-lettered it when it streamed it); recorded in "+FailedTable,
				"name", r.name, "id", p.lastID, "key", p.lastKey, "err", err)
		default:
			return page{}, fmt.Errorf("backfill row id %s (nothing of its batch recorded done; the same command resumes before it): %w", p.lastID, err)
		}
	}
	if err := rows.Err(); err != nil {
		return page{}, fmt.Errorf("read rows to backfill (%s): %w", sel, err)
	}
	rows.Close()
	for _, rec := range recs {
		if err := b.ensureTopic(ctx, rec.Topic); err != nil {
			return page{}, err
		}
	}
	var failed []string
	var first error
	for _, pr := range b.Client.ProduceSync(ctx, recs...) {
		if pr.Err != nil {
			failed = append(failed, pr.Record.Topic+" id "+inbox.Header(pr.Record, "id"))
			first = cmp.Or(first, pr.Err)
		}
	}
	if first != nil {
		// Nothing of the batch is recorded done: a new run publishes it
		// again. An error Kafka gives for one record every time (a topic
		// with a smaller max.message.bytes, a policy) stops every run
		// here; the ids say which.
		return page{}, fmt.Errorf("publish a batch of the backfill (nothing of it recorded done; a new run resumes before it): %d records failed (%s): %w",
			len(failed), strings.Join(failed[:min(len(failed), 5)], ", "), first)
	}
	p.published = append(p.published, ids...)
	return p, nil
}

// route routes a row; a failure the row is not the cause of (the schema
// registry's: route's Retryable classes) is retried with a capped backoff
// with jitter for RetryFor at most, and then returned, still of its
// retryable class, which stops the run before the row.
func (b *Backfiller) route(ctx context.Context, row *route.Row, id string) (*kgo.Record, error) {
	var wait *backoff.ExponentialBackOff
	var since time.Time
	for {
		rec, err := b.Router.Route(ctx, row)
		if err == nil || !route.IsRetryable(err) {
			return rec, err
		}
		if wait == nil {
			wait, since = retry.Jittered(retryFirst, retryMost), time.Now()
		}
		if waited := time.Since(since); waited >= b.RetryFor {
			return nil, fmt.Errorf("retried for %s (-retry-for), and it still fails: %w", waited.Round(time.Second), err)
		}
		d := wait.NextBackOff()
		if route.ClassOf(err) == route.ClassSchemaRejected {
			// Not the registry's outage: its answer, which only an
			// operator changes. Say so loudly.
			b.Log.Error("the schema registry refused the event's schema; retrying until it is changed", "id", id, "err", err, "backoff", d)
		} else {
			b.Log.Warn("routing needs the schema registry, which failed; retrying", "id", id, "err", err, "backoff", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (while waiting to retry: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
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

// ensureTable creates the progress table and the failed rows' table when
// sql/ was not applied and the role may.
func ensureTable(ctx context.Context, pool *pgxpool.Pool) error {
	for _, table := range []string{"public.outbox_backfill", FailedTable} {
		if err := ensure(ctx, pool, table); err != nil {
			return err
		}
	}
	return nil
}

func ensure(ctx context.Context, pool *pgxpool.Pool, table string) error {
	for _, q := range schema.Statements(table) {
		if _, err := pool.Exec(ctx, q); err != nil {
			var exists bool
			if qerr := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); qerr == nil && exists {
				return nil
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return fmt.Errorf("create the backfill table %s: %w", table, err)
			}
			return fmt.Errorf("the backfill table %s is missing and this role cannot create it; apply sql/004_connector_state.sql and sql/005_roles.sql: %w", table, err)
		}
	}
	return nil
}
