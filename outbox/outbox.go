// Package outbox writes events into PostgreSQL's transactional outbox inside
// the caller's transaction, so that an event exists if and only if the
// business change it describes committed. The connector (this module's relay)
// reads the committed events from the WAL and publishes them to Kafka: topic
// outbox.event.<AggregateType>, key AggregateID, header id = the event id.
//
// A Writer takes the caller's transaction and nothing else: a pgx.Tx
// (pgx's, pgxpool's, or a savepoint of either) through Write, a
// database/sql *sql.Tx through WriteSQL. A pool or a bare connection would
// commit the event on its own, a phantom when the business transaction rolls
// back, so the compiler refuses them.
// Event ids are UUIDv7 unless the caller sets one; payloads are marshalled to
// JSON. Three modes put the same records into Kafka:
//
//   - ModeTable (the default) inserts rows into the outbox table. Delete old
//     rows with Cleaner, or use the daily-partitioned table of
//     sql/variants/outbox_partitioned.sql and drop whole partitions with
//     package outbox/partition.
//   - ModeDeleteAfterInsert inserts the rows and deletes them again in the
//     same transaction. The WAL still carries the inserts (which is all the
//     connector reads); the table stays empty and needs no cleanup. The
//     connector's initial snapshot of a new slot then finds nothing, which is
//     right: nothing was ever pending in the table.
//   - ModeMessage writes no table at all: each event is a transactional
//     logical decoding message, pg_logical_emit_message(true, 'outbox', …),
//     decoded by the connector into the same record (PostgreSQL 14+). It is
//     refused while a poll-mode relay may be reading the outbox (see
//     Config.Table), since that relay never reads the WAL.
//
// Delivery is at-least-once: consumers deduplicate by the id header (package
// inbox does).
package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Mode says how events reach the WAL.
type Mode int

const (
	// ModeTable inserts one row per event into the outbox table (default).
	ModeTable Mode = iota
	// ModeDeleteAfterInsert inserts the rows and deletes them in the same
	// transaction: the WAL keeps the inserts, the table stays empty.
	ModeDeleteAfterInsert
	// ModeMessage emits pg_logical_emit_message(true, 'outbox', content)
	// instead of writing a table (PostgreSQL 14+, connector with messages on).
	ModeMessage
)

// String names the mode as ParseMode accepts it.
func (m Mode) String() string {
	switch m {
	case ModeTable:
		return "table"
	case ModeDeleteAfterInsert:
		return "delete-after-insert"
	case ModeMessage:
		return "message"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode parses "table", "delete-after-insert" or "message".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeTable, ModeDeleteAfterInsert, ModeMessage} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("outbox mode %q: want table, delete-after-insert or message", s)
}

// MessagePrefix is the logical decoding message prefix the connector decodes.
const MessagePrefix = "outbox"

// Event is one outbox event.
type Event struct {
	// ID is the event id, sent as the Kafka header id. Zero: a new UUIDv7
	// (time-ordered, so the outbox's primary key index stays compact).
	ID uuid.UUID
	// AggregateType names the topic: outbox.event.<AggregateType>.
	AggregateType string
	// AggregateID is the record key; events of one aggregate keep their
	// commit order in one partition.
	AggregateID string
	// Type is the event type (e.g. "OrderPlaced").
	Type string
	// Payload is marshalled with encoding/json; json.RawMessage and []byte
	// are taken as JSON text already (and must be valid JSON). nil is NULL.
	Payload any
	// Columns are extra outbox columns (column name -> value), written as
	// they are in the table modes and as JSON members in ModeMessage. The
	// connector places them as headers or envelope fields with
	// OUTBOX_ROUTE_FIELDS_ADDITIONAL_PLACEMENT (e.g. "tenant:header"); the
	// columns must exist in the table modes. created_at may be set here.
	// A message (ModeMessage) carries only the columns set: set a placed
	// column on every event, as a table row would always have it (or run
	// the connector with OUTBOX_ROUTE_FIELD_ADDITIONAL_MISSING=ignore).
	Columns map[string]any
}

// Execer is what Cleaner.DeleteExpired needs: a *pgxpool.Pool or a *pgx.Conn
// outside a transaction, so that each batch commits on its own. Write does
// not take it: it takes the business change's pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Writer writes events. The zero value is not usable; call New. A Writer is
// safe for concurrent use.
type Writer struct {
	table  string // quoted, schema-qualified
	mode   Mode
	prefix string
	newID  func() (uuid.UUID, error)
	// traceColumn is Config.TraceColumn ("" when off).
	traceColumn string
	// traceColumnState is what the first traced write found: whether the
	// table has traceColumn (columnUnknown until then).
	traceColumnState atomic.Int32
}

// The states of Writer.traceColumnState.
const (
	columnUnknown int32 = iota
	columnPresent
	columnAbsent
)

// traceColumnProbe asks whether a table (to_regclass of the quoted name)
// has a column.
const traceColumnProbe = `SELECT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped)`

// traceFor is the trace context to write with, "" when there is none or
// the table cannot hold it. The first traced write of a table-mode Writer
// looks the column up in the caller's transaction (probe) and remembers the
// answer: a table made before the column takes traced writes without their
// trace (logged once) instead of failing them, since the trace is not the
// event. A column added later is used after a restart.
func (w *Writer) traceFor(ctx context.Context, probe func(sql string, args ...any) (bool, error)) (string, error) {
	tc := w.traceContext(ctx)
	if tc == "" || w.mode == ModeMessage {
		return tc, nil
	}
	switch w.traceColumnState.Load() {
	case columnPresent:
		return tc, nil
	case columnAbsent:
		return "", nil
	}
	ok, err := probe(traceColumnProbe, w.table, w.traceColumn)
	if err != nil {
		return "", fmt.Errorf("outbox: look up the trace context column %s of %s: %w", w.traceColumn, w.table, err)
	}
	if ok {
		w.traceColumnState.Store(columnPresent)
		return tc, nil
	}
	if w.traceColumnState.CompareAndSwap(columnUnknown, columnAbsent) {
		slog.Default().Warn("outbox: the table has no trace context column; events are written without the caller's trace (add the column, sql/001_outbox.sql, and restart to carry it, or set outbox.Config.TraceColumn to outbox.TraceColumnOff)",
			"table", w.table, "column", w.traceColumn)
	}
	return "", nil
}

// Config configures a Writer. The zero Config is table mode on
// public.outbox with UUIDv7 ids.
type Config struct {
	// Table is the outbox table, "schema.name" or "name" (default
	// "public.outbox"): the table the connector reads (its OUTBOX_TABLE).
	// ModeMessage writes no row, but refuses to emit a message while this
	// table or public.outbox (the connector's default, whatever Table says)
	// is prepared for the connector's poll mode (it has published_at,
	// sql/variants/outbox_poll.sql): a poll-mode relay reads the table and
	// never the WAL, so the message would never be published.
	Table string
	// Mode is the mode (default ModeTable).
	Mode Mode
	// NewID is the generator of ids for events without one (default
	// uuid.NewV7).
	NewID func() (uuid.UUID, error)
	// TraceColumn is the column (a JSON member in ModeMessage) that
	// receives the caller's W3C trace context, taken from ctx with
	// OpenTelemetry's propagation.TraceContext, as the java.util.Properties
	// text Debezium's outbox extensions write (traceparent=… and
	// tracestate=… lines); the connector turns it into the record's
	// traceparent and tracestate headers. Default "tracingspancontext",
	// Debezium's tracing.span.context.field; TraceColumnOff never writes
	// it. Only a ctx carrying a valid span context writes the column, so
	// an untraced write never names it. The first traced write looks the
	// column up; a table without it takes traced writes without their
	// trace, logged once (the trace is not the event: the write must not
	// fail for it). ErrNoTraceColumn is left for a column dropped while
	// the Writer ran. An event whose Columns set the column keeps its own
	// value.
	TraceColumn string
}

// TraceColumnOff as Config.TraceColumn turns the trace context column off.
const TraceColumnOff = "-"

// defaultTable is Config.Table's default, quoted: the connector's default
// OUTBOX_TABLE too.
const defaultTable = `"public"."outbox"`

// DefaultTraceColumn is Config.TraceColumn's default, the column Debezium's
// tracing reads (tracing.span.context.field).
const DefaultTraceColumn = "tracingspancontext"

// ErrNoTraceColumn is Write's error (wrapped) for a traced write into a
// table that lost Config.TraceColumn after the Writer found it there.
var ErrNoTraceColumn = errors.New("the outbox table has no trace context column")

// New validates cfg and returns a Writer for it.
func New(cfg Config) (*Writer, error) {
	w := &Writer{table: defaultTable, mode: cfg.Mode, prefix: MessagePrefix, newID: uuid.NewV7, traceColumn: DefaultTraceColumn}
	switch cfg.TraceColumn {
	case "":
	case TraceColumnOff:
		w.traceColumn = ""
	default:
		if !identRE.MatchString(cfg.TraceColumn) || isBase(cfg.TraceColumn) {
			return nil, fmt.Errorf("outbox: trace column %q: want a plain identifier that is not one of %v", cfg.TraceColumn, baseColumns)
		}
		w.traceColumn = cfg.TraceColumn
	}
	if cfg.Table != "" {
		q, err := QuoteTable(cfg.Table)
		if err != nil {
			return nil, err
		}
		w.table = q
	}
	if cfg.Mode < ModeTable || cfg.Mode > ModeMessage {
		return nil, fmt.Errorf("outbox: unknown mode %d", int(cfg.Mode))
	}
	if cfg.NewID != nil {
		w.newID = cfg.NewID
	}
	return w, nil
}

// Mode is the writer's mode.
func (w *Writer) Mode() Mode { return w.mode }

var defaultWriter, _ = New(Config{})

// Write writes events in tx with the default Writer (table mode,
// public.outbox).
func Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	return defaultWriter.Write(ctx, tx, events...)
}

// WriteSQL writes events in the database/sql transaction tx with the
// default Writer.
func WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]uuid.UUID, error) {
	return defaultWriter.WriteSQL(ctx, tx, events...)
}

// maxParams keeps a multi-row INSERT well below PostgreSQL's
// 65535 bind parameters, whatever the number of extra columns.
const maxParams = 60000

// Write writes events in tx (in order) and returns their ids. Nothing is
// visible to the connector until tx commits; if tx rolls back, no event.
//
// tx is the business change's transaction (pgx.Tx; pgxpool.Tx and a
// savepoint's pgx.Tx are ones too). A *pgxpool.Pool or a *pgx.Conn does not
// compile: each would commit the event by itself. A tx that already ended is
// refused by pgx (pgx.ErrTxClosed) and nothing is written.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, errNoTx
	}
	tc, err := w.traceFor(ctx, func(q string, args ...any) (ok bool, err error) {
		err = tx.QueryRow(ctx, q, args...).Scan(&ok)
		return ok, err
	})
	if err != nil {
		return nil, err
	}
	stmts, ids, err := w.build(tc, events)
	if err != nil {
		return nil, err
	}
	if len(stmts) > 1 {
		// One round trip for delete-after-insert (or a long batch).
		batch := &pgx.Batch{}
		for _, s := range stmts {
			batch.Queue(s.sql, s.args...)
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return nil, w.writeErr(len(events), stmts[0], err)
		}
		return ids, nil
	}
	for _, s := range stmts {
		tag, err := tx.Exec(ctx, s.sql, s.args...)
		if err != nil {
			return nil, w.writeErr(len(events), s, err)
		}
		if s.guarded && tag.RowsAffected() == 0 {
			return nil, w.errPollMode(func(q string, args ...any) (name string, err error) {
				err = tx.QueryRow(ctx, q, args...).Scan(&name)
				return name, err
			})
		}
	}
	return ids, nil
}

// errNoTx is returned for a nil transaction (an interface holding nil would
// panic deeper down).
var errNoTx = errors.New("outbox: no transaction; pass the business change's transaction (pgx.Tx, or *sql.Tx to WriteSQL)")

// WriteSQL is Write for database/sql: tx is the business change's *sql.Tx.
// A *sql.DB or *sql.Conn does not compile (each would commit the event by
// itself); a tx that already ended is refused by database/sql
// (sql.ErrTxDone) and nothing is written.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, errNoTx
	}
	tc, err := w.traceFor(ctx, func(q string, args ...any) (ok bool, err error) {
		err = tx.QueryRowContext(ctx, q, args...).Scan(&ok)
		return ok, err
	})
	if err != nil {
		return nil, err
	}
	stmts, ids, err := w.build(tc, events)
	if err != nil {
		return nil, err
	}
	for _, s := range stmts {
		res, err := tx.ExecContext(ctx, s.sql, s.args...)
		if err != nil {
			return nil, w.writeErr(len(events), s, err)
		}
		if s.guarded {
			if n, err := res.RowsAffected(); err == nil && n == 0 {
				return nil, w.errPollMode(func(q string, args ...any) (name string, err error) {
					err = tx.QueryRowContext(ctx, q, args...).Scan(&name)
					return name, err
				})
			}
		}
	}
	return ids, nil
}

type statement struct {
	sql  string
	args []any
	// guarded: a statement that returns no row when it refused to write
	// (see pollGuard).
	guarded bool
	// traced: the statement names the trace context column.
	traced bool
}

// writeErr wraps a failed statement's error; an insert that named the trace
// context column into a table without it says which fix there is.
func (w *Writer) writeErr(n int, s statement, err error) error {
	var pgErr *pgconn.PgError
	if s.traced && errors.As(err, &pgErr) && pgErr.Code == "42703" && strings.Contains(pgErr.Message, `"`+w.traceColumn+`"`) {
		return fmt.Errorf("outbox: write %d events: %w: %s has no column %s for the caller's trace context; add it (sql/001_outbox.sql: %s text) or set outbox.Config.TraceColumn to outbox.TraceColumnOff: %w",
			n, ErrNoTraceColumn, w.table, w.traceColumn, w.traceColumn, err)
	}
	return fmt.Errorf("outbox: write %d events: %w", n, err)
}

// traceContext is the W3C trace context of ctx as the java.util.Properties
// text Debezium's outbox extensions store (Properties.store without its date
// comment), or "" when ctx carries no valid span context or the column is
// off. The propagator is propagation.TraceContext itself, not the global
// one: the column's format is W3C's whatever else the process propagates.
func (w *Writer) traceContext(ctx context.Context) string {
	if w.traceColumn == "" || !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	tp := carrier.Get("traceparent")
	if tp == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString("traceparent=")
	b.WriteString(escapeProp(tp))
	b.WriteByte('\n')
	if ts := carrier.Get("tracestate"); ts != "" {
		b.WriteString("tracestate=")
		b.WriteString(escapeProp(ts))
		b.WriteByte('\n')
	}
	return b.String()
}

// escapeProp escapes a value as Properties.store does (saveConvert):
// tracestate's "key=value" pairs have '=' in them.
func escapeProp(v string) string {
	if !strings.ContainsAny(v, "\\=:#!") {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if strings.IndexByte("\\=:#!", v[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// statements is build with ctx's trace context, as if the table had the
// column (the statement tests).
func (w *Writer) statements(ctx context.Context, events []Event) ([]statement, []uuid.UUID, error) {
	return w.build(w.traceContext(ctx), events)
}

// build makes the statements of one write. tc is the trace context of the
// whole write (the events are the caller's span's); an event that sets the
// column itself keeps its value.
func (w *Writer) build(tc string, events []Event) ([]statement, []uuid.UUID, error) {
	if len(events) == 0 {
		return nil, nil, nil
	}
	ids := make([]uuid.UUID, len(events))
	payloads := make([]any, len(events))
	for i := range events {
		ev := &events[i]
		if ev.AggregateType == "" || ev.AggregateID == "" || ev.Type == "" {
			return nil, nil, fmt.Errorf("outbox: event %d: AggregateType, AggregateID and Type are required", i)
		}
		id := ev.ID
		if id == uuid.Nil {
			var err error
			if id, err = w.newID(); err != nil {
				return nil, nil, fmt.Errorf("outbox: new event id: %w", err)
			}
		}
		ids[i] = id
		p, err := marshalPayload(ev.Payload)
		if err != nil {
			return nil, nil, fmt.Errorf("outbox: event %d (%s): %w", i, ev.Type, err)
		}
		payloads[i] = p
	}
	if w.mode == ModeMessage {
		s, err := w.messageStatement(events, ids, payloads, tc)
		if err != nil {
			return nil, nil, err
		}
		return []statement{s}, ids, nil
	}
	stmts, err := w.insertStatements(events, ids, payloads, tc)
	if err != nil {
		return nil, nil, err
	}
	if w.mode == ModeDeleteAfterInsert {
		// A second statement: rows a statement inserts are invisible to a
		// DELETE in the same statement (a data-modifying CTE sees the
		// snapshot from before it), so one statement cannot do both.
		if len(ids) == 1 {
			stmts = append(stmts, statement{sql: "DELETE FROM " + w.table + " WHERE id = $1", args: []any{ids[0].String()}})
		} else {
			strs := make([]string, len(ids))
			for i, id := range ids {
				strs[i] = id.String()
			}
			stmts = append(stmts, statement{sql: "DELETE FROM " + w.table + " WHERE id = ANY($1::uuid[])", args: []any{strs}})
		}
	}
	return stmts, ids, nil
}

var baseColumns = []string{"id", "aggregatetype", "aggregateid", "type", "payload"}

func (w *Writer) insertStatements(events []Event, ids []uuid.UUID, payloads []any, tc string) ([]statement, error) {
	// The union of extra columns, sorted so that the statement text (and
	// with it pgx's prepared statement cache) is stable. The trace column
	// is one only for a traced write: an untraced one never names it, so
	// a table without it takes every untraced write.
	extraSet := map[string]bool{}
	if tc != "" {
		extraSet[w.traceColumn] = true
	}
	for _, ev := range events {
		for c := range ev.Columns {
			if !extraSet[c] {
				if isBase(c) {
					return nil, fmt.Errorf("outbox: extra column %q is set by the Event's fields", c)
				}
				extraSet[c] = true
			}
		}
	}
	extra := make([]string, 0, len(extraSet))
	for c := range extraSet {
		extra = append(extra, c)
	}
	sort.Strings(extra)
	var head strings.Builder
	head.WriteString("INSERT INTO ")
	head.WriteString(w.table)
	head.WriteString(" (id, aggregatetype, aggregateid, type, payload")
	for _, c := range extra {
		head.WriteString(", ")
		head.WriteString(pgx.Identifier{c}.Sanitize())
	}
	head.WriteString(") VALUES ")
	perRow := len(baseColumns) + len(extra)
	rowsPer := maxParams / perRow
	var stmts []statement
	for start := 0; start < len(events); start += rowsPer {
		end := min(start+rowsPer, len(events))
		var b strings.Builder
		b.WriteString(head.String())
		args := make([]any, 0, (end-start)*perRow)
		for i := start; i < end; i++ {
			if i > start {
				b.WriteString(", ")
			}
			b.WriteByte('(')
			args = append(args, ids[i].String(), events[i].AggregateType, events[i].AggregateID, events[i].Type, payloads[i])
			for k := 0; k < len(baseColumns); k++ {
				if k > 0 {
					b.WriteString(", ")
				}
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(len(args) - len(baseColumns) + k + 1))
			}
			for _, c := range extra {
				v, ok := events[i].Columns[c]
				if !ok && tc != "" && c == w.traceColumn {
					v, ok = tc, true
				}
				if !ok {
					b.WriteString(", DEFAULT")
					continue
				}
				args = append(args, v)
				b.WriteString(", $")
				b.WriteString(strconv.Itoa(len(args)))
			}
			b.WriteByte(')')
		}
		stmts = append(stmts, statement{sql: b.String(), args: args, traced: tc != ""})
	}
	return stmts, nil
}

// messageStatement emits one message per event, in order, in one statement.
// The content goes through jsonb so that its text (the payload in
// particular) is exactly what a jsonb outbox column would have carried:
// the records are byte-for-byte those of the table modes.
func (w *Writer) messageStatement(events []Event, ids []uuid.UUID, payloads []any, tc string) (statement, error) {
	contents := make([]string, len(events))
	for i, ev := range events {
		m := map[string]any{
			"id": ids[i].String(), "aggregatetype": ev.AggregateType, "aggregateid": ev.AggregateID,
			"type": ev.Type, "payload": nil,
		}
		if p, ok := payloads[i].(string); ok {
			m["payload"] = json.RawMessage(p)
		}
		if tc != "" {
			m[w.traceColumn] = tc // an event's own Columns value wins, below
		}
		for c, v := range ev.Columns {
			if isBase(c) {
				return statement{}, fmt.Errorf("outbox: extra column %q is set by the Event's fields", c)
			}
			m[c] = v
		}
		b, err := json.Marshal(m)
		if err != nil {
			return statement{}, fmt.Errorf("outbox: event %d (%s): encode message: %w", i, ev.Type, err)
		}
		contents[i] = string(b)
	}
	// Emitted only where no poll-mode relay reads the outbox table (see
	// pollGuard): then the statement returns no row, and Write says why.
	if len(contents) == 1 {
		return statement{"SELECT pg_logical_emit_message(true, $1, $2::jsonb::text) WHERE " + pollGuard(3), []any{w.prefix, contents[0], w.table, defaultTable}, true, false}, nil
	}
	// unnest WITH ORDINALITY ... ORDER BY keeps the caller's order.
	return statement{`SELECT count(pg_logical_emit_message(true, $1, m::jsonb::text))
FROM (SELECT m FROM unnest($2::text[]) WITH ORDINALITY AS u(m, n) ORDER BY n) AS s WHERE ` + pollGuard(3) + ` HAVING count(*) > 0`, []any{w.prefix, contents, w.table, defaultTable}, true, false}, nil
}

// pollGuard is true unless an outbox table a relay may read, Config.Table
// (parameter $n) or the connector's default public.outbox ($n+1), is
// prepared for the connector's poll mode (sql/variants/outbox_poll.sql adds
// published_at): a poll-mode relay reads the table, never the WAL, so a
// message would be lost. A message has no table of its own, so Config.Table
// alone would let a Writer whose Table names another table emit messages no
// relay reads, while the default one is polled. A poll relay whose
// OUTBOX_TABLE is neither is not seen: set Config.Table to it (every table
// of the database with the variant would refuse the messages of services
// whose WAL relays share the database with another service's poll relay).
// The tables are looked up by name in the catalog, not with to_regclass,
// which needs USAGE on their schema: a writer's role without it on public
// failed every message. A few lookups by the catalog's indexes, from the
// server's cache.
func pollGuard(n int) string {
	return fmt.Sprintf("NOT EXISTS (%s)", preparedTables(fmt.Sprintf("ARRAY[$%d, $%d]", n, n+1)))
}

// preparedTables is the query of the tables among names (an SQL text[] of
// quoted schema.name, as QuoteTable writes them) that have published_at,
// with their position in names.
func preparedTables(names string) string {
	return `SELECT u.t, u.n FROM unnest(` + names + `) WITH ORDINALITY AS u(t, n)
	JOIN pg_namespace s ON s.nspname = (parse_ident(u.t))[1]
	JOIN pg_class c ON c.relnamespace = s.oid AND c.relname = (parse_ident(u.t))[2]
	JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'published_at' AND NOT a.attisdropped`
}

// pollTableProbe names the first of the tables ($1) that pollGuard found
// prepared for the poll mode ("" when none is now).
var pollTableProbe = `SELECT coalesce((SELECT t FROM (` + preparedTables("$1::text[]") + `) p ORDER BY n LIMIT 1), '')`

// errPollMode is Write's error for a message a poll-mode relay would never
// see. probe runs pollTableProbe in the caller's transaction, so that the
// error names the table pollGuard found; both are named when it fails.
func (w *Writer) errPollMode(probe func(sql string, args ...any) (string, error)) error {
	table := w.table + " or " + defaultTable
	if w.table == defaultTable {
		table = w.table
	}
	if name, err := probe(pollTableProbe, []string{w.table, defaultTable}); err == nil && name != "" {
		table = name
	}
	if table == defaultTable && w.table != defaultTable {
		table += " (the connector's default OUTBOX_TABLE, checked whatever Config.Table names: a message has no table of its own)"
	}
	return fmt.Errorf("outbox: %s is prepared for the connector's poll mode (it has published_at, sql/variants/outbox_poll.sql), which reads the table and never the WAL: a message (ModeMessage) would never be published; write in ModeTable (delete-after-insert is refused by the table's trigger too)", table)
}

func isBase(c string) bool {
	for _, b := range baseColumns {
		if c == b {
			return true
		}
	}
	return false
}

// marshalPayload returns the payload's JSON text, or nil for NULL.
func marshalPayload(p any) (any, error) {
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if v == nil {
			return nil, nil
		}
		return rawJSON(v)
	case []byte:
		if v == nil {
			return nil, nil
		}
		return rawJSON(v)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("marshal payload: %w", err)
	}
	return string(b), nil
}

func rawJSON(b []byte) (any, error) {
	if !json.Valid(b) {
		return nil, errors.New("payload is not valid JSON")
	}
	return string(bytes.TrimSpace(b)), nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)

// QuoteTable validates "schema.name" or "name" and returns it quoted
// ("public" when the schema is left out).
func QuoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) == 1 {
		parts = []string{"public", parts[0]}
	}
	if len(parts) != 2 || !identRE.MatchString(parts[0]) || !identRE.MatchString(parts[1]) {
		return "", fmt.Errorf("outbox: table %q: want schema.name of plain identifiers", name)
	}
	return pgx.Identifier(parts).Sanitize(), nil
}
