// Package audit compares the events a table says were committed with the
// records Kafka holds, and reports every event that never arrived: the check
// that finds a lost event in a minute instead of a reconciliation a week
// later.
//
// An audit of a window [Since, Until) reads the ids of the rows created in
// it (the outbox table, or a service's own table for a dual write), and the
// ids on the topics those rows route to, from the first record stamped at
// or after Since − Skew up to the end each partition had when the audit
// began. Both sides are compared in id order: the table sorts its side, and
// the Kafka side goes through an external sort that keeps at most a few
// chunks of ids in memory and spills the rest to disk, so a day's window
// costs disk, not memory.
//
// An id counts as delivered when a record on its routed topic carries it
// (in the id header, or the key) and as dead-lettered when the dead-letter
// topic does (keyed by event id); anything else is missing. Rows younger
// than the grace period are not judged yet.
package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lanrat/extsort"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/route"
)

// Match says where a Kafka record carries the id a row is matched on.
type Match string

const (
	// MatchHeader matches the record's "id" header, which the router sets
	// to the event id (table.field.event.id).
	MatchHeader Match = "header"
	// MatchKey matches the record key: the aggregate id the router keys
	// by, or what a service that publishes itself puts there.
	MatchKey Match = "key"
)

// Source is the table side of an audit.
type Source struct {
	// Table is the quoted, schema-qualified table.
	Table string
	// IDColumn is what is matched against Kafka (the event id, or for
	// MatchKey the key column).
	IDColumn string
	// EventIDColumn is the event id, which the dead-letter table's rows
	// are keyed by (as the DLQ topic's records are); empty: the table's
	// events are never dead-lettered by the relay (a service's own table).
	// With MatchHeader it is IDColumn; MatchKey takes none.
	EventIDColumn string
	// TimeColumn bounds the window (a timestamptz such as created_at).
	TimeColumn string
	// RouteColumn is route.by.field; empty: every row has AggregateType.
	// MatchKey takes none: its rows are one aggregate type's.
	RouteColumn string
	// AggregateType is the route value of every row when RouteColumn is
	// empty (a service's own table).
	AggregateType string
	// KeyColumn is reported with a missing event (the aggregate id); may
	// be empty.
	KeyColumn string
}

// Options configures one audit.
type Options struct {
	Source Source
	// Topic maps a route value to its topic (route.TopicOf).
	Topic func(string) (string, error)
	// Match is where records carry the id (default MatchHeader). MatchKey
	// is for a service's own table of one aggregate type (Source has no
	// RouteColumn), with no dead letters (no DLQTopic, DeadLetterTable
	// or EventIDColumn): the outbox's records carry the event id in their
	// id header, which tells an aggregate's events apart; a key does not.
	Match Match
	// HeaderFormat and KeyFormat are the router's header and key
	// converters (OUTBOX_ROUTE_HEADER_FORMAT, _KEY_FORMAT; default string):
	// one the audit cannot read is refused. Ids are decoded by their shape
	// (DecodeID), so records of a converter used before are read too.
	HeaderFormat, KeyFormat route.Format
	// DLQTopic is the dead-letter topic, keyed by event id; empty: none.
	DLQTopic string
	// DeadLetterTable is the connector's table of events too large for any
	// topic (public.outbox_dead_letter): an id there is dead-lettered, not
	// missing. Empty, or a table that does not exist: none.
	DeadLetterTable string
	// Since and Until bound the window by TimeColumn: Since ≤ t < Until.
	// A zero Until is now − Grace.
	Since, Until time.Time
	// Window, when Since is zero, starts the window that long before now,
	// on the database's clock, as Until is: a round of the continuous audit
	// reads both ends from one clock, so that consecutive windows overlap
	// however far the watcher's clock is from the database's. A zero Since
	// needs a Window.
	Window time.Duration
	// Resume, with Window, is where the last audit that succeeded ended
	// (its Until): when it is earlier than now − Window, the window starts
	// there instead, so that rounds failing for longer than the window
	// leave no stretch of the table unaudited. Such a window ends no later
	// than one Window after its start (Result.Behind): caught up one
	// Window at a time, a round is no larger than a usual one, and one
	// that failed for its size alone does not fail for ever.
	Resume time.Time
	// CatchUp bounds Resume: a window that Resume starts early starts no
	// earlier than CatchUp before now, nor later than now − Window (0:
	// unbounded). Past Kafka's retention its records are gone and every
	// event would look missing; and a round failing for its window's size
	// would only grow it. The stretch left is in Result.Skipped, for a
	// one-shot audit to cover.
	CatchUp time.Duration
	// Grace: rows younger than Now − Grace are not judged (they may still
	// be on their way). It is counted from the time column (created_at,
	// the inserting transaction's start), not from the commit: a grace
	// shorter than the longest outbox transaction plus the relay's lag can
	// judge an event that committed a moment before the audit and is not
	// in Kafka yet.
	Grace time.Duration
	// Skew widens the Kafka side back from Since, for clocks that differ
	// between PostgreSQL and the relay that stamps the records.
	Skew time.Duration
	// Idle fails the audit when no record arrived for this long while
	// partitions are still short of their end offsets (default 30s): a
	// read that stops early would report delivered events missing.
	Idle time.Duration
	// ChunkSize is how many ids the external sort holds per chunk
	// (default DefaultChunkSize).
	ChunkSize int
	// TempDir holds the sort's spill files (default: the system's).
	TempDir string
	// Now is the clock (tests); default the database's, which stamped the
	// time column.
	Now func() time.Time
	// OnMissing is called for every missing event, in id order.
	OnMissing func(Missing)
	// OnDuplicate is called for every audited id found more than once on
	// its topic.
	OnDuplicate func(id string, copies int)
}

// DefaultChunkSize is the external sort's chunk: about 15 MiB of heap
// whatever the window, and one spill file per 25,000 records read (a
// window of 10 million records opens 400 files while merging).
const DefaultChunkSize = 25_000

// Missing is an event the table holds and Kafka does not.
type Missing struct {
	ID            string
	AggregateType string
	AggregateID   string
	CreatedAt     time.Time
	Topic         string
}

// String is the report line: "missing <id> …".
func (m Missing) String() string {
	return fmt.Sprintf("missing %s aggregatetype=%s aggregateid=%s created_at=%s topic=%s",
		m.ID, m.AggregateType, m.AggregateID, m.CreatedAt.UTC().Format(time.RFC3339Nano), m.Topic)
}

// Result sums up an audit.
type Result struct {
	Since, Until time.Time
	// Audited counts the rows judged; Missing, Duplicated and DeadLettered
	// count among them.
	Audited, Missing, Duplicated, DeadLettered int64
	// Records is how many Kafka records with an id were read; Unreadable
	// how many routed records had an id header (or, with MatchKey, a key)
	// the audit could not read: a null, or a converter it does not know.
	// Foreign counts the routed records with no id header at all: every
	// record the router writes has one, so these are another producer's;
	// they prove nothing either way and hold back no verdict.
	Records, Unreadable, Foreign int64
	// Topics are the topics read, the DLQ included.
	Topics []string
	// Elapsed is how long the audit took.
	Elapsed time.Duration
	// missingIn counts Missing by expected topic.
	missingIn map[string]int64
	// Skipped, when not zero, is where the window would have started
	// (Options.Resume) had CatchUp not bounded it: the events created from
	// Skipped to Since were audited by no round.
	Skipped time.Time
	// Behind is true when a resumed window was cut at one Window: the
	// events from Until to now − Grace are for the next round, which can
	// start at once.
	Behind bool
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Summary is the report's last line.
func (r Result) Summary() string {
	if r.Audited == 0 {
		return fmt.Sprintf("audited 0 events: the table holds no row created from %s to %s (a table emptied in delete-after-insert or message mode cannot be audited)",
			r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	}
	unreadable := ""
	if r.Unreadable > 0 {
		unreadable = fmt.Sprintf(" and %d with an id the audit cannot read (a null, or a converter it does not know: check the topics)", r.Unreadable)
	}
	if r.Foreign > 0 {
		unreadable += fmt.Sprintf(" and %d without an id header (another producer's; if all are, the topics may be a service's own: audit those with -match key)", r.Foreign)
	}
	return fmt.Sprintf("audited %d events created from %s to %s: %d missing, %d duplicated, %d dead-lettered; read %d records%s from %s in %s",
		r.Audited, r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339),
		r.Missing, r.Duplicated, r.DeadLettered, r.Records, unreadable, strings.Join(r.Topics, ","), r.Elapsed.Round(time.Millisecond))
}

// ClientOpts are the consumer options an audit's client needs: read
// committed records only, and small fetches: franz-go asks for up to 50 MiB
// a fetch by default, and a small record takes about 250 bytes of memory
// once decoded, so a 1 MiB fetch of outbox records is already ~10 MiB.
func ClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// The commit and abort markers come back too, so that the record
		// just below each partition's last stable offset always arrives
		// (it is a marker whenever the partition ends in a transaction),
		// and the read knows it reached the end instead of waiting.
		kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(1 << 20),
		kgo.FetchMaxPartitionBytes(1 << 20),
		kgo.MaxConcurrentFetches(1),
	}
}

// DB is what an audit needs of PostgreSQL (a *pgx.Conn or a pool): one
// read-only transaction, so that both of its queries see one snapshot.
type DB interface {
	BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error)
}

// Run audits one window. db reads the table; cl is a Kafka client made
// with the connection's options only (Run consumes with it by assigning
// partitions; it must not be a group member). It returns the first error
// that stops the audit; every missing event it reported before that error
// was judged against the whole of Kafka's side, so none is false, but the
// report is partial.
//
// The table is read in one REPEATABLE READ snapshot taken before Kafka's end
// offsets are listed: a row the audit judges committed before the offsets
// were listed, so a record of it the relay published in time is read (a row
// committed during the Kafka read is not in the snapshot and waits for the
// next audit).
func Run(ctx context.Context, db DB, cl *kgo.Client, o Options) (Result, error) {
	start := time.Now()
	if o.Match == "" {
		o.Match = MatchHeader
	}
	if o.Idle <= 0 {
		o.Idle = 30 * time.Second
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = DefaultChunkSize
	}
	// Only the converter of what is matched: keys under Avro do not stop
	// an audit of the id headers.
	what, f := "header", o.HeaderFormat
	if o.Match == MatchKey {
		what, f = "key", o.KeyFormat
	}
	if err := CheckFormat(what, f); err != nil {
		return Result{Since: o.Since, Until: o.Until}, err
	}
	if o.Since.IsZero() && o.Window <= 0 {
		return Result{}, errors.New("audit: no window: set Since, or Window")
	}
	// With MatchKey the end offsets are listed before the snapshot is
	// taken: a record read must be of a row the snapshot holds, or, its
	// key telling it from no other row of its aggregate, it would cover
	// one of theirs that was lost. (Header ids are unique: there the
	// offsets are listed after, so that every row judged had its chance
	// to be read.) Its topic is known up front: one aggregate type.
	var keyTopics map[string]string
	var ends kadm.ListedOffsets
	if o.Match == MatchKey {
		if o.Source.RouteColumn != "" || o.Source.AggregateType == "" {
			return Result{Since: o.Since, Until: o.Until}, errors.New("audit: -match key audits one aggregate type (a service's own table, -aggregate-type): the outbox's records carry the event id in their id header; audit the outbox with -match header")
		}
		if o.DLQTopic != "" || o.DeadLetterTable != "" || o.Source.EventIDColumn != "" {
			return Result{Since: o.Since, Until: o.Until}, errors.New("audit: -match key takes no dead letters: it is for a service's own table, whose events the relay never dead-letters")
		}
		var err error
		if keyTopics, err = ownTopic(o); err != nil {
			return Result{Since: o.Since, Until: o.Until}, err
		}
		if ends, err = listEnds(ctx, cl, uniqueTopics(keyTopics)); err != nil {
			return Result{Since: o.Since, Until: o.Until}, err
		}
	}
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Result{Since: o.Since, Until: o.Until}, fmt.Errorf("begin the audit's snapshot: %w", err)
	}
	defer func() {
		// Bounded: a server that no longer answers must not hold the
		// audit (and the continuous audit's next rounds) forever; the
		// server ends the transaction when the connection goes.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	// The transaction is idle while Kafka is read, for minutes over a
	// large window: a server or role idle_in_transaction_session_timeout
	// shorter than that would end the session and fail every such audit.
	if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`); err != nil {
		return Result{Since: o.Since, Until: o.Until}, fmt.Errorf("begin the audit's snapshot: %w", err)
	}
	// The snapshot is taken here, by the transaction's first query (SET
	// takes none).
	var dbNow time.Time
	var standby bool
	if err := tx.QueryRow(ctx, `SELECT now(), pg_is_in_recovery()`).Scan(&dbNow, &standby); err != nil {
		return Result{Since: o.Since, Until: o.Until}, fmt.Errorf("take the audit's snapshot: %w", err)
	}
	// A standby replays commits later than the primary made them: a row
	// whose record was among the end offsets listed can be missing from
	// its snapshot, and with MatchKey that record would cover a lost row
	// of its key. (Header ids are unique: a row not yet replayed is only
	// judged by a later audit.)
	if standby && o.Match == MatchKey {
		return Result{Since: o.Since, Until: o.Until}, errors.New("audit: -match key reads the primary: this server is a standby, whose snapshot can lack rows whose records are already in Kafka; point the DSN at the primary")
	}
	now := dbNow
	var skipped time.Time
	if o.Now != nil {
		now = o.Now()
	}
	resumed := false
	if o.Since.IsZero() {
		o.Since = now.Add(-o.Window)
		if !o.Resume.IsZero() && o.Resume.Before(o.Since) {
			o.Since, resumed = o.Resume, true
			if floor := now.Add(-o.CatchUp); o.CatchUp > 0 && o.Since.Before(floor) {
				skipped, o.Since = o.Since, minTime(floor, now.Add(-o.Window))
			}
		}
	}
	until := o.Until
	if due := now.Add(-o.Grace); until.IsZero() || until.After(due) {
		until = due
	}
	behind := false
	if end := o.Since.Add(o.Window); resumed && end.Before(until) {
		until, behind = end, true
	}
	res := Result{Since: o.Since, Until: until, Skipped: skipped, Behind: behind}
	if !until.After(o.Since) {
		res.Elapsed = time.Since(start)
		return res, nil
	}

	topics := keyTopics
	if topics == nil {
		if topics, err = routedTopics(ctx, tx, o, o.Since, until); err != nil {
			return res, err
		}
	}
	if o.DeadLetterTable != "" {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, o.DeadLetterTable).Scan(&exists); err != nil {
			return res, fmt.Errorf("look up %s: %w", o.DeadLetterTable, err)
		}
		if !exists {
			o.DeadLetterTable = ""
		}
	}
	read := uniqueTopics(topics)
	if o.DLQTopic != "" {
		read = append(read, o.DLQTopic)
	}
	res.Topics = read

	// The Kafka side: every id read goes into the sort tagged with where
	// it was seen, so that one merged stream tells delivered from
	// dead-lettered.
	ids := make(chan string, 1024)
	sorter, sorted, sortErrs := extsort.Strings(ids, &extsort.Config{
		ChunkSize: o.ChunkSize, NumWorkers: 1, ChanBuffSize: 1, SortedChanBuffSize: 1024, TempFilesDir: o.TempDir,
	})
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Sort returns once it has read every id (the merge then runs in its
	// own goroutine), or early when it fails, spilling a chunk to disk for
	// instance: then it reads no more, and the Kafka read must stop
	// sending instead of waiting for it forever.
	sortReturned := make(chan struct{})
	go func() {
		defer close(sortReturned)
		sorter.Sort(sctx)
	}()
	counts, readErr := readKafka(sctx, cl, read, o, until, ends, ids, sortReturned)
	close(ids)
	res.Records, res.Unreadable, res.Foreign = counts.sent, counts.unreadable, counts.foreign
	if readErr != nil {
		cancel()
		<-sortReturned
		drain(sorted)
		if errors.Is(readErr, errSortStopped) {
			if serr := <-sortErrs; serr != nil {
				readErr = fmt.Errorf("sort the ids read from Kafka: %w", serr)
			}
		}
		return res, readErr
	}

	err = compare(ctx, tx, o, until, topics, sorted, sortErrs, &res)
	cancel()
	<-sortReturned
	drain(sorted)
	if err == nil {
		if serr := <-sortErrs; serr != nil && !errors.Is(serr, context.Canceled) {
			err = fmt.Errorf("sort the ids read from Kafka: %w", serr)
		}
	}
	if err == nil {
		err = unreadable(o, counts, res.missingIn)
	}
	res.Elapsed = time.Since(start)
	return res, err
}

// uniqueTopics is the topics of a route map, once each, sorted.
func uniqueTopics(byValue map[string]string) []string {
	var ts []string
	for _, t := range byValue {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	sort.Strings(ts)
	return ts
}

// listEnds lists the last stable offsets of topics: a read_committed
// consumer reads up to them.
func listEnds(ctx context.Context, cl *kgo.Client, topics []string) (kadm.ListedOffsets, error) {
	if len(topics) == 0 {
		return kadm.ListedOffsets{}, nil
	}
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list the end offsets: %w", err)
	}
	return ends, nil
}

// errSortStopped: the external sort returned before it had every id.
var errSortStopped = errors.New("the sort of the ids stopped early")

func drain(c <-chan string) {
	for range c {
	}
}

// Tags after an id in the sorted stream, telling a routed record from a
// dead letter of the same id (both sort after the bare id, so an id that
// is a prefix of another still sorts first).
const (
	tagRouted = "\x00r"
	tagDLQ    = "\x00d"
)

// ownTopic is the topic of a table of one aggregate type (no RouteColumn).
func ownTopic(o Options) (map[string]string, error) {
	t, err := o.Topic(o.Source.AggregateType)
	if err != nil {
		return nil, fmt.Errorf("aggregate type %q: %w", o.Source.AggregateType, err)
	}
	return map[string]string{o.Source.AggregateType: t}, nil
}

// routedTopics maps the route values present in the window to their
// topics. An unroutable value has none: its events are reported missing
// with an empty topic.
func routedTopics(ctx context.Context, db pgx.Tx, o Options, since, until time.Time) (map[string]string, error) {
	if o.Source.RouteColumn == "" {
		return ownTopic(o)
	}
	byValue := map[string]string{}
	q := fmt.Sprintf(`SELECT DISTINCT %s::text FROM %s WHERE %s >= $1 AND %s < $2`,
		o.Source.RouteColumn, o.Source.Table, o.Source.TimeColumn, o.Source.TimeColumn)
	rows, err := db.Query(ctx, q, since, until)
	if err != nil {
		return nil, fmt.Errorf("list the aggregate types in %s: %w", o.Source.Table, err)
	}
	var vals []*string
	for rows.Next() {
		var v *string
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, err
		}
		vals = append(vals, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the aggregate types in %s: %w", o.Source.Table, err)
	}
	for _, v := range vals {
		if v == nil {
			continue // an event the router cannot route: reported missing with topic ""
		}
		t, err := o.Topic(*v)
		if err != nil {
			continue
		}
		byValue[*v] = t
	}
	return byValue, nil
}

// UnreadableError: on Topics, no record of the window had an id the audit
// could read, and they were at least as many as the events found missing
// there, so that each of those may be one of them. The missing events
// already reported are no verdict.
type UnreadableError struct {
	Records, Missing int64
	// Topics are where.
	Topics []string
	// Where is what holds the id: "an id header" or "a key".
	Where string
}

func (e *UnreadableError) Error() string {
	return fmt.Sprintf("none of the %d records of the window read from %s carries %s the audit can read (a null, or a converter it does not know), and %d events there look missing: each may be one of them; check that these topics are the router's (OUTBOX_ROUTE_*, the header and key converters) and -match",
		e.Records, strings.Join(e.Topics, ","), e.Where, e.Missing)
}

// unreadable is an UnreadableError when, on some topic, no record of the
// window had an id the audit could read and the unreadable ones are at
// least as many as the events found missing there: each of those may be
// one of them, written by a converter or read with a -match that does not
// fit the topic. That is no verdict. With fewer, at least the difference
// is lost whatever the records are: all are reported, as a record the
// audit cannot read proves no delivery, and the result counts the
// unreadable ones. Counted per topic and by the records' time, so that
// another topic's or another time's records hide no loss; and records
// with no id header are not counted at all (Result.Foreign): the router
// writes one on every record, so a busy foreign producer beside a relay
// that is down hides no loss either.
func unreadable(o Options, c readCounts, missingIn map[string]int64) error {
	var e UnreadableError
	for t, miss := range missingIn {
		if n := c.unreadableIn[t]; t != "" && miss > 0 && c.readableIn[t] == 0 && n >= miss {
			e.Records += n
			e.Missing += miss
			e.Topics = append(e.Topics, t)
		}
	}
	if len(e.Topics) == 0 {
		return nil
	}
	sort.Strings(e.Topics)
	e.Where = "an id header"
	if o.Match == MatchKey {
		e.Where = "a key"
	}
	return &e
}

// readCounts counts the records a Kafka read took.
type readCounts struct {
	// sent is how many ids went to the sort (dead letters included);
	// unreadable counts the routed records with an id the audit cannot
	// read, foreign those with no id header (the DLQ's are the relay's).
	sent, unreadable, foreign int64
	// By routed topic, the records stamped inside the window (from Since
	// − Skew to Until + Skew) with an id the audit can read and without.
	readableIn, unreadableIn map[string]int64
}

// readKafka sends every id on topics from Since − Skew up to their end
// offsets (ends, or when nil those listed now) to ids, tagged, and counts
// what it read.
func readKafka(ctx context.Context, cl *kgo.Client, topics []string, o Options, until time.Time, ends kadm.ListedOffsets, ids chan<- string, sortReturned <-chan struct{}) (c readCounts, err error) {
	c.readableIn, c.unreadableIn = map[string]int64{}, map[string]int64{}
	if len(topics) == 0 {
		return c, nil
	}
	// A record of the window's events is stamped within the skew of it.
	lo, hi := o.Since.Add(-o.Skew), until.Add(o.Skew)
	inWindow := func(r *kgo.Record) bool { return !r.Timestamp.Before(lo) && r.Timestamp.Before(hi) }
	adm := kadm.NewClient(cl)
	from := lo.UnixMilli()
	starts, err := adm.ListOffsetsAfterMilli(ctx, from, topics...)
	if err != nil {
		return c, fmt.Errorf("list the offsets at %s: %w", time.UnixMilli(from).UTC().Format(time.RFC3339), err)
	}
	if ends == nil {
		if ends, err = listEnds(ctx, cl, topics); err != nil {
			return c, err
		}
	}
	assign := map[string]map[int32]kgo.Offset{}
	remaining := map[string]map[int32]int64{} // partition → the end offset still to reach
	reached := map[string]map[int32]int64{}   // partition → the last offset read
	left := 0
	var errs []error
	for _, t := range topics {
		for p, e := range ends[t] {
			if e.Err != nil {
				if errors.Is(e.Err, kerr.UnknownTopicOrPartition) {
					continue // a topic nobody produced to yet: its events are all missing
				}
				errs = append(errs, fmt.Errorf("end offset of %s[%d]: %w", t, p, e.Err))
				continue
			}
			s, ok := starts.Lookup(t, p)
			if !ok || s.Err != nil {
				errs = append(errs, fmt.Errorf("start offset of %s[%d]: %v", t, p, s.Err))
				continue
			}
			if s.Offset >= e.Offset {
				continue
			}
			if assign[t] == nil {
				assign[t] = map[int32]kgo.Offset{}
				remaining[t] = map[int32]int64{}
			}
			assign[t][p] = kgo.NewOffset().At(s.Offset)
			remaining[t][p] = e.Offset
			if reached[t] == nil {
				reached[t] = map[int32]int64{}
			}
			reached[t][p] = s.Offset - 1
			left++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if left == 0 {
		return c, nil
	}
	cl.AddConsumePartitions(assign)
	defer func() {
		rm := map[string][]int32{}
		for t, ps := range assign {
			for p := range ps {
				rm[t] = append(rm[t], p)
			}
		}
		cl.RemoveConsumePartitions(rm)
	}()

	for left > 0 {
		pctx, cancel := context.WithTimeout(ctx, o.Idle)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return c, err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			ferr = fmt.Errorf("read %s[%d]: %w", t, p, err)
		})
		if ferr != nil {
			return c, ferr
		}
		got := 0
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			got++
			end, ok := remaining[r.Topic][r.Partition]
			if !ok {
				continue
			}
			reached[r.Topic][r.Partition] = r.Offset
			if r.Offset < end && !r.Attrs.IsControl() {
				dlq := r.Topic == o.DLQTopic
				id, ok, present := recordID(r, o, dlq)
				switch {
				case !present && !dlq:
					c.foreign++
				case (!ok || id == "") && !dlq:
					c.unreadable++
					if inWindow(r) {
						c.unreadableIn[r.Topic]++
					}
				case ok && id != "":
					tag := tagRouted
					if dlq {
						tag = tagDLQ
					} else if inWindow(r) {
						c.readableIn[r.Topic]++
					}
					select {
					case ids <- id + tag:
					case <-sortReturned:
						return c, errSortStopped
					case <-ctx.Done():
						return c, ctx.Err()
					}
					c.sent++
				}
			}
			if r.Offset >= end-1 {
				delete(remaining[r.Topic], r.Partition)
				left--
			}
		}
		if got == 0 {
			var short []string
			for t, ps := range remaining {
				for p, end := range ps {
					short = append(short, fmt.Sprintf("%s[%d] at %d of %d", t, p, reached[t][p]+1, end))
				}
			}
			sort.Strings(short)
			return c, fmt.Errorf("no record from Kafka for %s while partitions are short of the end they had when the audit began (%s); check the brokers, or raise the idle timeout", o.Idle, strings.Join(short, ", "))
		}
	}
	return c, nil
}

// recordID is the id a record carries: a routed record's is in its id
// header or its key, written by one of the router's converters. A dead
// letter's key is the event id, as is (MatchHeader only). present is false
// for a routed record without an id header (MatchHeader), which the router
// never writes.
func recordID(r *kgo.Record, o Options, dlq bool) (id string, ok, present bool) {
	switch {
	case dlq:
		return string(r.Key), r.Key != nil, true
	case o.Match == MatchKey:
		id, ok = DecodeID(r.Key)
		return id, ok, true
	}
	for _, h := range r.Headers {
		if h.Key == "id" {
			id, ok = DecodeID(h.Value)
			return id, ok, true
		}
	}
	return "", false, false
}

// compare walks the table's rows in id order beside the sorted ids from
// Kafka. Rows that share an id (only with MatchKey: an aggregate with
// several events) share its records: the k-th row of an id is delivered
// when at least k records carry it.
func compare(ctx context.Context, tx pgx.Tx, o Options, until time.Time, topics map[string]string, sorted <-chan string, sortErrs <-chan error, res *Result) error {
	s := o.Source
	routeExpr, keyExpr, deadExpr, join := "NULL::text", "NULL::text", "false", ""
	if s.RouteColumn != "" {
		routeExpr = "o." + s.RouteColumn + "::text"
	}
	if s.KeyColumn != "" {
		keyExpr = "o." + s.KeyColumn + "::text"
	}
	if o.DeadLetterTable != "" && s.EventIDColumn != "" {
		deadExpr = "d.id IS NOT NULL"
		join = fmt.Sprintf(" LEFT JOIN %s d ON d.id = o.%s::text", o.DeadLetterTable, s.EventIDColumn)
	}
	var (
		q    string
		args []any
	)
	if o.Match == MatchKey {
		// An aggregate's records cannot be told apart by their key, and
		// its rows outside the window have records too: those created
		// from Since − Skew (whose records the Kafka side reads) and after
		// Until (read up to the end offsets, listed before the snapshot).
		// They are counted as delivered first (unjudged), so that a later
		// event's record never covers a lost one of the window, nor shows
		// as its duplicate. The price: an event committed after the window
		// and still on its way when the offsets were listed makes one of
		// the window's look missing, until the next audit. What counting
		// cannot see: a row created before Since − Skew whose record was
		// published after it (later than the skew), or a record published
		// before its row committed, or a copy of a sibling's record, each
		// covers a lost row of its key. With a unique key (a table's
		// primary key) none arises.
		in := fmt.Sprintf("o.%s >= $1 AND o.%s < $2", s.TimeColumn, s.TimeColumn)
		q = fmt.Sprintf(`SELECT id, rv, k, t, dead, unjudged FROM (
SELECT o.%s::text AS id, %s AS rv, %s AS k, o.%s AS t, %s AS dead, %s AS judged,
	count(*) FILTER (WHERE NOT (%s)) OVER (PARTITION BY o.%s::text COLLATE "C") AS unjudged
FROM %s o%s WHERE o.%s >= $3) s
WHERE judged ORDER BY id COLLATE "C", t`,
			s.IDColumn, routeExpr, keyExpr, s.TimeColumn, deadExpr, in, in, s.IDColumn, s.Table, join, s.TimeColumn)
		args = []any{o.Since, until, o.Since.Add(-o.Skew)}
	} else {
		// COLLATE "C" orders as Go compares strings: bytewise.
		q = fmt.Sprintf(`SELECT o.%s::text, %s, %s, o.%s, %s, 0::bigint FROM %s o%s WHERE o.%s >= $1 AND o.%s < $2 ORDER BY o.%s::text COLLATE "C", o.%s`,
			s.IDColumn, routeExpr, keyExpr, s.TimeColumn, deadExpr, s.Table, join, s.TimeColumn, s.TimeColumn, s.IDColumn, s.TimeColumn)
		args = []any{o.Since, until}
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		if o.DeadLetterTable != "" {
			return fmt.Errorf("read the ids of %s and %s (outbox_watch needs SELECT (id) on both, sql/006_watch.sql): %w", s.Table, o.DeadLetterTable, err)
		}
		return fmt.Errorf("read the ids of %s: %w", s.Table, err)
	}
	defer rows.Close()

	// next reads the sorted stream. When it ends, the sort's error (if
	// any) is known before any further row is judged: a sort that failed
	// while merging closes the stream early, and the rows after it would
	// all look missing.
	next := func() (string, bool, error) {
		v, ok := <-sorted
		if !ok {
			if err := <-sortErrs; err != nil {
				return "", false, fmt.Errorf("sort the ids read from Kafka: %w", err)
			}
		}
		return v, ok, nil
	}
	cur, ok, err := next()
	if err != nil {
		return err
	}
	var (
		group        string // the id of the rows being judged
		inGroup      bool
		routed, dead int // records of group not yet matched to a row
		copies       int // records of group left for the window's rows
		unjudged     int64
	)
	endGroup := func() {
		// More records than rows: each row took one, the rest are copies.
		if inGroup && routed > 0 {
			res.Duplicated++
			if o.OnDuplicate != nil {
				o.OnDuplicate(group, copies)
			}
		}
	}
	for rows.Next() {
		var (
			id      string
			rv, key *string
			created time.Time
			dlt     bool
		)
		if err := rows.Scan(&id, &rv, &key, &created, &dlt, &unjudged); err != nil {
			return fmt.Errorf("read the ids of %s: %w", s.Table, err)
		}
		res.Audited++
		if !inGroup || id != group {
			endGroup()
			group, inGroup, routed, dead = id, true, 0, 0
			for ok && idOf(cur) < id {
				if cur, ok, err = next(); err != nil {
					return err
				}
			}
			for ok && idOf(cur) == id {
				if strings.HasSuffix(cur, tagDLQ) {
					dead++
				} else {
					routed++
				}
				if cur, ok, err = next(); err != nil {
					return err
				}
			}
			// The group's rows outside the window take their records
			// first (MatchKey, which has no dead letters; none
			// otherwise).
			routed -= int(min(int64(routed), unjudged))
			copies = routed
		}
		switch {
		case routed > 0:
			routed--
		case dead > 0:
			dead--
			res.DeadLettered++
		case dlt:
			res.DeadLettered++
		default:
			res.Missing++
			m := Missing{ID: id, CreatedAt: created}
			if rv != nil {
				m.AggregateType = *rv
			} else if s.RouteColumn == "" {
				m.AggregateType = s.AggregateType
			}
			if key != nil {
				m.AggregateID = *key
			}
			m.Topic = topics[m.AggregateType]
			if res.missingIn == nil {
				res.missingIn = map[string]int64{}
			}
			res.missingIn[m.Topic]++
			if o.OnMissing != nil {
				o.OnMissing(m)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the ids of %s: %w", s.Table, err)
	}
	endGroup()
	return nil
}

func idOf(tagged string) string { return tagged[:len(tagged)-len(tagRouted)] }
