// Package relay runs the connector: it competes for the slot's leader lease
// and, while it holds it, fences the previous leader (Kafka producer epoch,
// the slot's old walsender), prepares the slot (creating it with an initial
// snapshot, or adopting it after checking it against the state row), streams
// it into the producer, persists what it confirms, and reconnects with capped
// backoff after transient failures. Losing the lease stops it at once.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
	"github.com/twmb/franz-go/plugin/kslog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/pgdurable"
	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Relay is the connector.
type Relay struct {
	cfg     config.Config
	log     *slog.Logger
	metrics *metrics.Metrics
	router  *route.Router

	schema, table string
	// allowGap is connector recover -allow-gap: it lets the recovery of the
	// process's first session go on without the table showing that its
	// window is whole, and lapses once a session prepared its slot.
	allowGap atomic.Bool

	// Visible state for metrics and health.
	streaming atomic.Bool
	cur       atomic.Pointer[tracker.Tracker]
	confirmed atomic.Uint64
	kafkaPos  atomic.Uint64 // commit LSN of the exactly-once position Kafka holds (0: none)
	stall     stallWatch    // the liveness clock: work owed, and since when without progress
	lastErr   atomic.Pointer[string]
	published atomic.Int64
	// Poll mode (OUTBOX_SOURCE=poll): the instance runs (it owes its share
	// of the work, as a leader does: the stall watch counts sessions that
	// keep failing), a session is reading, and how many buckets it owns.
	pollRunning atomic.Bool
	polling     atomic.Bool
	pollOwned   atomic.Int64
	oldest      oldestWatch  // poll mode: the table's oldest unpublished row
	pollScanned atomic.Int64 // poll mode: rows the table's scans fetched, by the server's statistics

	// tracer is SetTracer's (nil: no relay spans).
	tracer trace.Tracer

	elector *lease.Elector
	lead    atomic.Pointer[leadership] // the current or last term
	poison  publish.Poison             // records Kafka refused: suspects and the guilty, across sessions

	// faults, set by tests only, fails or stops a session at a named step.
	faults fault.Hook
	// replicationDSN, set by tests only, is the replication connection's
	// connection string (empty: OUTBOX_PG_DSN's), so that a test can put
	// that connection alone behind a proxy.
	replicationDSN string
}

// TokenHeader is the record header carrying the lease's fencing token
// (decimal text).
const TokenHeader = "outbox.lease.token"

// handOver is how many decoded events wait between the stream and the
// producer. It lets the stream keep reading while the producer is busy for
// a moment (a Kafka transaction commits in 10-20 ms, during which a drain
// decodes several hundred events) instead of stalling the walsender.
const handOver = 4096

// replicationReadBuffer is the read buffer under the replication
// connection.
const replicationReadBuffer = 256 << 10

// leadership is this instance's state during one term of the lease.
type leadership struct {
	term *lease.Term
	// established: the previous leader is fenced (Kafka producer epoch
	// bumped, the slot's old walsender gone); from then on the instance
	// reports itself leader.
	established atomic.Bool
	headers     []kgo.RecordHeader
}

// New returns a relay for cfg.
func New(cfg config.Config, router *route.Router, log *slog.Logger, m *metrics.Metrics) *Relay {
	schema, table := cfg.Table.Schema, cfg.Table.Name
	if cfg.Source == "poll" {
		// Poll mode is at-least-once: a batch is marked after Kafka acked
		// it, and a crash between the two publishes it again. Its
		// instances run at once, each with its own buckets, so one
		// transactional id would fence the others; Kafka transactions
		// would buy nothing here.
		cfg.Transactional = false
		cfg.TxnPipeline = false
	}
	r := &Relay{cfg: cfg, log: log, metrics: m, router: router, schema: schema, table: table}
	r.stall.timeout = cfg.StallTimeout
	r.allowGap.Store(cfg.RecoverAllowGap)
	r.elector = lease.New(lease.Config{
		DSN: cfg.PGDSN, Slot: cfg.Slot, Holder: lease.DefaultHolder(), TTL: cfg.LeaseTTL,
		// Without Kafka transactions nothing fences a deposed leader at the
		// broker: a standby waits until the old lease has expired.
		WaitForExpiry: !cfg.Transactional, Log: log.With("component", "lease"),
		OnAcquire: func(t *lease.Term) {
			m.Takeovers.Inc()
			m.LeaseToken.Set(float64(t.Token))
		},
	})
	// Computed at scrape time from the monotonic clock: a process resumed
	// after a freeze reports 0 at once, before its timers have run.
	m.GaugeFunc("outbox_connector_leader", "1 while this instance leads (holds the lease and has fenced the previous leader), 0 as a standby.", func() float64 {
		if r.Leading() {
			return 1
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_events_in_flight", "Events handed to Kafka and not yet acknowledged.", func() float64 {
		if t := r.cur.Load(); t != nil {
			return float64(t.Positions().InFlight)
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_oldest_unacked_age_seconds", "Age of the oldest transaction read from the WAL and not yet fully acknowledged.", func() float64 {
		if t := r.cur.Load(); t != nil {
			if at := t.OldestOpen(); !at.IsZero() {
				return time.Since(at).Seconds()
			}
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_received_lsn", "Newest WAL position received from the slot.", func() float64 {
		if t := r.cur.Load(); t != nil {
			return float64(t.Positions().Received)
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_acked_lsn", "WAL position up to which every event is acknowledged by Kafka or dead-lettered.", func() float64 {
		if t := r.cur.Load(); t != nil {
			return float64(t.Acked())
		}
		return 0
	})
	m.GaugeFunc("outbox_connector_confirmed_lsn", "WAL position recorded durably and confirmable to PostgreSQL.", func() float64 {
		return float64(r.confirmed.Load())
	})
	m.GaugeFunc("outbox_connector_kafka_position_lsn", "Commit LSN of the newest exactly-once position committed in Kafka (0 without one).", func() float64 {
		return float64(r.kafkaPos.Load())
	})
	m.GaugeFunc("outbox_connector_kafka_position_ahead_bytes", "How far the exactly-once position in Kafka is ahead of the position confirmed to PostgreSQL, in WAL bytes: what a restart now replays and skips (0 when behind or without one).", func() float64 {
		k, c := r.kafkaPos.Load(), r.confirmed.Load()
		if k > c {
			return float64(k - c)
		}
		return 0
	})
	if cfg.Source == "poll" {
		m.GaugeFunc("outbox_connector_poll_oldest_unpublished_age_seconds", "Poll mode: age of the oldest row of the outbox not yet published (by its created_at), as this instance last saw it; 0 when none.", func() float64 {
			return r.oldest.age(time.Now())
		})
		m.GaugeFunc("outbox_connector_poll_table_rows_scanned", "Poll mode: rows the scans of the outbox table fetched so far (pg_stat_user_tables seq_tup_read + idx_tup_fetch, its partitions included), read once a second; its rate over the rate of events published is the rows scanned per event.", func() float64 {
			return float64(r.pollScanned.Load())
		})
	}
	r.stallMetrics(m)
	return r
}

// Streaming reports whether a session is streaming the slot.
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// Leading reports whether this instance leads: it holds the lease, by its
// own monotonic clock, and has fenced the previous leader.
func (r *Relay) Leading() bool {
	if r.cfg.Source == "poll" {
		// Every instance publishes: one that owns buckets leads its share.
		return r.polling.Load() && r.pollOwned.Load() > 0
	}
	l := r.lead.Load()
	return l != nil && l.established.Load() && l.term.Valid()
}

// Token is the fencing token of the current or last term (0 before any).
func (r *Relay) Token() int64 {
	if l := r.lead.Load(); l != nil {
		return l.term.Token
	}
	return 0
}

// Ready reports a healthy leader or standby: not stalled, and able to see
// the lease (a standby that cannot could never take over).
func (r *Relay) Ready() (bool, string) {
	if stalled, why := r.Stalled(); stalled {
		return false, "stalled: " + why
	}
	if r.cfg.Source == "poll" {
		return true, ""
	}
	if ok, why := r.elector.Healthy(); !ok {
		return false, "lease: " + why
	}
	return true, ""
}

// Stalled reports work owed (events in flight, or read by a stream that
// ended before delivering them) with no progress (none acknowledged or
// dead-lettered, the acked position unmoved) for longer than the stall
// timeout (see stallWatch). A large transaction whose records are being
// acknowledged is not a stall, though its end LSN is acked only at the end;
// nothing owed on a streaming leader is never one, nor is anything on an
// instance without the lease. Holding the lease with no session past setup
// for that long is one, and so are sessions that keep ending with no
// progress for that long.
func (r *Relay) Stalled() (bool, string) { return r.stalledAt(time.Now()) }

// LastError is the last transient error (for /readyz detail).
func (r *Relay) LastError() string {
	if s := r.lastErr.Load(); s != nil {
		return *s
	}
	return ""
}

// Run competes for the lease until ctx is done, streaming while it leads.
// At shutdown a leader stops gracefully (stop reading, flush Kafka, confirm
// the last acked LSN) and then releases the lease, so that a standby takes
// over at once. Run returns nil then, or a fatal error.
func (r *Relay) Run(ctx context.Context) error {
	pool, err := openPool(ctx, r.cfg.PGDSN)
	if err != nil {
		return &fatal.Error{Msg: "OUTBOX_PG_DSN", Err: config.Redact(err, r.cfg.PGDSN)}
	}
	defer pool.Close()
	if r.cfg.Source == "poll" {
		return r.runPoll(ctx, pool)
	}
	return r.elector.Run(ctx, func(ctx context.Context, t *lease.Term) error { return r.leadTerm(ctx, t, pool) })
}

// openPool opens the connector's pool of normal connections (dead letters,
// the state row, the lease, catalog lookups), whose commits are durable
// whatever the database or role sets: a dead letter stored in the table is
// done, and the exactly-once position in Kafka then counts it, so a replay
// skips it; with synchronous_commit off, a crash could lose an insert the
// position already covers, and the event would be nowhere. A stricter
// setting (remote_write, remote_apply) is kept.
func openPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.AfterConnect = pgdurable.Ensure
	return pgxpool.NewWithConfig(ctx, cfg)
}

// leadTerm streams during one term, reconnecting after transient failures.
// It returns when ctx is done (nil after a graceful stop, whatever step it
// cut, unless the session failed fatally), when the term
// ends (its error wraps lease.ErrLost), or on a fatal error.
func (r *Relay) leadTerm(ctx context.Context, t *lease.Term, pool *pgxpool.Pool) error {
	l := &leadership{term: t, headers: []kgo.RecordHeader{{Key: TokenHeader, Value: []byte(strconv.FormatInt(t.Token, 10))}}}
	r.lead.Store(l)
	tctx := t.Context()
	backoff := retry.New(500*time.Millisecond, 30*time.Second)
	for {
		started := time.Now()
		err := r.session(ctx, l, pool)
		r.streaming.Store(false)
		switch {
		case tctx.Err() != nil:
			return t.Err()
		case ctx.Err() != nil:
			// A graceful stop: an error now is the stop's own (a step of
			// setup or of the snapshot cut by the cancelled context), and
			// the process exits 0. A fatal one still says what to fix.
			if fatal.Is(err) {
				return err
			}
			return nil
		case err == nil:
			// A session returns nil only when stopping (above): anything
			// else is a cause lost on the way, and restarting at once, with
			// no backoff, could loop.
			err = errors.New("the session ended with no error while the connector runs")
		case errors.Is(err, lease.ErrLost) && !t.Valid():
			return err
		case errors.Is(err, lease.ErrLost):
			// Fenced at Kafka while the lease is still ours: a leader
			// whose term had ended initialised the transactional id after
			// we did (it publishes nothing: its lease is gone). A new
			// session takes the id back.
			r.log.Warn("Kafka fenced this leader's producer although it holds the lease; starting a new session", "token", t.Token, "err", err)
		case fatal.Is(err):
			return err
		}
		wait := r.retryAfter(err, started, backoff, "stream")
		select {
		case <-ctx.Done():
			return nil
		case <-tctx.Done():
			return t.Err()
		case <-time.After(wait):
		}
	}
}

// target is the reconnect counter's label: "kafka" for a failure of the
// session's Kafka side (fencing the previous producer, the producer's own
// errors) unless PostgreSQL's error is inside it (the producer writes dead
// letters to a table too), "postgres" for everything else.
func target(err error) string {
	var ke *kafkaError
	var pgErr *pgconn.PgError
	if errors.As(err, &ke) && !errors.As(ke.err, &pgErr) {
		return "kafka"
	}
	return "postgres"
}

// kafkaError marks an error as met on the session's Kafka side; its text,
// and what errors.Is and errors.As find in it, are the error's own.
type kafkaError struct{ err error }

func (e *kafkaError) Error() string { return e.err.Error() }
func (e *kafkaError) Unwrap() error { return e.err }

// newKafkaClient returns the session's Kafka client: transactional with
// txnID when OUTBOX_KAFKA_TRANSACTIONAL is on. A client lives for one
// session, so a new session always starts with a new producer epoch; it
// must be closed before the next is made (its metrics are unregistered then).
// The pipeline's second client (second) registers no metrics of its own:
// the registry has franz-go's once, for the first.
func (r *Relay) newKafkaClient(txnID string, second bool) (*kgo.Client, error) {
	opts := r.cfg.Kafka.Opts(nil)
	opts = append(opts, publish.ClientOpts(r.cfg.MaxInFlight, r.cfg.MaxMessageBytes, r.cfg.Compression, r.cfg.Linger)...)
	if r.cfg.Transactional {
		opts = append(opts, kgo.TransactionalID(txnID))
		opts = append(opts, publish.TxnRetryOpts()...)
	}
	// WatchFailures: an idempotent producer halts at a refused batch,
	// before franz-go fails its records (see publish/idem.go).
	opts = append(opts, kgo.WithLogger(publish.WatchFailures(kafkaLogger{kslog.New(r.log.With("component", "kafka"))})))
	if second {
		opts = append(opts, kgo.WithHooks(kafkaDialErrors{r}))
	} else {
		opts = append(opts, kgo.WithHooks(kprom.NewMetrics("outbox_connector_kafka", kprom.Registerer(r.metrics.Registry)), kafkaDialErrors{r}))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &fatal.Error{Msg: "Kafka client settings (OUTBOX_KAFKA_*)", Err: err}
	}
	return cl, nil
}

// kafkaLogger demotes franz-go's info logs to debug: every Kafka
// transaction begins, flushes and ends with some.
type kafkaLogger struct{ kgo.Logger }

func (l kafkaLogger) Level() kgo.LogLevel {
	if lv := l.Logger.Level(); lv != kgo.LogLevelInfo {
		return lv
	}
	return kgo.LogLevelWarn
}

const querySlotWalsender = `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`

// freeSlot makes sure no other walsender holds the slot (the previous
// leader's, killed or frozen; or this instance's own from a broken
// connection) before the replication connection (pid own) starts streaming:
// it terminates it, which a role may do to its own sessions (another role's
// need pg_signal_backend), and waits until it has exited. Where it may not,
// it waits for the walsender to time out.
func (r *Relay) freeSlot(ctx context.Context, conn *pgx.Conn, own uint32) error {
	var lastKill time.Time
	warned := false
	for {
		var pid int32
		err := conn.QueryRow(ctx, querySlotWalsender, r.cfg.Slot).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && (pid == 0 || uint32(pid) == own) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up the walsender of slot %q: %w", r.cfg.Slot, err)
		}
		if time.Since(lastKill) > time.Second {
			lastKill = time.Now()
			var ok bool
			err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				r.log.Info("terminated the walsender still holding the slot (a previous leader's)", "slot", r.cfg.Slot, "pid", pid)
			case errors.As(err, &pgErr) && pgErr.Code == "42501":
				if !warned {
					warned = true
					r.log.Warn("the walsender of a previous leader still holds the slot and this role may not terminate it (run every instance as the same role, or GRANT pg_signal_backend TO the connector's role); waiting until it times out (wal_sender_timeout)",
						"slot", r.cfg.Slot, "pid", pid, "err", err)
				}
			default:
				return fmt.Errorf("terminate the walsender holding slot %q: %w", r.cfg.Slot, err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// producerConfig is the producer's configuration: headers are added to
// every record (the lease token), valid says whether this instance may still
// publish (nil: poll mode, where the buckets' locks fence).
func (r *Relay) producerConfig(headers []kgo.RecordHeader, valid func() bool) publish.Config {
	return publish.Config{
		DLQTopic: r.cfg.DLQTopic, MaxMessageBytes: r.cfg.MaxMessageBytes, TopicCreate: r.cfg.TopicCreate,
		TopicPartitions: int32(r.cfg.TopicPartitions), TopicReplication: int16(r.cfg.TopicReplicationFactor),
		TopicConfigs: r.cfg.TopicConfigs, Headers: func() []kgo.RecordHeader { return headers }, Published: &r.published,
		Transactional: r.cfg.Transactional, TxnInterval: r.cfg.TxnInterval, TxnMaxRecords: r.cfg.MaxInFlight,
		Poison: &r.poison, Valid: valid, Faults: r.faults, Tracer: r.tracer,
		// A producer waiting for what only an operator can fix (a missing
		// topic) says so in /readyz detail.
		Blocked: func(reason string) { r.lastErr.Store(&reason) },
	}
}

// SetTracer gives every record that carries a trace context (the outbox
// row's tracingspancontext) a span of the relay hop, from its commit to
// Kafka's ack, whose context the record's traceparent header then names
// (see package publish). Call it before Run; without it (the default) no
// span is made.
func (r *Relay) SetTracer(t trace.Tracer) { r.tracer = t }

// retryAfter records that a session failed with err (the last error, the
// reconnect counter, a log line naming what was interrupted) and returns
// how long to wait before the next; a session that ran for a minute starts
// the backoff again.
func (r *Relay) retryAfter(err error, started time.Time, backoff *backoff.ExponentialBackOff, what string) time.Duration {
	msg := config.RedactError(err, r.cfg.PGDSN)
	r.lastErr.Store(&msg)
	if time.Since(started) > time.Minute {
		backoff.Reset()
	}
	r.metrics.Reconnects.WithLabelValues(target(err)).Inc()
	wait := backoff.NextBackOff()
	r.log.Warn(what+" interrupted; reconnecting", "err", msg, "backoff", wait)
	return wait
}

// Published is how many records Kafka acknowledged since the start.
func (r *Relay) Published() int64 { return r.published.Load() }

// prepareSlot creates or adopts the slot and checks it against the state
// row. It returns the position to stream from, the state, and an open
// snapshot to publish first when one is due.
func (r *Relay) prepareSlot(ctx context.Context, t *lease.Term, conn *pgx.Conn, rconn *pgconn.PgConn, systemID string, timeline int32, db string, version int) (uint64, checkpoint.State, *snapshot, error) {
	// Every write records the server's timeline (State.Timeline).
	save := func(f func(context.Context, checkpoint.Execer, checkpoint.State, checkpoint.Fence) error, st checkpoint.State) error {
		st.Timeline = timeline
		return f(ctx, conn, st, checkpoint.Fence{Token: t.Token})
	}
	slot := r.cfg.Slot
	if r.cfg.SlotFailover && version < 170000 {
		return 0, checkpoint.State{}, nil, fatal.Errorf("OUTBOX_SLOT_FAILOVER=true needs PostgreSQL 17 or later (failover slots); this server is %d.%d: unset it, and see the README on failover before 17", version/10000, version%10000)
	}
	info, exists, err := wal.GetSlot(ctx, conn, slot)
	if err != nil {
		return 0, checkpoint.State{}, nil, err
	}
	st, hasState, err := checkpoint.LoadState(ctx, conn, slot)
	if err != nil {
		return 0, st, nil, err
	}
	// A state row that only records the intent to create the slot (a
	// start that died, or failed, between recording it and recording the
	// new slot's position) is not a slot the connector streamed.
	creating := hasState && st.Creating() && st.SystemID == systemID
	// A recovery that was interrupted (its intent recorded, the slot
	// created or not, its window not yet published) goes on.
	var window *recoveryWindow
	if creating && st.Recovering {
		w := windowOf(st)
		window = &w
	}
	if exists && info.Synced && hasState && !creating && st.SystemID == systemID && info.WALStatus != "lost" && info.ConfirmedFlush > st.Confirmed &&
		st.Timeline != 0 && st.Timeline < timeline {
		// A failover slot synchronized from the former primary, on this
		// promoted standby (the row was last written on an earlier
		// timeline; synced stays true on a promoted server for good, so
		// only the first start after the promotion may take this path):
		// its position is one this connector confirmed there, after
		// everything before it was delivered. The standby syncs a
		// position once it has the WAL up to it, and the state row
		// written before that confirmation may not have replicated yet:
		// the row lags, the slot did not move behind its back.
		r.log.Info("continuing from the failover slot synchronized from the former primary; recording its position, which the replicated state row had not reached",
			"slot", slot, "slot_confirmed", wal.FormatLSN(info.ConfirmedFlush), "state_confirmed", wal.FormatLSN(st.Confirmed))
		st.Confirmed = info.ConfirmedFlush
		if err := save(checkpoint.SaveState, st); err != nil {
			return 0, st, nil, err
		}
	}
	if how := slotLost(exists, info, st, hasState, creating, systemID); how != "" && r.cfg.OnSlotLoss == "recover" {
		if exists {
			if err := checkOwnKind(info, db); err != nil {
				return 0, st, nil, err
			}
		}
		if err := r.checkRowSecurity(ctx, conn); err != nil {
			return 0, st, nil, err
		}
		w := windowOf(st)
		if st.SystemID != systemID {
			has, err := r.hasCreatedAt(ctx, conn)
			if err != nil {
				return 0, st, nil, err
			}
			w = w.acrossClusters(has)
		}
		// Checked before the lost slot is dropped, so that a refusal
		// changes nothing; and again in the snapshot the window is read
		// from (openSnapshot), which is what the publish relies on.
		n, err := r.checkRecoverable(ctx, conn, w)
		if err != nil {
			return 0, st, nil, err
		}
		if exists {
			if err := r.dropLostSlot(ctx, conn, info); err != nil {
				return 0, st, nil, err
			}
		}
		r.log.Warn("replication slot "+how+"; recovering: a new slot, and the outbox rows that may not have been delivered published again from the table in its snapshot",
			"slot", slot, "confirmed", wal.FormatLSN(st.Confirmed), "window_rows", n, "whole_table", w.whole,
			"from_xid", w.from.Xmin, "from_lsn", wal.FormatLSN(w.from.LSN), "from_time", w.from.At)
		r.metrics.SlotRecoveries.Inc()
		exists, creating, window = false, true, &w
	}
	if exists && info.WALStatus == "lost" && r.cfg.AcceptSlotReset && r.cfg.OnSlotLoss != "recover" {
		// The operator published the gap's events some other way and
		// accepts the reset: the invalidated slot is replaced.
		if err := checkOwnKind(info, db); err != nil {
			return 0, st, nil, err
		}
		if err := r.dropLostSlot(ctx, conn, info); err != nil {
			return 0, st, nil, err
		}
		r.log.Warn("OUTBOX_ACCEPT_SLOT_RESET=true: dropped the invalidated slot to create a new one; events of its gap are not published again", "slot", slot, "confirmed", wal.FormatLSN(st.Confirmed))
		exists = false
	}
	if !exists {
		if hasState && st.SystemID != systemID && window == nil {
			// Another cluster's state row (a logical restore, or a copy of
			// the database onto another cluster, the state table copied
			// along) and no slot here. Not a new deployment: the row says a
			// connector streamed this outbox, and what it had not delivered
			// when the copy was taken, and what was written since, would
			// never be published (with OUTBOX_SNAPSHOT=never, nothing of
			// it). Refused, as the same row beside a slot that exists is
			// (checkpoint.CheckSlotAgainstState): what a Debezium operator
			// learnt the hard way is that a connector that finds its
			// offsets but not its slot, and creates one silently, skips
			// everything in between; PostgreSQL itself never carries a
			// slot across a logical restore. A warning and an initial
			// snapshot would publish only what the table still holds,
			// which nothing here shows to be whole.
			if !r.cfg.AcceptSlotReset {
				return 0, st, nil, fatal.Errorf("replication slot %q is missing, and the state row (public.outbox_connector_state) was written by another cluster: system identifier %s, this is %s "+
					"(a logical restore or a copy of the database onto another cluster, the state table copied along). The events the connector there had not delivered (it confirmed %s there), and those written since, may never be published if this start took it for a new deployment. "+
					"Start with OUTBOX_ON_SLOT_LOSS=recover (or run connector recover once) to create a new slot and publish again, from the outbox table, every event created since the row's last recovery point (by time: that cluster's transaction ids mean nothing here); "+
					"or check the outbox table for events that never reached Kafka yourself, publish them, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to create a new slot (with OUTBOX_SNAPSHOT=initial it publishes the table as its initial snapshot)",
					slot, st.SystemID, systemID, wal.FormatLSN(st.Confirmed))
			}
			r.log.Warn("OUTBOX_ACCEPT_SLOT_RESET=true: the state row was written by another cluster and its slot is missing here; creating a new slot as for a new deployment: events that cluster's connector had not delivered are not published again",
				"slot", slot, "state_system_id", st.SystemID, "system_id", systemID, "snapshot", r.cfg.Snapshot)
		}
		if hasState && !creating && st.SystemID == systemID && !r.cfg.AcceptSlotReset {
			return 0, st, nil, fatal.Errorf("replication slot %q is gone, but the connector streamed it before (confirmed %s): it was dropped behind the connector's back (or this server is a standby promoted without it), so events written since may never be published. "+
				"Start with OUTBOX_ON_SLOT_LOSS=recover (or run connector recover once) to create a new slot and publish again, from the outbox table, every event that may not have been delivered; "+
				"or check the outbox table for events after that position yourself, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to create a new slot", slot, wal.FormatLSN(st.Confirmed))
		}
		initial := r.cfg.Snapshot == "initial" || window != nil
		// What the slot carried stays known across a new slot of the same
		// cluster: a later loss must still refuse a recovery that cannot
		// be complete.
		messages := hasState && st.SystemID == systemID && st.MessagesSeen
		if initial {
			// Before the slot exists: a snapshot that cannot be read whole
			// is refused before it pins WAL.
			if err := r.checkRowSecurity(ctx, conn); err != nil {
				return 0, st, nil, err
			}
			// Record the intent before the slot exists: CREATE_REPLICATION_SLOT
			// makes a persistent slot at once, and if anything fails before
			// the snapshot is recorded as done (importing it, the state
			// write, the lease, a kill), the next start must know that this
			// slot is the connector's own and still owes its snapshot,
			// rather than adopt it as an operator's slot and skip the rows
			// written before it.
			intent := checkpoint.State{Slot: slot, SystemID: systemID, MessagesSeen: messages}
			if window != nil {
				// A recovery's intent keeps its window (no point: the whole
				// table) and what shows it whole: the start after a failure
				// here publishes it, not the initial snapshot.
				intent.Recovering, intent.Recover, intent.Floor = true, window.from, window.floor
			}
			if err := save(checkpoint.ResetState, intent); err != nil {
				return 0, st, nil, err
			}
			if err := r.faults.At(fault.SlotIntent); err != nil {
				return 0, st, nil, err
			}
		}
		if !initial {
			if err := r.checkPollHandover(ctx, conn); err != nil {
				return 0, st, nil, err
			}
		}
		consistent, snapName, err := wal.CreateSlot(ctx, rconn, slot, initial, r.cfg.SlotFailover)
		if err != nil {
			return 0, st, nil, err
		}
		r.log.Info("created replication slot", "slot", slot, "plugin", "pgoutput", "lsn", wal.FormatLSN(consistent), "snapshot", r.cfg.Snapshot, "failover", r.cfg.SlotFailover)
		if err := r.faults.At(fault.SlotCreated); err != nil {
			return 0, st, nil, err
		}
		if !initial {
			if err := r.awaitPollHandover(ctx, conn); err != nil {
				return 0, st, nil, err
			}
		}
		st = checkpoint.State{Slot: slot, SystemID: systemID, Confirmed: consistent, SnapshotDone: !initial, MessagesSeen: messages}
		if window != nil {
			st.Recovering, st.Recover = true, window.from
		}
		var snap *snapshot
		if initial {
			// Import the exported snapshot before anything else runs on the
			// replication connection: the next command there ends it. It
			// is the first to read the rows the slot owes: it takes their
			// floor, recorded below.
			snap, err = r.openSnapshot(ctx, snapName, window, checkpoint.Floor{})
			if err == nil {
				st.Floor = snap.floor
			}
			if err == nil {
				err = r.faults.At(fault.SnapshotImported)
			}
			if err != nil {
				if snap != nil {
					snap.close(ctx)
				}
				return 0, st, nil, err
			}
		}
		err = save(checkpoint.ResetState, st)
		if err == nil {
			err = r.faults.At(fault.StateWritten)
		}
		if err != nil {
			if snap != nil {
				snap.close(ctx)
			}
			return 0, st, nil, err
		}
		st.Timeline = timeline
		return consistent, st, snap, nil
	}
	if err := wal.CheckSlot(info, db); err != nil {
		return 0, st, nil, err
	}
	if r.cfg.SlotFailover && !info.Failover {
		if err := wal.SetFailover(ctx, rconn, slot); err != nil {
			return 0, st, nil, err
		}
		r.log.Info("made the slot a failover slot (OUTBOX_SLOT_FAILOVER=true)", "slot", slot)
	}
	if creating {
		// The connector created this slot, but died or failed before it
		// recorded the slot's position: the exported snapshot is gone, so
		// the snapshot is taken again below from the table as it is now,
		// and streaming starts at the slot's own position. Rows committed
		// in between are both read and streamed: duplicates, never losses.
		r.log.Warn("found the slot this connector was creating when its last start failed; recording its position and taking the initial snapshot again", "slot", slot, "lsn", wal.FormatLSN(info.ConfirmedFlush), "recovering", st.Recovering)
		st = checkpoint.State{Slot: slot, SystemID: systemID, Confirmed: info.ConfirmedFlush, Recovering: st.Recovering, Recover: st.Recover, MessagesSeen: st.MessagesSeen, Floor: st.Floor}
		if err := save(checkpoint.ResetState, st); err != nil {
			return 0, st, nil, err
		}
		if err := r.faults.At(fault.StateWritten); err != nil {
			return 0, st, nil, err
		}
	}
	if !hasState {
		// A start that died waiting for poll mode's handover comes here
		// with the slot it created: it waits again.
		if err := r.awaitPollHandover(ctx, conn); err != nil {
			return 0, st, nil, err
		}
		st = checkpoint.State{Slot: slot, SystemID: systemID, Confirmed: info.ConfirmedFlush, SnapshotDone: true}
		if err := save(checkpoint.SaveState, st); err != nil {
			return 0, st, nil, err
		}
		r.log.Info("adopted existing replication slot as it is (no snapshot)", "slot", slot, "lsn", wal.FormatLSN(info.ConfirmedFlush))
		st.Timeline = timeline
		return info.ConfirmedFlush, st, nil, nil
	}
	if err := checkpoint.CheckSlotAgainstState(info, st, systemID); err != nil {
		if !r.cfg.AcceptSlotReset {
			return 0, st, nil, err
		}
		r.log.Warn("OUTBOX_ACCEPT_SLOT_RESET=true: continuing from the slot's position although events may have been skipped", "slot", slot, "err", err)
		st.SystemID = systemID
		st.Confirmed = info.ConfirmedFlush
		// The exactly-once positions in Kafka belong to the slot's old
		// history: a new one starts (see exactlyOnce).
		st.OffsetsEpoch, st.OffsetsLSN = 0, 0
		if err := save(checkpoint.ResetState, st); err != nil {
			return 0, st, nil, err
		}
	}
	if !st.SnapshotDone {
		// A crash during the initial snapshot: its exported snapshot is
		// gone, so re-read the table as it is now. Rows inserted since are
		// also streamed (duplicates, never losses).
		var w *recoveryWindow
		if st.Recovering {
			ww := windowOf(st)
			w = &ww
			r.log.Warn("the window of the slot's recovery was not all published before the last stop; publishing it again from the table as it is now", "slot", slot, "from_xid", ww.from.Xmin)
		} else {
			r.log.Warn("the initial snapshot did not complete before the last stop; taking it again from the table as it is now", "slot", slot)
		}
		// A recovery keeps the floor its first snapshot took: what it owes
		// was fixed then, and this snapshot is checked against it. An
		// initial snapshot owes the table as it is when read, so each
		// attempt takes its own; and a slot being created was never read
		// (its exported snapshot is gone): this is its first snapshot.
		floor := st.Floor
		if w == nil || creating {
			floor = checkpoint.Floor{}
		}
		snap, err := r.openSnapshot(ctx, "", w, floor)
		if err != nil {
			return 0, st, nil, err
		}
		if !floor.Taken {
			st.Floor = snap.floor
			if err := save(checkpoint.SaveState, st); err != nil {
				snap.close(ctx)
				return 0, st, nil, err
			}
		}
		st.Timeline = timeline
		return info.ConfirmedFlush, st, snap, nil
	}
	st.Timeline = timeline
	return info.ConfirmedFlush, st, nil, nil
}
