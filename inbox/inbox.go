// Package inbox consumes Kafka records idempotently with franz-go and
// PostgreSQL. The relay delivers at least once: a record can arrive twice
// (after a relay crash, a producer retry, a consumer rebalance). For each
// record the Consumer, in one database transaction,
//
//  1. inserts the record's event id (the `id` header) and a hash of its
//     payload into a processed-events table; if the id is already there with
//     the same payload, the record is a duplicate and is skipped without
//     calling the handler; with another payload, it is another event reusing
//     the id and is dead-lettered (never skipped), counted in
//     inbox_id_reused_total. Event ids must be unique: the inbox applies
//     one event per id;
//  2. runs the handler with that transaction, so the business effect and the
//     "processed" mark commit together or not at all;
//
// and only after the transaction committed marks the record's offset for
// commit to Kafka. A crash anywhere repeats at most work that the table then
// recognises. Processing OrderPlaced twice charges the card once.
//
// A record that keeps failing for its own fault (MaxAttempts times, or once
// with an error wrapped by Permanent) goes to a consumer-side dead-letter
// topic with the reason in headers, and its id is marked dead-lettered; the
// partition moves on. The record's fault is: an error the handler returns (a
// panic included), a COMMIT that fails for the data (a deferred constraint,
// or ROLLBACK because the handler ignored a failed statement), an id header
// the table cannot hold (dead-lettered at once). Failures of the database or
// of Kafka itself are not the record's fault and are retried without limit
// (with backoff), never dead-lettered: a transient SQLSTATE (connection,
// resources, operator intervention, serialization failure, deadlock, lock
// timeout) counts as the database's even when the handler raised it; a
// table, column, function, other object or privilege missing (42P01, 42703,
// 42883, 42704, 42501, 3F000: a handler deployed before its migration or
// grant) is the deployment's, retried and logged at error level until it is
// there; an error the handler wraps with Transient (a service it calls) is
// retried too. Each
// attempt's transaction has TxTimeout (30s) to end; a handler it cuts has
// failed an attempt, but a lock wait fails first (lock_timeout, a third of
// TxTimeout) and is retried as the database's. A dead letter Kafka refuses for good (too large for
// the DLQ topic or the client, an ACL denial) is never skipped: after a few
// tries Run returns an error wrapping ErrDeadLetterRefused, and the record
// waits, unmarked and uncommitted, for a member that can send it.
//
// Order after a dead letter: the aggregate's later events are applied
// without it (the inbox does not park an aggregate behind its dead letter),
// and a redrive applies it after them, out of order. A handler whose events
// must apply in order parks the aggregate itself instead of failing: it
// tries the work in a savepoint (tx.Begin), and when that fails for the
// record it stores the event in a parked table of its own and returns nil;
// an event of an aggregate found there is stored behind it; resolving the
// parked events applies them in order. To redrive a dead letter, publish the
// DLQ record to its source topic, unchanged or as Redrive builds it: it
// carries RedriveHeader, and the inbox applies a dead-lettered id once more,
// in the group that dead-lettered it only (ConsumerHeader); RedriveID takes
// a dead letter written before the header existed.
//
// Processed ids are deleted after Retention (default DefaultRetention, 20
// days). A duplicate that arrives later than that is processed again: keep
// Retention longer than the duplicate window, which is not only relay outage
// plus consumer lag but also the outbox row lifetime (the connector's
// initial snapshot republishes the table) plus the topic's retention (a
// consumer that lost its offsets reads the topic again), plus, through the
// outbox-router, its change topic's retention (a router that lost its
// offsets republishes it); see Window, and state a deployment's own in
// Config.Window.
//
// Records of one partition are handled in order, one at a time; each
// assigned partition has a goroutine of its own, so a partition does not
// wait for another's records (a slow handler, a retry, a backlog), except
// during a rebalance (see Config.MaxPollRecords).
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Handler does the business work of one record inside tx. It must do all
// its database writes through tx (and nothing non-transactional it cannot
// repeat: a handler may run again after a crash before the commit). A
// returned error rolls tx back; the record is retried.
type Handler func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Config configures a Consumer. Brokers, Group and Topics are required.
type Config struct {
	// Brokers are the Kafka bootstrap brokers.
	Brokers []string
	// Group is the consumer group; it is also the dedupe scope: two groups
	// sharing the table dedupe independently.
	Group string
	// Topics to consume (e.g. "outbox.event.Order").
	Topics []string
	// KafkaOpts are extra franz-go options (TLS, SASL, logging, start
	// offset, kgo.FetchMaxPartitionBytes, a balancer). The Consumer sets
	// the group, topics, commits of what it marked, rebalance blocking and
	// the rebalance callbacks (OnPartitionsRevoked, OnPartitionsLost, which
	// replace any given here) itself; franz-go refuses kgo.DisableAutoCommit
	// beside its marks.
	KafkaOpts []kgo.Opt
	// Table is the processed-events table (default "public.inbox";
	// EnsureSchema creates it).
	Table string
	// DLQTopic receives records that keep failing (default "inbox.dlq").
	DLQTopic string
	// MaxAttempts is how many times the handler runs for a record before
	// the record is dead-lettered (default 5).
	MaxAttempts int
	// RetryBackoff is the first wait between attempts, doubled up to 5s
	// (default 100ms); each wait is drawn from the upper half of its
	// nominal one, so that members retrying after one outage spread out.
	RetryBackoff time.Duration
	// TxTimeout is the deadline of each attempt's transaction, the handler
	// included (default 30s). A handler cut by it has failed an attempt
	// (the inbox cannot tell a hung handler from a slow database). Lock
	// waits are kept apart: each transaction starts with lock_timeout at a
	// third of TxTimeout (10s by default) unless the session has a lower
	// one, so a wait for a lock held longer fails with 55P03, which is
	// transient, and is retried without limit. Each lock acquisition has
	// its own lock_timeout: a handler that waits for more than two locks in
	// turn sets a lower one (SET LOCAL lock_timeout). Set statement_timeout
	// below TxTimeout for slow statements that must be retried without
	// limit too. A handler that ignores its ctx cannot be cut; the inbox
	// logs it.
	TxTimeout time.Duration
	// MaxPollRecords bounds the records taken per poll and the records
	// queued per partition (default 500). Each assigned partition has a
	// worker that handles its records in order, one at a time; a
	// partition's fetching pauses once its queue holds MaxPollRecords
	// records or 1 MiB (the poll that fills it may add up to one poll's
	// more), and resumes when it is down to half. A rebalance waits for
	// the partitions it moves: for an attempt in flight (TxTimeout; a
	// handler that ignores its ctx, longer) or a dead letter being sent
	// (up to 30 s) and marked (TxTimeout), not for queued records, which go
	// to the next owner. Meanwhile no partition of the member is handed
	// new records; with an eager balancer (kgo.Balancers in KafkaOpts)
	// every rebalance moves every partition and empties every queue.
	MaxPollRecords int
	// Retention is how long processed ids are kept (default
	// DefaultRetention, 20 days): longer than the duplicate window (see
	// Window), or a late duplicate is processed again. New refuses one
	// that does not exceed Window's bound, and without Window warns when it
	// does not exceed DefaultWindow's.
	Retention time.Duration
	// Window is this deployment's duplicate window (its outbox row lifetime,
	// topic retention and segment.ms, the outbox-router's change topic, lag),
	// when it is not the defaults': New checks Retention against it and
	// refuses one that does not exceed its Bound. Default: nil, and a
	// Retention inside DefaultWindow's bound is only warned about.
	Window *Window
	// CleanupInterval is how often expired ids are deleted (default 1m).
	CleanupInterval time.Duration
	// CleanupBatch is the number of ids per DELETE (default 1000).
	CleanupBatch int
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// TracerProvider makes the span around each handler attempt, a child
	// of the trace context in the record's traceparent/tracestate headers,
	// whose ctx the handler gets (default otel.GetTracerProvider(): the
	// program's global provider, a no-op unless it installs one).
	TracerProvider trace.TracerProvider
	// Registerer, when set, gets the Consumer's metrics (inbox_*_total
	// with the label group; see Stats). Consumers of one group on one
	// Registerer share the series, summed; one that replaces a Consumer
	// whose Run ended continues them. Default: none.
	Registerer prometheus.Registerer
}

// Stats are counters since the Consumer started.
type Stats struct {
	Processed    int64 // handler committed
	Duplicates   int64 // skipped: id already processed
	DeadLettered int64 // sent to the DLQ topic
	Retries      int64 // attempts that failed for the record and were retried
	Cleaned      int64 // expired ids deleted
	// IDReused counts records whose id was already processed with a
	// different payload: each is dead-lettered (and counted in
	// DeadLettered too), never skipped as a duplicate.
	IDReused int64
	// TransientRetries counts attempts that failed for the database (or
	// the way to it), for the deployment (a table, column, function or
	// privilege missing) or for a dependency (Transient), and were retried
	// without counting towards MaxAttempts; inbox_retries_total tells them
	// apart by its fault label.
	TransientRetries int64
	// Redriven counts dead-lettered ids taken back by a record carrying
	// RedriveHeader (the handler then ran; see Processed for its commits).
	Redriven int64
	// CleanupFailures counts cleanup runs that failed (logged, retried at
	// the next CleanupInterval); while they fail, the table grows.
	CleanupFailures int64
}

// Consumer is an idempotent consumer; create it with New, run it with Run.
type Consumer struct {
	cfg   Config
	table string // quoted
	begin string // beginSQL for cfg.TxTimeout
	db    *pgxpool.Pool
	h     Handler
	cl    *kgo.Client
	// tracer makes the handler's spans (Config.TracerProvider).
	tracer trace.Tracer
	log    *slog.Logger

	processed, duplicates, deadLettered, retries, cleaned atomic.Int64
	reused, transient, redriven                           atomic.Int64
	deployment, dependency                                atomic.Int64 // retries by fault, beside transient (faultDB)
	cleanFail                                             atomic.Int64

	work    atomic.Pointer[workers] // Run's, for the rebalance callbacks
	metrics *collector              // nil without Config.Registerer
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func quoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) == 1 {
		parts = []string{"public", parts[0]}
	}
	if len(parts) != 2 || !identRE.MatchString(parts[0]) || !identRE.MatchString(parts[1]) {
		return "", fmt.Errorf("inbox: table %q: want schema.name of plain identifiers", name)
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// New validates cfg and creates the Kafka client. Call EnsureSchema (or
// apply Schema) first.
func New(db *pgxpool.Pool, h Handler, cfg Config) (*Consumer, error) {
	switch {
	case db == nil:
		return nil, errors.New("inbox: a database pool is required")
	case h == nil:
		return nil, errors.New("inbox: a handler is required")
	case len(cfg.Brokers) == 0:
		return nil, errors.New("inbox: Config.Brokers: missing; set the Kafka bootstrap brokers")
	case cfg.Group == "":
		return nil, errors.New("inbox: Config.Group: missing; set the consumer group")
	case len(cfg.Topics) == 0:
		return nil, errors.New("inbox: Config.Topics: missing; set the topics to consume")
	}
	if cfg.Table == "" {
		cfg.Table = "public.inbox"
	}
	table, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.DLQTopic == "" {
		cfg.DLQTopic = "inbox.dlq"
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = 100 * time.Millisecond
	}
	// DefaultRetention; refused inside Config.Window, warned about inside
	// the defaults' window without it.
	if cfg.Retention, err = retentionOrDefault(cfg.Retention, cfg.Window, cfg.Logger); err != nil {
		return nil, err
	}
	if cfg.CleanupInterval <= 0 {
		cfg.CleanupInterval = time.Minute
	}
	if cfg.CleanupBatch <= 0 {
		cfg.CleanupBatch = 1000
	}
	if cfg.TxTimeout <= 0 {
		cfg.TxTimeout = 30 * time.Second
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = 500
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	c := &Consumer{cfg: cfg, table: table, db: db, h: h, tracer: cfg.TracerProvider.Tracer(instrumentation),
		begin: fmt.Sprintf(beginSQL, lockTimeout(cfg.TxTimeout).Milliseconds()),
		log:   cfg.Logger.With("component", "inbox", "group", cfg.Group)}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		// Offsets are committed only for records whose transaction
		// committed (marked), never for merely polled ones.
		kgo.AutoCommitMarks(),
		// Every second (Java's default is 5 s): a commit costs little, and
		// each record committed is one fewer to find in the table again
		// after a crash.
		kgo.AutoCommitInterval(time.Second),
		// No rebalance while a poll's records are handed to the partitions'
		// workers, so that a revoke finds every worker it must stop, and a
		// partition is never handled by two workers at once.
		kgo.BlockRebalanceOnPoll(),
		// Java's default (franz-go's is 5 s): a partition resumed after its
		// queue drained is fetched only once the fetch in flight returns.
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // DLQ records keep the key's partition
	}, cfg.KafkaOpts...)
	// After KafkaOpts: a revoke must stop the partitions' workers before
	// another member takes them.
	opts = append(opts, kgo.OnPartitionsRevoked(c.revoked), kgo.OnPartitionsLost(c.lost))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: create Kafka client: %w", err)
	}
	c.cl = cl
	if err := c.register(cfg.Registerer); err != nil {
		cl.Close()
		return nil, err
	}
	return c, nil
}

// Stats returns the counters.
func (c *Consumer) Stats() Stats {
	return Stats{Processed: c.processed.Load(), Duplicates: c.duplicates.Load(),
		DeadLettered: c.deadLettered.Load(), Retries: c.retries.Load(), Cleaned: c.cleaned.Load(),
		IDReused: c.reused.Load(), Redriven: c.redriven.Load(), CleanupFailures: c.cleanFail.Load(),
		TransientRetries: c.transient.Load() + c.deployment.Load() + c.dependency.Load()}
}

// Client is the Consumer's franz-go client (for metrics or lag checks).
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Run consumes until ctx is done, then commits what was processed, leaves
// the group and closes the client. It returns nil on cancellation, and an
// error wrapping ErrDeadLetterRefused when Kafka refuses a dead letter for
// good (after committing what was processed before it, which it leaves to
// the next owner).
func (c *Consumer) Run(ctx context.Context) error {
	if c.metrics != nil {
		defer c.metrics.retire(c) // last: once nothing counts any more
	}
	defer c.cl.Close() // leaves the group: onRevoked, then the client ends
	// Before Close, also after a panic between a poll and its
	// AllowRebalance: Close's leave waits for it (a second call is a no-op).
	defer c.cl.AllowRebalance()
	if err := c.ensureDLQTopic(ctx); err != nil {
		c.log.Debug("could not create the DLQ topic; it may exist or be auto-created", "topic", c.cfg.DLQTopic, "err", err)
	}
	wctx, stopWork := context.WithCancel(ctx)
	var failMu sync.Mutex
	var failed error
	ws := &workers{c: c, ctx: wctx, m: map[tp]*worker{}, fail: func(err error) {
		failMu.Lock()
		defer failMu.Unlock()
		if failed == nil {
			failed = err
		}
		stopWork()
	}}
	c.work.Store(ws)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.cleanupLoop(wctx) }()
	defer wg.Wait()
	defer stopWork() // before the Wait: also when Run ends by a panic
	for {
		// Handing records out is quick (each partition's worker handles
		// them), so a rebalance waits for it only (BlockRebalanceOnPoll),
		// and then for the attempts in flight of the partitions it takes.
		fs := c.cl.PollRecords(wctx, c.cfg.MaxPollRecords)
		if wctx.Err() != nil {
			// Rebalances wait until the workers are done and what they
			// marked is committed: a revoke meanwhile would find no worker
			// to wait for and let another member take a partition whose
			// attempt is still in flight here.
			ws.stopAll() // ctx is done: attempts in flight end at once
			c.commit(context.Background(), c.cl)
			c.cl.AllowRebalance()
			failMu.Lock()
			defer failMu.Unlock()
			if failed != nil {
				c.log.Error("inbox member stopping", "err", failed)
			}
			return failed
		}
		fs.EachError(func(topic string, p int32, err error) {
			c.log.Warn("fetch failed; retrying", "topic", topic, "partition", p, "err", err)
		})
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				ws.push(p)
			}
		})
		c.cl.AllowRebalance()
	}
}

func (c *Consumer) works() *workers { return c.work.Load() }

// revoked stops the revoked partitions' workers and commits what they
// marked, before the partitions go to another member (franz-go calls it,
// as onRevoked, once polls are allowed to rebalance).
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
	if ws := c.works(); ws != nil {
		ws.stop(parts)
	}
	c.commit(ctx, cl) // cl: c.cl may not be set yet (the group joins in kgo.NewClient)
}

// lost stops the lost partitions' workers (the member is out of the group:
// a commit would fail, and another member may have the partitions by now).
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	if ws := c.works(); ws != nil {
		ws.stop(parts)
	}
}

// commit commits the marked offsets, retrying a few times while Kafka is
// unreachable. Giving up is safe: the offsets stay marked and go with the
// next commit (or the one on revoke or close); records redelivered meanwhile
// are found in the table and skipped.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client) {
	backoff := retry.New(c.cfg.RetryBackoff, maxBackoff)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := cl.CommitMarkedOffsets(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		if attempt >= 3 {
			c.log.Warn("offset commit failed; it goes with the next batch", "err", err)
			return
		}
		sleep(ctx, backoff.NextBackOff())
	}
}

// ErrPermanent marks a handler error that retrying cannot fix.
var ErrPermanent = errors.New("permanent failure")

// Permanent wraps err so that the record goes to the DLQ without retries.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// ErrTransient marks a handler error that passes on retry and says nothing
// about the record: a service the handler calls is unavailable or busy.
var ErrTransient = errors.New("transient failure")

// Transient wraps err so that the record is retried with backoff, without
// limit and without counting towards MaxAttempts, never dead-lettered (a
// payment gateway answering 503, a rate limit). The record's partition waits
// meanwhile: wrap only failures that pass. The retries are logged and counted
// in inbox_retries_total{fault="dependency"}. Permanent wins over Transient.
func Transient(err error) error { return fmt.Errorf("%w: %w", ErrTransient, err) }

// Header returns a record header's value ("" when absent).
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// ensureDLQTopic creates the DLQ topic when it is missing, with the
// broker's default partitions and replication. At Run's start it is best
// effort (a broker that auto-creates topics, or an operator, may do it
// instead, and Kafka may be away for a moment); deadLetter calls it again
// when the topic turns out to be missing. It returns nil when the topic was
// created or exists.
func (c *Consumer) ensureDLQTopic(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(c.cl).CreateTopic(cctx, -1, -1, nil, c.cfg.DLQTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create DLQ topic %q: %w", c.cfg.DLQTopic, err)
	}
	return nil
}

// maxBackoff caps the waits between retries (RetryBackoff doubled).
const maxBackoff = 5 * time.Second

func sleep(ctx context.Context, d time.Duration) { sleepOr(ctx, nil, d) }

// sleepOr waits for d, or until ctx is done or stop is closed.
func sleepOr(ctx context.Context, stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-stop:
	case <-t.C:
	}
}

// ended is ctx's error, or errStopped once stop is closed.
func ended(ctx context.Context, stop <-chan struct{}) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-stop:
		return errStopped
	default:
		return nil
	}
}
