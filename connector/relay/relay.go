// Package relay runs the connector: it prepares the slot (creating it with
// an initial snapshot, or adopting it after checking it against the state
// row), streams it into the producer, persists what it confirms, and
// reconnects with capped backoff after transient failures.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/pgoutbox/pgoutbox/connector/config"
	"github.com/pgoutbox/pgoutbox/connector/metrics"
	"github.com/pgoutbox/pgoutbox/connector/publish"
	"github.com/pgoutbox/pgoutbox/connector/tracker"
	"github.com/pgoutbox/pgoutbox/connector/wal"
	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

// Relay is the connector.
type Relay struct {
	cfg     config.Config
	log     *slog.Logger
	metrics *metrics.Metrics
	router  *route.Router

	schema, table string

	// Visible state for metrics and health.
	streaming atomic.Bool
	cur       atomic.Pointer[tracker.Tracker]
	confirmed atomic.Uint64
	lastAck   atomic.Int64 // unix nanos of the last acked progress
	lastErr   atomic.Pointer[string]
	published atomic.Int64

	// headers returns the per-record headers (the lease token).
	headers func() []kgo.RecordHeader
}

// New returns a relay for cfg.
func New(cfg config.Config, router *route.Router, log *slog.Logger, m *metrics.Metrics) *Relay {
	schema, table, _ := config.SplitTable(cfg.Table)
	r := &Relay{cfg: cfg, log: log, metrics: m, router: router, schema: schema, table: table}
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
	return r
}

// SetHeaders sets a function whose headers are added to every record.
func (r *Relay) SetHeaders(f func() []kgo.RecordHeader) { r.headers = f }

// Streaming reports whether a session is streaming the slot.
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// Stalled reports events in flight with no acknowledgement for longer than
// the stall timeout.
func (r *Relay) Stalled() (bool, string) {
	t := r.cur.Load()
	if t == nil {
		return false, ""
	}
	p := t.Positions()
	if p.InFlight == 0 {
		return false, ""
	}
	last := time.Unix(0, r.lastAck.Load())
	if d := time.Since(last); d > r.cfg.StallTimeout {
		return true, fmt.Sprintf("%d events in flight and nothing acknowledged for %s", p.InFlight, d.Round(time.Second))
	}
	return false, ""
}

// LastError is the last transient error (for /readyz detail).
func (r *Relay) LastError() string {
	if s := r.lastErr.Load(); s != nil {
		return *s
	}
	return ""
}

// Run streams until ctx is done (then stops gracefully: stop reading, flush
// Kafka, confirm the last acked LSN) or a fatal error.
func (r *Relay) Run(ctx context.Context) error {
	kcl, err := r.newKafkaClient()
	if err != nil {
		return err
	}
	defer kcl.Close()
	pool, err := pgxpool.New(ctx, r.cfg.PGDSN)
	if err != nil {
		return &wal.FatalError{Msg: "OUTBOX_PG_DSN: " + config.RedactError(err, r.cfg.PGDSN)}
	}
	defer pool.Close()

	backoff := 500 * time.Millisecond
	for {
		started := time.Now()
		err := r.session(ctx, kcl, pool)
		r.streaming.Store(false)
		if ctx.Err() != nil {
			return err
		}
		if err == nil {
			continue
		}
		if wal.IsFatal(err) {
			return err
		}
		msg := config.RedactError(err, r.cfg.PGDSN)
		r.lastErr.Store(&msg)
		if time.Since(started) > time.Minute {
			backoff = 500 * time.Millisecond
		}
		r.metrics.Reconnects.WithLabelValues(target(err)).Inc()
		r.log.Warn("stream interrupted; reconnecting", "err", msg, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func target(err error) string {
	if strings.Contains(err.Error(), "Kafka") || strings.Contains(err.Error(), "kafka") {
		return "kafka"
	}
	return "postgres"
}

func (r *Relay) newKafkaClient() (*kgo.Client, error) {
	opts := r.cfg.Kafka.Opts(r.log)
	opts = append(opts, publish.ClientOpts(r.cfg.MaxInFlight, r.cfg.MaxMessageBytes, r.cfg.Compression, r.cfg.Linger)...)
	opts = append(opts, kgo.WithHooks(kprom.NewMetrics("outbox_connector_kafka", kprom.Registerer(r.metrics.Registry))))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &wal.FatalError{Msg: "Kafka client settings (OUTBOX_KAFKA_*)", Err: err}
	}
	return cl, nil
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

// session is one connection to PostgreSQL: prepare the slot, snapshot if
// needed, stream. It returns nil on a graceful stop.
func (r *Relay) session(ctx context.Context, kcl *kgo.Client, pool *pgxpool.Pool) error {
	conn, err := pgx.Connect(ctx, r.cfg.PGDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rcfg, err := pgconn.ParseConfig(r.cfg.PGDSN)
	if err != nil {
		return &wal.FatalError{Msg: "OUTBOX_PG_DSN: " + config.RedactError(err, r.cfg.PGDSN)}
	}
	rcfg.RuntimeParams["replication"] = "database"
	rconn, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return fmt.Errorf("open replication connection: %w", err)
	}
	defer rconn.Close(context.WithoutCancel(ctx))

	var versionNum int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&versionNum); err != nil {
		return fmt.Errorf("read server version: %w", err)
	}
	created, err := wal.EnsurePublication(ctx, conn, r.cfg.Publication, r.schema, r.table)
	if err != nil {
		return err
	}
	if created {
		r.log.Info("created publication", "publication", r.cfg.Publication, "table", r.schema+"."+r.table)
	}
	if err := wal.EnsureStateTable(ctx, conn); err != nil {
		return err
	}
	sys, err := pglogrepl.IdentifySystem(ctx, rconn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	db := conn.Config().Database

	tr := tracker.New(0)
	events := make(chan wal.Event, 256)
	prod := publish.New(r.producerConfig(), kcl, r.router, pool, r.log.With("component", "producer"), r.metrics)

	start, st, snapshot, err := r.prepareSlot(ctx, conn, rconn, sys.SystemID, db)
	if err != nil {
		return err
	}
	tr = tracker.New(start)
	r.cur.Store(tr)
	r.lastAck.Store(time.Now().UnixNano())

	streamCtx, cancelStream := context.WithCancel(ctx)
	defer cancelStream()
	hardCtx, cancelHard := hardContext(ctx, r.cfg.ShutdownTimeout)
	defer cancelHard()

	var prodErr error
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		prodErr = prod.Run(hardCtx, events, cancelStream)
	}()

	sw := &stateWriter{conn: conn, st: st, tracker: tr, log: r.log, onAck: func(lsn uint64) {
		r.confirmed.Store(lsn)
		r.lastAck.Store(time.Now().UnixNano())
	}}
	sw.durable.Store(st.Confirmed)
	r.confirmed.Store(min(st.Confirmed, start))

	var streamErr error
	if snapshot != nil {
		streamErr = r.publishSnapshot(streamCtx, snapshot, tr, events, start)
		if streamErr == nil {
			// Recorded only once every snapshot row is acked: a crash before
			// this point takes the snapshot again at the next start.
			st.SnapshotDone = true
			sw.st.SnapshotDone = true
			streamErr = wal.SaveState(streamCtx, conn, st)
		}
		snapshot.close(ctx)
	}
	var swErr error
	swDone := make(chan struct{})
	if streamErr == nil {
		go func() {
			defer close(swDone)
			swErr = sw.run(streamCtx, r.cfg.StatusInterval)
			if swErr != nil && streamCtx.Err() == nil {
				cancelStream()
			}
		}()
		s := &wal.Stream{
			Conn: rconn, Slot: r.cfg.Slot, Publication: r.cfg.Publication, Schema: r.schema, Table: r.table,
			Messages: versionNum >= 140000, Tracker: tr, Out: events, StatusInterval: r.cfg.StatusInterval,
			StopGrace:   r.cfg.ShutdownTimeout / 2,
			Log:         r.log.With("component", "stream", "slot", r.cfg.Slot),
			Confirmable: func() uint64 { return min(tr.Acked(), sw.durable.Load()) },
			Counters: wal.Counters{
				Ignored: func(kind string) { r.metrics.Ignored.WithLabelValues(kind).Inc() },
				Refused: r.metrics.Refused.Inc,
				Status:  r.metrics.StatusUpdates.Inc,
			},
		}
		r.streaming.Store(true)
		r.log.Info("streaming", "slot", r.cfg.Slot, "publication", r.cfg.Publication, "lsn", wal.FormatLSN(start))
		streamErr = s.Run(streamCtx, start)
		r.streaming.Store(false)
		if streamErr == nil && ctx.Err() != nil {
			// Graceful stop: stop reading (done), wait for Kafka, record and
			// confirm the last acked position, end the stream cleanly. The
			// state writer stops first so that Finish owns the last write.
			cancelStream()
			<-swDone
			streamErr = s.Finish(hardCtx, func(fctx context.Context) uint64 {
				if err := sw.write(fctx, max(tr.Acked(), s.SentFlush()), true); err != nil {
					r.log.Warn("final state write failed", "err", err)
				}
				return sw.durable.Load()
			})
			if streamErr == nil {
				r.log.Info("stopped; final position confirmed", "slot", r.cfg.Slot, "lsn", wal.FormatLSN(s.SentFlush()))
			}
		}
	} else {
		close(swDone)
	}
	cancelStream()
	close(events)
	<-prodDone
	<-swDone
	tr.Reset()
	if prodErr != nil && !errors.Is(prodErr, context.Canceled) {
		return prodErr
	}
	if streamErr != nil {
		return streamErr
	}
	if swErr != nil && ctx.Err() == nil {
		return swErr
	}
	return nil
}

func (r *Relay) producerConfig() publish.Config {
	cfgs, _ := config.ParseTopicConfigs(r.cfg.TopicConfigs)
	return publish.Config{
		DLQTopic: r.cfg.DLQTopic, MaxMessageBytes: r.cfg.MaxMessageBytes, TopicCreate: r.cfg.TopicCreate,
		TopicPartitions: int32(r.cfg.TopicPartitions), TopicReplication: int16(r.cfg.TopicReplicationFactor),
		TopicConfigs: cfgs, Headers: r.headers, Published: &r.published,
	}
}

// Published is how many records Kafka acknowledged since the start.
func (r *Relay) Published() int64 { return r.published.Load() }

// promiseHeadroom is how far past the acked position a state write lets
// the connector confirm. WAL with no outbox events still needs confirming
// (rule 5), but our own state write, and the running-xacts and checkpoint
// records the server logs after any activity, are WAL too: if each of them
// called for another write, an idle database would never go quiet. With the
// headroom, those few records (at most one full-page image of the state row
// and a few small records) are confirmed without a write, and a database with
// no other activity sees nothing more from the connector. The price: a slot
// advanced by someone else by less than this past the last position the
// connector examined is not detected at start. A graceful stop records the
// exact position, so the headroom does not outlive the process.
const promiseHeadroom = 16 << 10

// stateWriter persists the position the connector may confirm before it is
// confirmed (the promise), so that a slot moved behind its back is detected
// at the next start.
type stateWriter struct {
	mu      sync.Mutex
	conn    *pgx.Conn
	st      wal.State
	tracker *tracker.Tracker
	log     *slog.Logger
	onAck   func(uint64)
	durable atomic.Uint64 // the recorded promise
}

// run writes at most once per interval: each write is a commit, and the
// confirmation it allows only goes out once per status interval anyway.
func (w *stateWriter) run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// The write itself is not cancelled with ctx: pgx closes a
		// connection whose query is cancelled, and the final write at a
		// graceful stop needs this connection.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := w.write(wctx, w.tracker.Acked(), false)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// write records a promise covering target when the current one does not.
// final records exactly target (a graceful stop: target is at least every
// position sent, so the promise may shrink to it).
func (w *stateWriter) write(ctx context.Context, target uint64, final bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.st
	if final {
		st.Confirmed = target
		if err := wal.SetStateExact(ctx, w.conn, st); err != nil {
			return err
		}
		w.durable.Store(target)
		w.onAck(target)
		return nil
	}
	if target <= w.durable.Load() {
		w.onAck(target)
		return nil
	}
	st.Confirmed = target + promiseHeadroom
	if err := wal.SaveState(ctx, w.conn, st); err != nil {
		return err
	}
	w.durable.Store(st.Confirmed)
	w.onAck(target)
	return nil
}

// prepareSlot creates or adopts the slot and checks it against the state
// row. It returns the position to stream from, the state, and an open
// snapshot to publish first when one is due.
func (r *Relay) prepareSlot(ctx context.Context, conn *pgx.Conn, rconn *pgconn.PgConn, systemID, db string) (uint64, wal.State, *snapshot, error) {
	slot := r.cfg.Slot
	info, exists, err := wal.GetSlot(ctx, conn, slot)
	if err != nil {
		return 0, wal.State{}, nil, err
	}
	st, hasState, err := wal.LoadState(ctx, conn, slot)
	if err != nil {
		return 0, st, nil, err
	}
	if !exists {
		if hasState && st.SystemID == systemID && !r.cfg.AcceptSlotReset {
			return 0, st, nil, wal.Fatalf("replication slot %q is gone, but the connector streamed it before (confirmed %s): it was dropped behind the connector's back, so events written since may never be published. "+
				"Check the outbox table for events after that position, then start once with OUTBOX_ACCEPT_SLOT_RESET=true to create a new slot", slot, wal.FormatLSN(st.Confirmed))
		}
		initial := r.cfg.Snapshot == "initial"
		consistent, snapName, err := wal.CreateSlot(ctx, rconn, slot, initial)
		if err != nil {
			return 0, st, nil, err
		}
		r.log.Info("created replication slot", "slot", slot, "plugin", "pgoutput", "lsn", wal.FormatLSN(consistent), "snapshot", r.cfg.Snapshot)
		st = wal.State{Slot: slot, SystemID: systemID, Confirmed: consistent, SnapshotDone: !initial}
		var snap *snapshot
		if initial {
			// Import the exported snapshot before anything else runs on the
			// replication connection: the next command there ends it.
			snap, err = r.openSnapshot(ctx, snapName)
			if err != nil {
				return 0, st, nil, err
			}
		}
		if err := wal.ResetState(ctx, conn, st); err != nil {
			if snap != nil {
				snap.close(ctx)
			}
			return 0, st, nil, err
		}
		return consistent, st, snap, nil
	}
	if err := wal.CheckSlot(info, db); err != nil {
		return 0, st, nil, err
	}
	if !hasState {
		st = wal.State{Slot: slot, SystemID: systemID, Confirmed: info.ConfirmedFlush, SnapshotDone: true}
		if err := wal.SaveState(ctx, conn, st); err != nil {
			return 0, st, nil, err
		}
		r.log.Info("adopted existing replication slot as it is (no snapshot)", "slot", slot, "lsn", wal.FormatLSN(info.ConfirmedFlush))
		return info.ConfirmedFlush, st, nil, nil
	}
	if err := wal.CheckSlotAgainstState(info, st, systemID); err != nil {
		if !r.cfg.AcceptSlotReset {
			return 0, st, nil, err
		}
		r.log.Warn("OUTBOX_ACCEPT_SLOT_RESET=true: continuing from the slot's position although events may have been skipped", "slot", slot, "err", err)
		st.SystemID = systemID
		st.Confirmed = info.ConfirmedFlush
		if err := wal.ResetState(ctx, conn, st); err != nil {
			return 0, st, nil, err
		}
	}
	if !st.SnapshotDone {
		// A crash during the initial snapshot: its exported snapshot is
		// gone, so re-read the table as it is now. Rows inserted since are
		// also streamed (duplicates, never losses).
		r.log.Warn("the initial snapshot did not complete before the last stop; taking it again from the table as it is now", "slot", slot)
		snap, err := r.openSnapshot(ctx, "")
		if err != nil {
			return 0, st, nil, err
		}
		return info.ConfirmedFlush, st, snap, nil
	}
	return info.ConfirmedFlush, st, nil, nil
}
