package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/internal/pgdurable"
	"github.com/pgoutbox/pgoutbox/relay/checkpoint"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/lease"
	"github.com/pgoutbox/pgoutbox/relay/offsets"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
)

// session is one connection to PostgreSQL and one Kafka client during term
// l, in its phases: connect, fence the previous leader, prepare the slot,
// stream (a snapshot first if one is due), stop. It returns nil on a
// graceful stop (ctx done), and an error wrapping lease.ErrLost when the
// term ended: then it stopped at once, publishing nothing more and
// confirming nothing more.
func (r *Relay) session(ctx context.Context, l *leadership, pool *pgxpool.Pool) error {
	t := l.term
	stop := newStopper(ctx, t.Context(), r.cfg.ShutdownTimeout)
	stop.t = t
	defer stop.release()

	c, err := r.connect(stop.read)
	if err != nil {
		return err
	}
	defer func() {
		// Bounded: on a path gone silent the goodbye (Terminate) goes to a
		// socket nothing drains, and must not hold up the next session.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		c.close(cctx)
	}()
	// What PostgreSQL holds the replication connection for (slot
	// creation waiting for transactions, synchronized_standby_slots),
	// said aloud; the watch ends before the connections close.
	defer r.watchWalsender(stop.read, pool, c.rconn.PID())()
	// The publication is created only together with a new slot (before
	// it, so that it exists at the slot's consistent point); for a slot
	// that exists a missing publication stops the connector (see
	// wal.EnsurePublication).
	if err := r.ensureObjects(stop.read, c.conn); err != nil {
		return err
	}
	sys, err := pglogrepl.IdentifySystem(stop.read, c.rconn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	db := c.conn.Config().Database

	// One transactional id per slot: the same for every instance that may
	// stream it, different for any other slot, database or cluster sharing
	// the Kafka cluster. Kafka ACLs can grant it by the prefix
	// "outbox-connector-".
	txnID := fmt.Sprintf("outbox-connector-%s-%s-%s", sys.SystemID, db, r.cfg.Slot)
	kcl, err := r.newKafkaClient(txnID, false)
	if err != nil {
		return err
	}
	closeKafka := sync.OnceFunc(kcl.Close)
	defer closeKafka()
	// The pipeline's second transactional id: the same for every instance,
	// and fenced by every new leader, with the pipeline or without (an
	// earlier leader may have run with it).
	var kcl2 *kgo.Client
	closeKafka2 := func() {}
	if r.cfg.Transactional {
		if kcl2, err = r.newKafkaClient(txnID+pipelineSuffix, true); err != nil {
			return err
		}
		closeKafka2 = sync.OnceFunc(kcl2.Close)
		defer closeKafka2()
	}
	if !r.cfg.Transactional {
		// Without Kafka transactions nothing at the broker fences this
		// producer, and the client goes on sending (and retrying) what it
		// buffered until it is closed: once the term ended, a standby may
		// take over (a guard after this instance's deadline), so close the
		// client at once rather than when the session has unwound (the
		// state writer or the snapshot may still wait on a dead database
		// connection then). Records it fails stay unacked and are read
		// again by the next leader.
		defer context.AfterFunc(stop.term, closeKafka)()
	}
	if err := r.fence(stop, kcl, kcl2, c, txnID); err != nil {
		return err
	}
	if !r.cfg.TxnPipeline {
		// Needed only to fence an earlier leader's use of it.
		closeKafka2()
		kcl2 = nil
	}
	l.established.Store(true)

	start, st, snapshot, err := r.prepareSlot(stop.read, t, c.conn, c.rconn, sys.SystemID, sys.Timeline, db, c.version)
	if err == nil {
		// -allow-gap was for the loss found at the start, which this
		// session recovered (or did not find).
		r.allowGap.Store(false)
		var eo *publish.Offsets
		eo, err = r.exactlyOnce(stop.read, kcl, c, sys, db, &st, t.Token)
		if err == nil {
			cfg := r.producerConfig(l.headers, t.Valid)
			cfg.Offsets = eo
			cfg.Pipeline = kcl2
			prod := publish.New(cfg, kcl, r.router, pool, r.log.With("component", "producer"), r.metrics)
			return r.stream(stop, c, pool, prod, eo, snapshot, st, start)
		}
		if snapshot != nil {
			snapshot.close(stop.soft)
		}
	}
	if stop.term.Err() != nil {
		return t.Err()
	}
	return err
}

// stopper is how one session stops, decided in one place. A soft stop (the
// connector is stopping: ctx done) finishes the transaction being read,
// flushes Kafka and confirms the last acked position; a hard stop is now:
// the term ended (another leader may already stream), or ShutdownTimeout
// passed since the soft stop began.
//
// The Jeffail/shutdown package Redpanda Connect uses is not served by the
// module proxy here, and ours needs the term as a second source of the hard
// stop: a few lines of contexts do it.
type stopper struct {
	t    *lease.Term     // the term
	soft context.Context // the caller's: done at a graceful stop
	term context.Context // the term's: done when it ended
	// read ends with a soft or a hard stop: every blocking step before
	// streaming, and reading (the snapshot and the stream), which cutRead
	// also ends (the producer or the state writer failed, or the graceful
	// stop stopped reading).
	read    context.Context
	cutRead context.CancelFunc
	// hard ends producing: ShutdownTimeout after the soft stop, or at once
	// with the term.
	hard       context.Context
	cancelHard context.CancelFunc
	unhook     func() bool // the term's hooks
}

func newStopper(ctx, term context.Context, grace time.Duration) *stopper {
	s := &stopper{soft: ctx, term: term}
	s.read, s.cutRead = context.WithCancel(ctx)
	s.hard, s.cancelHard = hardContext(ctx, grace)
	s.unhook = context.AfterFunc(s.term, func() { s.cutRead(); s.cancelHard() })
	return s
}

// graceful reports a soft stop while the term holds.
func (s *stopper) graceful() bool { return s.soft.Err() != nil && s.term.Err() == nil }

// release ends everything once the session has returned.
func (s *stopper) release() {
	s.unhook()
	s.cancelHard()
	s.cutRead()
}

// hardContext is cancelled d after parent is done: the graceful stop's
// deadline.
func hardContext(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	stop := context.AfterFunc(parent, func() {
		t := time.AfterFunc(d, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	return ctx, func() { stop(); cancel() }
}

// closeTimeout bounds closing a session's connections.
const closeTimeout = 5 * time.Second

// conns are a session's two connections to PostgreSQL: conn for queries
// and the state row, rconn for replication.
type conns struct {
	conn    *pgx.Conn
	rconn   *pgconn.PgConn
	version int // server_version_num
	// senderTimeout is rconn's wal_sender_timeout: the server's, capped at
	// the lease TTL (never 0).
	senderTimeout time.Duration
}

// close closes the replication connection first, then the other.
func (c *conns) close(ctx context.Context) {
	if c.rconn != nil {
		_ = c.rconn.Close(ctx)
	}
	_ = c.conn.Close(ctx)
}

// connect opens the session's connections.
func (r *Relay) connect(ctx context.Context) (*conns, error) {
	conn, err := pgx.Connect(ctx, r.cfg.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	// The state row is written on it: durable (see openPool).
	if err := pgdurable.Ensure(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	c := &conns{conn: conn}
	if err := r.connectReplication(ctx, c); err != nil {
		c.close(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

func (r *Relay) connectReplication(ctx context.Context, c *conns) error {
	dsn := r.cfg.PGDSN
	if r.replicationDSN != "" {
		dsn = r.replicationDSN
	}
	rcfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return &fatal.Error{Msg: "OUTBOX_PG_DSN", Err: config.Redact(err, dsn)}
	}
	rcfg.RuntimeParams["replication"] = "database"
	// PostgreSQL 18 says it skipped the publication only by a WARNING
	// (wal.Stream's notice), which client_min_messages = error set on the
	// role, the database or in the DSN's options would withhold: the skip
	// would be silent and confirmed past. A startup parameter outranks the
	// role's and the database's settings and the options' -c.
	rcfg.RuntimeParams["client_min_messages"] = "notice"
	// pgconn reads through an 8 KiB chunk buffer: one system call per few
	// messages while draining a backlog. A larger buffer under it takes
	// whatever the socket holds in one read.
	rcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, replicationReadBuffer), w)
	}
	var senderTimeout int64
	if err := c.conn.QueryRow(ctx, querySettings).Scan(&c.version, &senderTimeout); err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	// A frozen leader keeps its session, and its walsender keeps the slot
	// until wal_sender_timeout (60 s by default). Capped at the lease TTL on
	// this connection, it lets go about when a standby may take over, even
	// where the new leader may not terminate it. It is capped at the
	// stream's silence timeout too (see silenceTimeout), which must not be
	// shorter: while the walsender decodes a large transaction it answers
	// only every half of its own timeout, and a stream that took that for
	// silence would reconnect and start the decode again, forever (seen
	// with a 1 s silence timeout and a 4 s wal_sender_timeout: a 3-million-
	// row transaction of another table was never got past).
	limit := r.cfg.LeaseTTL
	if r.cfg.StreamSilenceTimeout > 0 {
		limit = min(limit, r.cfg.StreamSilenceTimeout)
	} else {
		limit = min(limit, maxSilence)
	}
	if ms := limit.Milliseconds(); senderTimeout == 0 || senderTimeout > ms {
		rcfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(ms, 10)
		senderTimeout = ms
	}
	c.senderTimeout = time.Duration(senderTimeout) * time.Millisecond
	// No TCP_USER_TIMEOUT on this side of the connection: pgconn has no
	// such client setting (tcp_user_timeout in the DSN is passed to the
	// server as a startup parameter, and sets the walsender's socket, not
	// ours; a custom DialFunc could set the socket option, on Linux only).
	// A silent path is noticed by the stream instead, on any platform and
	// with an error that says so (wal.Stream.SilenceTimeout).
	c.rconn, err = pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return fmt.Errorf("open replication connection: %w", err)
	}
	return nil
}

// querySettings reads what the session needs to know of the server;
// wal_sender_timeout in milliseconds (0: disabled).
const querySettings = `
SELECT current_setting('server_version_num')::int,
       (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout')`

// ensureObjects makes sure of the publication (see wal.EnsurePublication)
// and the state table.
func (r *Relay) ensureObjects(ctx context.Context, conn *pgx.Conn) error {
	info, slotExists, err := wal.GetSlot(ctx, conn, r.cfg.Slot)
	if err != nil {
		return err
	}
	var existing *wal.SlotInfo
	if slotExists {
		existing = &info
	}
	created, err := wal.EnsurePublication(ctx, conn, r.cfg.Publication, r.schema, r.table, existing)
	if err != nil {
		return err
	}
	if created {
		r.log.Info("created publication", "publication", r.cfg.Publication, "table", r.schema+"."+r.table)
	}
	return checkpoint.EnsureStateTable(ctx, conn)
}

// pipelineSuffix ends the slot's second transactional id.
const pipelineSuffix = "-b"

// fence makes this session the slot's only writer before anything is read:
// the previous leader's producers fenced at the broker (with Kafka
// transactions: the slot's transactional id on kcl, the pipeline's on kcl2)
// and its walsender gone from the slot.
func (r *Relay) fence(stop *stopper, kcl, kcl2 *kgo.Client, c *conns, txnID string) error {
	lt := stop.t
	for i, cl := range []*kgo.Client{kcl, kcl2} {
		if !r.cfg.Transactional || cl == nil {
			continue
		}
		id := txnID
		if i == 1 {
			id += pipelineSuffix
		}
		// InitProducerID bumps the epoch of the transactional id, which
		// aborts the previous leader's open transaction and refuses its
		// produce requests and commits from now on.
		pid, epoch, err := cl.ProducerID(stop.read)
		if err != nil {
			if stop.term.Err() != nil {
				return lt.Err()
			}
			if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
				// The second id too, with the pipeline off: an earlier
				// leader (under other credentials, say) may have used
				// it, and only its fence stops that one's late commit.
				return &fatal.Error{Msg: fmt.Sprintf("Kafka refused the transactional id %q; grant WRITE and DESCRIBE on transactional ids with the prefix outbox-connector- (each slot has two: the second ends in %s, and is fenced at every takeover even with OUTBOX_KAFKA_TXN_PIPELINE=false), or set OUTBOX_KAFKA_TRANSACTIONAL=false", id, pipelineSuffix), Err: err}
			}
			return &kafkaError{fmt.Errorf("initialise the Kafka transactional producer %q: %w", id, err)}
		}
		r.log.Info("Kafka producer initialised; earlier producers of the slot are fenced", "transactional_id", id, "producer_id", pid, "epoch", epoch, "token", lt.Token)
	}
	if err := r.freeSlot(stop.read, c.conn, c.rconn.PID()); err != nil {
		if stop.term.Err() != nil {
			return lt.Err()
		}
		return err
	}
	return nil
}

// stream publishes the snapshot if one is due, then streams the slot from
// start until a stop or a failure, and stops: gracefully (see stopGraceful)
// at a soft stop, at once at a hard one. The producer runs from the first
// event to the last, the state writer while the stream runs; both are
// joined before it returns.
func (r *Relay) stream(stop *stopper, c *conns, pool *pgxpool.Pool, prod *publish.Producer, eo *publish.Offsets, snapshot *snapshot, st checkpoint.State, start uint64) error {
	tr := tracker.New(start)
	r.cur.Store(tr)
	events := make(chan wal.Event, handOver)

	sw := checkpoint.NewWriter(c.conn, st, tr, stop.t, r.faults, func(lsn uint64) {
		r.confirmed.Store(lsn)
		// Every tick, moved or not: the stall clock restarts only if the
		// tracker counted progress since the last look.
		r.lookStall(time.Now())
	})
	r.confirmed.Store(min(st.Confirmed, start))
	// The stall watch reads the position the state row records from it.
	r.stall.writer.Store(sw)
	if eo != nil {
		// The state row records the newest position Kafka committed, so
		// that a start finding the offsets topic behind it says so.
		eo.Committed = func(p offsets.Position) {
			sw.KafkaCommitted(p.Commit)
			r.kafkaPos.Store(p.Commit)
		}
	}

	// Each group holds one goroutine; Wait joins it and returns its error
	// (the same at every call).
	var producing, writing errgroup.Group
	producing.Go(func() error { return prod.Run(stop.hard, events, stop.cutRead) })

	var streamErr error
	if snapshot != nil {
		streamErr = r.publishSnapshot(stop.read, snapshot, tr, events, start)
		if streamErr == nil {
			streamErr = r.faults.At(fault.SnapshotDone)
		}
		if streamErr == nil {
			// Recorded only once every snapshot row is acked: a crash before
			// this point takes the snapshot again at the next start.
			// The snapshot's point: every row it did not show has a
			// transaction id at least its xmin, and everything committed
			// up to start was in it.
			p := snapshot.point
			p.LSN = start
			streamErr = sw.SnapshotDone(stop.read, p)
			if streamErr != nil && stop.read.Err() == nil {
				r.stateWriteFailed(streamErr)
			}
		}
		snapshot.close(stop.soft)
	}
	if streamErr == nil {
		writing.Go(func() error {
			sw.Failed = r.stateWriteFailed
			err := sw.Run(stop.read, r.cfg.StatusInterval)
			if err != nil {
				r.stateWriteFailed(err)
			}
			if err != nil && stop.read.Err() == nil {
				stop.cutRead()
			}
			return err
		})
		streamErr = r.streamSlot(stop, c, pool, tr, events, sw, &writing, start)
	}
	stop.cutRead()
	close(events)
	prodErr := producing.Wait()
	swErr := writing.Wait()
	tr.Reset()
	return r.sessionResult(stop, prodErr, streamErr, swErr)
}

// streamSlot runs the stream and, at a soft stop, stops it gracefully.
func (r *Relay) streamSlot(stop *stopper, c *conns, pool *pgxpool.Pool, tr *tracker.Tracker, events chan<- wal.Event, sw *checkpoint.Writer, writing *errgroup.Group, start uint64) error {
	s := &wal.Stream{
		Conn: c.rconn, Slot: r.cfg.Slot, Publication: r.cfg.Publication, Schema: r.schema, Table: r.table,
		Messages: c.version >= 140000, Tracker: tr, Out: events, StatusInterval: r.cfg.StatusInterval,
		RecoverLoss: r.cfg.OnSlotLoss == "recover",
		StopGrace:   r.cfg.ShutdownTimeout / 2,
		Abort:       stop.term,
		Log:         r.log.With("component", "stream", "slot", r.cfg.Slot),
		Faults:      r.faults,
		Position:    sw,
		// An insert named by a partition of the outbox stops the stream
		// (a publication without publish_via_partition_root).
		IsOutboxPartition: wal.OutboxPartitionOf(pool, r.schema, r.table),
		// And so does one with the partitioned outbox's columns that is
		// no partition now (detached or dropped since the insert).
		OutboxColumns: wal.OutboxColumnsOf(pool, r.schema, r.table),
		// The columns a former partition must have: those the router
		// reads, not today's column set, which may have changed since.
		RoutingColumns: wal.RoutingColumns(r.router.Config()),
		// NOT NULL and defaults, for the schemas Debezium writes.
		ColumnInfo: wal.ColumnInfoOf(pool),
		// A path gone silent ends the session; the next reconnects.
		SilenceTimeout: r.silenceTimeout(c),
		Busy:           walsenderBusy(pool, c.rconn.PID()),
		Counters: wal.Counters{
			Ignored: func(kind string) { r.metrics.Ignored.WithLabelValues(kind).Inc() },
			Refused: r.metrics.Refused.Inc,
			Status:  r.metrics.StatusUpdates.Inc,
			Message: sw.SawMessage,
			Silent:  r.metrics.StreamSilent.Inc,
		},
	}
	r.streaming.Store(true)
	r.log.Info("streaming", "slot", r.cfg.Slot, "publication", r.cfg.Publication, "lsn", wal.FormatLSN(start), "token", stop.t.Token)
	err := s.Run(stop.read, start)
	r.streaming.Store(false)
	if err == nil && stop.graceful() {
		err = r.stopGraceful(stop, s, tr, sw, writing)
	}
	return err
}

// maxSilence is the longest default silence timeout.
const maxSilence = time.Minute

// silenceTimeout is the stream's SilenceTimeout: OUTBOX_STREAM_SILENCE_TIMEOUT,
// or by default the replication connection's wal_sender_timeout (the
// server's, capped at the lease TTL and at maxSilence: 10s with the
// defaults). Never shorter than that (connectReplication lowers the
// connection's wal_sender_timeout to a shorter setting): it is as long as
// the walsender waits for us before it takes us for dead, and a healthy
// walsender answers a request for a reply within half of it even while it
// decodes a large transaction (a 3-million-row transaction of another
// table, decoded for 7.5 s with a 4 s timeout on PostgreSQL 15, and for 4 s
// with a 1 s timeout on 13.23 and 15, was not taken for silence). So a
// stream that asked a quarter of the way in and heard nothing by the end is
// on a dead path, not behind a busy server.
func (r *Relay) silenceTimeout(c *conns) time.Duration {
	if r.cfg.StreamSilenceTimeout > 0 {
		return r.cfg.StreamSilenceTimeout
	}
	return c.senderTimeout
}

// stopGraceful stops a stream that ended at a soft stop: reading has
// stopped; wait for Kafka, record and confirm the last acked position, end
// the stream cleanly. The state writer stops first so that Finish owns the
// last write.
func (r *Relay) stopGraceful(stop *stopper, s *wal.Stream, tr *tracker.Tracker, sw *checkpoint.Writer, writing *errgroup.Group) error {
	stop.cutRead()
	_ = writing.Wait()
	err := s.Finish(stop.hard, func(fctx context.Context) uint64 {
		if err := sw.Write(fctx, max(tr.Acked(), s.SentFlush()), true); err != nil {
			r.stateWriteFailed(err)
			r.log.Warn("final state write failed", "err", err)
		}
		return sw.Durable()
	})
	if err == nil {
		r.log.Info("stopped; final position confirmed", "slot", r.cfg.Slot, "lsn", wal.FormatLSN(s.SentFlush()), "token", stop.t.Token)
	}
	return err
}

// sessionResult is what a session that ran its stream returns.
func (r *Relay) sessionResult(stop *stopper, prodErr, streamErr, swErr error) error {
	if stop.term.Err() != nil {
		// The term ended: whatever failed on the way out, the cause is that.
		return stop.t.Err()
	}
	// A producer error wrapping context.Canceled is the stop's own only
	// when this session is stopping (the term's end returned above).
	// Otherwise it is a failure (idempotent mode: records of another
	// partition failed with the halted session's context before the refused
	// batch's promise said why), and taken for a stop it restarted the
	// session at once, with no backoff and its reason lost.
	stopping := stop.soft.Err() != nil
	if prodErr != nil && (!stopping || !errors.Is(prodErr, context.Canceled)) {
		return &kafkaError{prodErr}
	}
	if streamErr != nil {
		return streamErr
	}
	if swErr != nil && !stopping {
		return swErr
	}
	return nil
}

// walsenderBusy is the stream's Busy: whether the walsender pid, seen
// through the pool, is at work (on the CPU, or waiting on I/O or a lock)
// rather than waiting for its client or for WAL, which is where a silent
// path leaves it (WalSenderMain, WalSenderWaitForWAL, WalSenderWriteData:
// the Activity and Client classes).
func walsenderBusy(pool *pgxpool.Pool, pid uint32) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		var busy bool
		// A row this role may not see whole (state NULL), or another
		// backend's (a multi-host DSN whose pool went to another node),
		// is no sign of work.
		err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type, '') NOT IN ('Client', 'Activity') FROM pg_stat_get_activity($1)
			WHERE backend_type = 'walsender' AND state IS NOT NULL`, int32(pid)).Scan(&busy)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return busy, err
	}
}
