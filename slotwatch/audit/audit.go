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
	// TimeColumn bounds the window (a timestamptz such as created_at).
	TimeColumn string
	// RouteColumn is route.by.field; empty: every row has AggregateType.
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
	// Match is where records carry the id (default MatchHeader).
	Match Match
	// DLQTopic is the dead-letter topic, keyed by event id; empty: none.
	DLQTopic string
	// Since and Until bound the window by TimeColumn: Since ≤ t < Until.
	Since, Until time.Time
	// Grace: rows younger than Now − Grace are not judged (they may still
	// be on their way).
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
	// Now is the clock (tests).
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
	// Records is how many Kafka records were read.
	Records int64
	// Topics are the topics read, the DLQ included.
	Topics []string
	// Elapsed is how long the audit took.
	Elapsed time.Duration
}

// Summary is the report's last line.
func (r Result) Summary() string {
	if r.Audited == 0 {
		return fmt.Sprintf("audited 0 events: the table holds no row created from %s to %s (a table emptied in delete-after-insert or message mode cannot be audited)",
			r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("audited %d events created from %s to %s: %d missing, %d duplicated, %d dead-lettered; read %d records from %s in %s",
		r.Audited, r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339),
		r.Missing, r.Duplicated, r.DeadLettered, r.Records, strings.Join(r.Topics, ","), r.Elapsed.Round(time.Millisecond))
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

// Querier is what an audit needs of PostgreSQL (a *pgx.Conn or a pool).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Run audits one window. db reads the table; cl is a Kafka client made
// with the connection's options only (Run consumes with it by assigning
// partitions; it must not be a group member). It returns the first error
// that stops the audit: a partial audit reports nothing.
func Run(ctx context.Context, db Querier, cl *kgo.Client, o Options) (Result, error) {
	start := time.Now()
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Match == "" {
		o.Match = MatchHeader
	}
	if o.Idle <= 0 {
		o.Idle = 30 * time.Second
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = DefaultChunkSize
	}
	until := o.Until
	if due := o.Now().Add(-o.Grace); until.IsZero() || until.After(due) {
		until = due
	}
	res := Result{Since: o.Since, Until: until}
	if !until.After(o.Since) {
		res.Elapsed = time.Since(start)
		return res, nil
	}

	topics, err := routedTopics(ctx, db, o, until)
	if err != nil {
		return res, err
	}
	read := make([]string, 0, len(topics)+1)
	for _, t := range topics {
		if !slices.Contains(read, t) {
			read = append(read, t)
		}
	}
	sort.Strings(read)
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
	go sorter.Sort(sctx)
	n, readErr := readKafka(sctx, cl, read, o, ids)
	close(ids)
	res.Records = n
	if readErr != nil {
		cancel()
		drain(sorted)
		return res, readErr
	}

	err = compare(ctx, db, o, until, topics, sorted, &res)
	cancel()
	drain(sorted)
	if err == nil {
		if serr := <-sortErrs; serr != nil && !errors.Is(serr, context.Canceled) {
			err = fmt.Errorf("sort the ids read from Kafka: %w", serr)
		}
	}
	res.Elapsed = time.Since(start)
	return res, err
}

func drain(c <-chan string) {
	for range c {
	}
}

// Tags after an id in the sorted stream: a routed record sorts before a
// dead letter of the same id.
const (
	tagRouted = "\x00r"
	tagDLQ    = "\x00d"
)

// routedTopics maps the route values present in the window to their
// topics. An unroutable value has none: its events are reported missing
// with an empty topic.
func routedTopics(ctx context.Context, db Querier, o Options, until time.Time) (map[string]string, error) {
	byValue := map[string]string{}
	if o.Source.RouteColumn == "" {
		t, err := o.Topic(o.Source.AggregateType)
		if err != nil {
			return nil, fmt.Errorf("aggregate type %q: %w", o.Source.AggregateType, err)
		}
		byValue[o.Source.AggregateType] = t
	} else {
		q := fmt.Sprintf(`SELECT DISTINCT %s::text FROM %s WHERE %s >= $1 AND %s < $2`,
			o.Source.RouteColumn, o.Source.Table, o.Source.TimeColumn, o.Source.TimeColumn)
		rows, err := db.Query(ctx, q, o.Since, until)
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
	}
	return byValue, nil
}

// readKafka sends every id on topics from Since − Skew up to the end
// offsets listed now to ids, tagged, and returns how many records it read.
func readKafka(ctx context.Context, cl *kgo.Client, topics []string, o Options, ids chan<- string) (int64, error) {
	if len(topics) == 0 {
		return 0, nil
	}
	adm := kadm.NewClient(cl)
	from := o.Since.Add(-o.Skew).UnixMilli()
	starts, err := adm.ListOffsetsAfterMilli(ctx, from, topics...)
	if err != nil {
		return 0, fmt.Errorf("list the offsets at %s: %w", time.UnixMilli(from).UTC().Format(time.RFC3339), err)
	}
	// The last stable offset: a read_committed consumer reads up to it.
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return 0, fmt.Errorf("list the end offsets: %w", err)
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
		return 0, err
	}
	if left == 0 {
		return 0, nil
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

	var n int64
	for left > 0 {
		pctx, cancel := context.WithTimeout(ctx, o.Idle)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return n, err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			ferr = fmt.Errorf("read %s[%d]: %w", t, p, err)
		})
		if ferr != nil {
			return n, ferr
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
				id := recordID(r, o.Match, r.Topic == o.DLQTopic)
				if id != "" {
					tag := tagRouted
					if r.Topic == o.DLQTopic {
						tag = tagDLQ
					}
					select {
					case ids <- id + tag:
					case <-ctx.Done():
						return n, ctx.Err()
					}
					n++
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
			return n, fmt.Errorf("no record from Kafka for %s while partitions are short of the end they had when the audit began (%s); check the brokers, or raise the idle timeout", o.Idle, strings.Join(short, ", "))
		}
	}
	return n, nil
}

// recordID is the id a record carries: a dead letter's key is the event
// id; a routed record's id is in its id header or its key.
func recordID(r *kgo.Record, m Match, dlq bool) string {
	if dlq || m == MatchKey {
		return string(r.Key)
	}
	for _, h := range r.Headers {
		if h.Key == "id" {
			return string(h.Value)
		}
	}
	return ""
}

// compare walks the table's rows in id order beside the sorted ids from
// Kafka.
func compare(ctx context.Context, db Querier, o Options, until time.Time, topics map[string]string, sorted <-chan string, res *Result) error {
	s := o.Source
	routeExpr, keyExpr := "NULL::text", "NULL::text"
	if s.RouteColumn != "" {
		routeExpr = s.RouteColumn + "::text"
	}
	if s.KeyColumn != "" {
		keyExpr = s.KeyColumn + "::text"
	}
	// COLLATE "C" orders as Go compares strings: bytewise.
	q := fmt.Sprintf(`SELECT %s::text, %s, %s, %s FROM %s WHERE %s >= $1 AND %s < $2 ORDER BY %s::text COLLATE "C"`,
		s.IDColumn, routeExpr, keyExpr, s.TimeColumn, s.Table, s.TimeColumn, s.TimeColumn, s.IDColumn)
	rows, err := db.Query(ctx, q, o.Since, until)
	if err != nil {
		return fmt.Errorf("read the ids of %s: %w", s.Table, err)
	}
	defer rows.Close()

	next, ok := <-sorted
	for rows.Next() {
		var (
			id      string
			rv, key *string
			created time.Time
		)
		if err := rows.Scan(&id, &rv, &key, &created); err != nil {
			return fmt.Errorf("read the ids of %s: %w", s.Table, err)
		}
		res.Audited++
		for ok && idOf(next) < id {
			next, ok = <-sorted
		}
		routed, dead := 0, 0
		for ok && idOf(next) == id {
			if strings.HasSuffix(next, tagDLQ) {
				dead++
			} else {
				routed++
			}
			next, ok = <-sorted
		}
		switch {
		case routed > 1:
			res.Duplicated++
			if o.OnDuplicate != nil {
				o.OnDuplicate(id, routed)
			}
		case routed == 0 && dead > 0:
			res.DeadLettered++
		case routed == 0:
			res.Missing++
			if o.OnMissing != nil {
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
				o.OnMissing(m)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the ids of %s: %w", s.Table, err)
	}
	return nil
}

func idOf(tagged string) string { return tagged[:len(tagged)-len(tagRouted)] }
