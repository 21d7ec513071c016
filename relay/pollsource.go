package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/poll"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// rebalanceEvery is how often a poll session looks how many readers share
// the table, and takes or gives up buckets: every second, and at least four
// times per OUTBOX_LEASE_TTL, after which a silent reader is taken for dead.
func (r *Relay) rebalanceEvery() time.Duration { return min(time.Second, r.cfg.LeaseTTL/4) }

// runPoll is Run for OUTBOX_SOURCE=poll: no lease and no slot; every
// instance reads the buckets it owns (see relay/poll), reconnecting after
// transient failures, until ctx is done.
func (r *Relay) runPoll(ctx context.Context, pool *pgxpool.Pool) error {
	backoff := retry.Jittered(500*time.Millisecond, 30*time.Second)
	r.pollRunning.Store(true)
	defer r.pollRunning.Store(false)
	r.log.Info("poll mode: reading unpublished rows from the table (no slot); at-least-once with the idempotent producer",
		"table", r.schema+"."+r.table, "interval", r.cfg.PollInterval, "buckets", r.cfg.PollBuckets)
	for {
		started := time.Now()
		err := r.pollSession(ctx, pool)
		r.polling.Store(false)
		r.metrics.PollBuckets.Set(0)
		r.pollOwned.Store(0)
		r.oldest.clear()
		switch {
		case ctx.Err() != nil:
			if fatal.Is(err) {
				return err
			}
			return nil
		case fatal.Is(err):
			return err
		case err == nil:
			err = errors.New("the poll session ended with no error while the connector runs")
		}
		wait := r.retryAfter(err, started, backoff, "poll session")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// pollSession is one connection to PostgreSQL (holding the buckets' locks)
// and one Kafka client. Each round it reads a batch of its buckets'
// unpublished rows, hands them to the producer, waits until Kafka acked
// them all (or they are durably dead-lettered), and marks them published.
// At a soft stop it finishes the batch in hand: acked and marked.
func (r *Relay) pollSession(ctx context.Context, pool *pgxpool.Pool) error {
	stop := newStopper(ctx, context.Background(), r.cfg.ShutdownTimeout)
	defer stop.release()

	// Both connections carry the session's name: a reader that finds this
	// one silent ends both (see poll.Rebalance).
	app := "outbox-connector-poll-" + strconv.FormatUint(rand.Uint64(), 36)
	conn, err := r.pollConnect(stop.read, app)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	rd, err := poll.Open(stop.read, conn, poll.Config{
		Schema: r.schema, Table: r.table, Key: r.router.Config().FieldEventKey, ID: r.router.Config().FieldEventID,
		Buckets: r.cfg.PollBuckets, Batch: r.cfg.PollBatch, BatchBytes: r.cfg.PollBatchBytes,
		Silence: r.cfg.LeaseTTL,
	})
	if errors.Is(err, poll.ErrNotPrepared) {
		return &fatal.Error{Msg: "OUTBOX_SOURCE=poll", Err: err}
	}
	if err != nil {
		return err
	}
	rd.Queries = func(kind string) { r.metrics.PollQueries.WithLabelValues(kind).Inc() }
	if !rd.BucketIndexed() {
		r.log.Warn("poll mode: no index on the outbox serves reads by bucket for this OUTBOX_POLL_BUCKETS and key column, so every read walks all the unpublished rows of the table, one hot aggregate's backlog included; create it (sql/variants/outbox_poll.sql makes the one for 16 buckets of aggregateid)",
			"statement", rd.BucketIndex())
	}

	var relID uint32
	if err := conn.QueryRow(stop.read, "SELECT $1::regclass::oid", pgx.Identifier{r.schema, r.table}.Sanitize()).Scan(&relID); err != nil {
		return fmt.Errorf("find the outbox table %s.%s: %w", r.schema, r.table, err)
	}
	infos, err := wal.ColumnInfoOf(conn)(stop.read, relID)
	if err != nil {
		return fmt.Errorf("poll mode: %w", err)
	}

	wake := make(chan struct{}, 1)
	var listening errgroup.Group
	if r.cfg.PollChannel != "off" {
		lconn, err := r.pollConnect(stop.read, app)
		if err != nil {
			return fmt.Errorf("connect to LISTEN: %w", err)
		}
		defer func() { _ = lconn.Close(context.WithoutCancel(ctx)) }()
		if _, err := lconn.Exec(stop.read, "LISTEN "+pgx.Identifier{r.cfg.PollChannel}.Sanitize()); err != nil {
			return fmt.Errorf("LISTEN %s: %w", r.cfg.PollChannel, err)
		}
		// Only a hint: a lost notification costs one interval, and the
		// listener failing costs the wake-ups, not the session.
		listening.Go(func() error {
			for {
				if _, err := lconn.WaitForNotification(stop.read); err != nil {
					if stop.read.Err() == nil {
						r.log.Warn("poll mode: LISTEN connection failed; polling every interval only", "err", err)
					}
					return nil
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		})
		defer func() { _ = listening.Wait() }()
		defer stop.cutRead()
	}

	kcl, err := r.newKafkaClient("", false)
	if err != nil {
		return err
	}
	defer kcl.Close()

	tr := tracker.New(0)
	r.cur.Store(tr)
	events := make(chan wal.Event, handOver)
	// No lease: the token is 0, and the buckets' locks fence (Valid nil).
	cfg := r.producerConfig([]kgo.RecordHeader{{Key: TokenHeader, Value: []byte("0")}}, nil)
	prod := publish.New(cfg, kcl, r.router, pool, r.log.With("component", "producer"), r.metrics)
	prodDone := make(chan struct{})
	var producing errgroup.Group
	producing.Go(func() error {
		defer close(prodDone)
		return prod.Run(stop.hard, events, stop.cutRead)
	})

	r.polling.Store(true)
	loopErr := r.pollLoop(stop, rd, tr, events, prodDone, wake, infos)
	producerEnded := false
	select {
	case <-prodDone:
		producerEnded = true // on its own: its error is the cause
	default:
	}
	if loopErr != nil && !(ctx.Err() != nil && errors.Is(loopErr, context.Canceled)) {
		// The session failed: its buckets may be another reader's already.
		// Publish nothing more: what is buffered is dropped with the
		// client (never marked, the next owner reads it again), rather
		// than landing after the next owner's newer records of a key.
		stop.cancelHard()
	}
	stop.cutRead()
	close(events)
	prodErr := producing.Wait()
	tr.Reset()
	switch {
	case producerEnded && prodErr != nil:
		return &kafkaError{prodErr}
	case loopErr != nil && ctx.Err() == nil && !errors.Is(loopErr, poll.ErrProducerStopped):
		return loopErr
	case prodErr != nil && (ctx.Err() == nil || !errors.Is(prodErr, context.Canceled)):
		return &kafkaError{prodErr}
	}
	return loopErr
}

// pollConnect opens one of a poll session's connections, named app, with
// TCP keepalives on both ends: a peer gone without a word (a host down, a
// network cut) ends the session within about half a minute, and with it its
// locks, instead of the kernels' two hours.
func (r *Relay) pollConnect(ctx context.Context, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(r.cfg.PGDSN)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = app
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}
	cfg.DialFunc = d.DialContext
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// The server's end, set after the start rather than as startup
	// parameters, which a pooler refuses: best effort.
	for _, set := range []string{"SET tcp_keepalives_idle = 10", "SET tcp_keepalives_interval = 5", "SET tcp_keepalives_count = 3", "SET tcp_user_timeout = 30000"} {
		if _, err := conn.Exec(ctx, set); err != nil {
			r.log.Debug("poll mode: a server-side TCP keepalive setting was refused", "set", set, "err", err)
		}
	}
	return conn, nil
}

// pollLoop reads, publishes and marks batches until a stop or a failure.
func (r *Relay) pollLoop(stop *stopper, rd *poll.Reader, tr *tracker.Tracker, events chan<- wal.Event, prodDone <-chan struct{}, wake <-chan struct{}, infos map[string]*route.ColumnInfo) error {
	var rebalanced, warned time.Time
	var batch tracker.LSN
	table := r.schema + "." + r.table
	for stop.read.Err() == nil {
		if time.Since(rebalanced) >= r.rebalanceEvery() {
			sh, err := rd.Rebalance(stop.read)
			if err != nil {
				if errors.Is(err, poll.ErrNotSession) {
					return &fatal.Error{Msg: "OUTBOX_SOURCE=poll, OUTBOX_PG_DSN", Err: err}
				}
				return err
			}
			if (sh.EndErr != nil || sh.Silent > len(sh.Ended) || sh.OtherRoles > 0) && time.Since(warned) > time.Minute {
				warned = time.Now()
				r.log.Warn("poll mode: readers of the table run as another role, or a silent reader's session could not be ended: such a reader's silence may go unseen and its buckets wait for it; run every instance as one role",
					"other_roles", sh.OtherRoles, "silent", sh.Silent, "ended", len(sh.Ended), "err", sh.EndErr)
			}
			if len(sh.Ended) > 0 {
				r.log.Warn("poll mode: ended the sessions of a reader that ran nothing for longer than OUTBOX_LEASE_TTL (frozen, or cut off unnoticed by the server); its buckets are free", "pids", sh.Ended, "silence", r.cfg.LeaseTTL)
			}
			rebalanced = time.Now()
			r.pollOwned.Store(int64(len(rd.Owned())))
			r.metrics.PollBuckets.Set(float64(len(rd.Owned())))
			r.oldest.see(sh.OldestSeq, sh.OldestAt, sh.OldestOwned, rebalanced)
			r.pollScanned.Store(sh.Scanned)
		}
		r.lookStall(time.Now())
		began := time.Now()
		rows, err := rd.Read(stop.read)
		// A read that fails is timed too: one that passes the statement
		// bound is the slowest of all.
		r.metrics.PollReadSeconds.Observe(time.Since(began).Seconds())
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			select {
			case <-wake:
			case <-time.After(min(r.cfg.PollInterval, r.rebalanceEvery())):
			case <-stop.read.Done():
			}
			continue
		}
		r.metrics.PollRows.Add(float64(len(rows)))
		batch++
		txn := tr.Begin(batch)
		for _, pr := range rows {
			row := &route.Row{Columns: make([]route.Column, len(pr.Fields)), Source: route.Source{Table: table}}
			for i, f := range pr.Fields {
				c := &row.Columns[i]
				c.Name, c.Type, c.TypeMod, c.HasTypeMod = f.Name, f.DataTypeOID, f.TypeModifier, true
				c.Info = infos[f.Name]
				// The row as it was inserted, as the WAL mode reads it:
				// not yet marked.
				if pr.Values[i] == nil || f.Name == poll.Published {
					c.Null = true
				} else {
					c.Value = pr.Values[i]
				}
			}
			txn.Add()
			// A soft stop lets the batch in hand finish; a producer that
			// stopped, or the hard stop, does not.
			select {
			case events <- wal.Event{Txn: txn, Row: row}:
			case <-prodDone:
				// Never committed in the tracker: nothing of the batch is
				// marked; the next owner reads it again.
				txn.Abandon()
				return poll.ErrProducerStopped
			case <-stop.hard.Done():
				txn.Abandon()
				return stop.hard.Err()
			}
		}
		txn.Commit(batch)
		// Wait for the whole batch, past a soft stop (until the hard one):
		// what Kafka has is then marked, and not published again.
		for tr.Acked() < batch {
			// The buckets' session stays visibly alive while Kafka is slow.
			if err := rd.Touch(stop.hard); err != nil {
				return err
			}
			select {
			case <-tr.Changed():
			case <-time.After(r.rebalanceEvery()):
				r.lookStall(time.Now())
			case <-prodDone:
				if tr.Acked() >= batch {
					break
				}
				return fmt.Errorf("%w before Kafka acknowledged the batch", poll.ErrProducerStopped)
			case <-stop.hard.Done():
				return stop.hard.Err()
			}
		}
		if err := r.pollMark(stop, rd, rows); err != nil {
			return err
		}
		r.lookStall(time.Now())
	}
	return nil
}

// pollMark marks a batch Kafka has. A mark the server refuses for now (a
// read-only transaction: a database full, a switchover) is tried again with
// backoff while the session lives, rather than ending it: the next session
// would publish the batch again, and again. A session gone ends it (its
// locks are gone too); ErrNotMarked and a missing privilege stop the
// connector.
func (r *Relay) pollMark(stop *stopper, rd *poll.Reader, rows []poll.Row) error {
	backoff := retry.New(200*time.Millisecond, min(10*time.Second, r.cfg.LeaseTTL/4))
	for {
		err := rd.Mark(stop.hard, rows)
		switch {
		case err == nil:
			r.oldest.markDone()
			return nil
		case errors.Is(err, poll.ErrNotMarked):
			return &fatal.Error{Msg: "OUTBOX_SOURCE=poll", Err: err}
		case fatal.Is(err) || rd.Closed() || stop.hard.Err() != nil:
			// Counted across sessions: a mark that fails so every time
			// (a deadline behind a lock) publishes the batch again each
			// session, and says so once it lasts.
			r.oldest.markFailing(time.Now())
			return err
		}
		wait := backoff.NextBackOff()
		msg := config.RedactError(err, r.cfg.PGDSN)
		r.lastErr.Store(&msg)
		r.log.Warn("poll mode: marking a batch Kafka has failed; trying again (not publishing it again)", "err", msg, "rows", len(rows), "backoff", wait)
		select {
		case <-stop.hard.Done():
			return stop.hard.Err()
		case <-time.After(wait):
		}
		r.oldest.markFailing(time.Now())
		if err := rd.Touch(stop.hard); err != nil {
			return err
		}
	}
}

// oldestWatch follows the oldest unpublished row of the table, as this
// instance's looks at the shares see it, and this instance's marks. A row
// whose bucket no reader holds for longer than the stall timeout is one
// nobody will deliver (the readers that should have taken it cannot: say,
// a silent reader of another role keeps it); marks refused for as long
// leave this instance's batch, and its buckets, waiting. Either is a stall.
// A row whose bucket is held but waits (on Kafka, the registry) is its
// holder's stall, which its own watch says.
type oldestWatch struct {
	mu          sync.Mutex
	seq         int64
	at          time.Time // when the row was written (created_at; zero: unknown)
	unownedFrom time.Time // since when its bucket has no holder (zero: it has one)
	failingFrom time.Time // since when this instance's marks fail (zero: they do not)
}

func (w *oldestWatch) see(seq int64, at time.Time, owned bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq != w.seq || seq == 0 || owned {
		w.unownedFrom = time.Time{}
	}
	if seq != 0 && !owned && w.unownedFrom.IsZero() {
		w.unownedFrom = now
	}
	w.seq, w.at = seq, at
}

func (w *oldestWatch) markFailing(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failingFrom.IsZero() {
		w.failingFrom = now
	}
}

func (w *oldestWatch) markDone() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failingFrom = time.Time{}
}

func (w *oldestWatch) clear() {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Not failingFrom: marks that keep failing across sessions are one
	// stall (markDone ends it). Nor the row's age: between sessions it is
	// what was last seen, not 0, or a session that fails again and again
	// would keep resetting OutboxPollBacklogOld's for-duration.
	w.unownedFrom = time.Time{}
}

// stuck says whether either lasted longer than timeout, and why.
func (w *oldestWatch) stuck(now time.Time, timeout time.Duration) (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.failingFrom.IsZero() && now.Sub(w.failingFrom) > timeout {
		return true, fmt.Sprintf("this instance's marks of a batch Kafka has have failed for %s (OUTBOX_STALL_TIMEOUT %s): its buckets wait", now.Sub(w.failingFrom).Round(time.Second), timeout)
	}
	if !w.unownedFrom.IsZero() && now.Sub(w.unownedFrom) > timeout {
		return true, fmt.Sprintf("the oldest unpublished row of the outbox (seq %d) has been in a bucket no reader holds for %s (OUTBOX_STALL_TIMEOUT %s)", w.seq, now.Sub(w.unownedFrom).Round(time.Second), timeout)
	}
	return false, ""
}

// age is how long ago the oldest unpublished row was written (0: none, or
// the table does not say).
func (w *oldestWatch) age(now time.Time) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seq == 0 || w.at.IsZero() {
		return 0
	}
	return now.Sub(w.at).Seconds()
}
