// Package watch runs slotwatch's collection loop: one goroutine per server
// queries it every interval, derives each slot's lag, retention, inactivity
// and time to invalidation, keeps the latest Report for the metrics, the
// alerts and the HTTP pages, and survives the database going away.
package watch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
	"github.com/pgoutbox/pgoutbox/slotwatch/history"
)

// Options tune a Watcher.
type Options struct {
	// Interval between collections (default 10s).
	Interval time.Duration
	// Timeout bounds one collection, connecting included (default 5s).
	Timeout time.Duration
	// RateWindow is the WAL rate's window (default 5m).
	RateWindow time.Duration
	// History is how far back the LSN-to-time history reaches (default 24h).
	History time.Duration
	// SparkPoints is how many recent lag samples each slot keeps for its
	// sparkline (default 90).
	SparkPoints int
	// Log receives state changes (default slog.Default()).
	Log *slog.Logger
	// OnReport, when set, receives every new report, from the server's own
	// goroutine; reports of different servers may arrive concurrently.
	OnReport func(Report)
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = config.DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = config.DefaultTimeout
	}
	if o.RateWindow <= 0 {
		o.RateWindow = config.DefaultRateWindow
	}
	if o.History <= 0 {
		o.History = config.DefaultHistory
	}
	if o.SparkPoints <= 0 {
		o.SparkPoints = 90
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// Watcher watches every configured server.
type Watcher struct {
	opts    Options
	servers []*server

	mu     sync.RWMutex
	latest []Report // by server index; Collected false until the first collection
}

// server is one target's loop state, owned by its goroutine.
type server struct {
	target config.Target
	col    *collect.Collector
	hist   *history.WAL
	log    *slog.Logger

	// inactiveSince tracks, for servers before 17 (no inactive_since
	// column), when slotwatch first saw each slot inactive.
	inactiveSince map[string]time.Time
	spark         map[string]*ring
	downSince     time.Time
	wasUp         bool
}

// New prepares a watcher; nothing connects until Run.
func New(targets []config.Target, opts Options) (*Watcher, error) {
	opts.defaults()
	w := &Watcher{opts: opts}
	for _, t := range targets {
		log := opts.Log.With("server", t.Name)
		col, err := collect.New(t.DSN(), log)
		if err != nil {
			return nil, fmt.Errorf("server %s: %w", t.Name, t.Redact(err))
		}
		w.servers = append(w.servers, &server{
			target:        t,
			col:           col,
			hist:          history.New(opts.History, 0),
			log:           log,
			inactiveSince: map[string]time.Time{},
			spark:         map[string]*ring{},
			wasUp:         true, // so that a first failure is logged
		})
		w.latest = append(w.latest, Report{Server: t.Name, Database: t.Database})
	}
	return w, nil
}

// Run collects from every server every interval until ctx is done, and
// returns after all its goroutines have.
func (w *Watcher) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for i := range w.servers {
		g.Go(func() error {
			w.loop(ctx, i)
			return nil
		})
	}
	return g.Wait()
}

// Reports returns the latest report of every server that has been
// collected at least once, in configuration order.
func (w *Watcher) Reports() []Report {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]Report, 0, len(w.latest))
	for _, r := range w.latest {
		if r.Collected {
			out = append(out, r)
		}
	}
	return out
}

func (w *Watcher) loop(ctx context.Context, i int) {
	s := w.servers[i]
	defer s.col.Close(context.Background())
	tick := time.NewTicker(w.opts.Interval)
	defer tick.Stop()
	for {
		w.collectOnce(ctx, i)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (w *Watcher) collectOnce(ctx context.Context, i int) {
	s := w.servers[i]
	cctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	snap, err := s.col.Collect(cctx)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not the database's failure
	}
	var rep Report
	if err != nil {
		rep = s.down(time.Now(), err)
	} else {
		rep = s.up(snap, w.opts)
	}
	w.mu.Lock()
	// A primary's failover readiness reads its standbys' latest reports.
	rep.Failover = failoverReadiness(&rep, w.latest)
	w.latest[i] = rep
	w.mu.Unlock()
	if w.opts.OnReport != nil {
		w.opts.OnReport(rep)
	}
}

func (s *server) down(now time.Time, err error) Report {
	msg := s.target.RedactError(err)
	if s.wasUp {
		s.log.Warn("database unreachable; retrying every interval", "err", msg)
		s.downSince = now
		s.wasUp = false
	} else {
		s.log.Debug("database still unreachable", "err", msg)
	}
	return Report{
		Server:    s.target.Name,
		Database:  s.target.Database,
		Time:      now,
		Collected: true,
		Up:        false,
		Err:       msg,
		DownSince: s.downSince,
	}
}

func (s *server) up(snap *collect.Snapshot, opts Options) Report {
	if !s.wasUp {
		s.log.Info("database reachable again", "down_for", time.Since(s.downSince).Round(time.Millisecond).String(), "server_version", snap.Version)
		s.wasUp = true
	}
	s.downSince = time.Time{}
	now := snap.Time
	s.hist.Add(now, uint64(snap.WALPosition))
	rate, rateOK := s.hist.Rate(opts.RateWindow)

	rep := Report{
		Server:         s.target.Name,
		Database:       s.target.Database,
		Time:           now,
		Collected:      true,
		Up:             true,
		ScrapeDuration: snap.Duration,
		VersionNum:     snap.VersionNum,
		Version:        snap.Version,
		InRecovery:     snap.InRecovery,
		SystemID:       snap.SystemID,
		WALPosition:    snap.WALPosition,
		Settings:       snap.Settings,
		WALDir:         snap.WALDir,
		WALRate:        rate,
		WALRateOK:      rateOK,
	}
	senders := make(map[int64]*collect.Sender, len(snap.Senders))
	for i := range snap.Senders {
		senders[snap.Senders[i].PID] = &snap.Senders[i]
	}
	seen := make(map[string]bool, len(snap.Slots))
	for _, sl := range snap.Slots {
		seen[sl.Name] = true
		r := derive(sl, snap.WALPosition, rate, rateOK)

		confirmed := sl.ConfirmedFlushLSN
		if sl.Type == "physical" {
			confirmed = sl.RestartLSN
		}
		if confirmed != 0 {
			r.LagSeconds, r.LagSecondsLowerBound, r.LagSecondsOK = s.hist.Lag(now, uint64(confirmed))
		}

		switch {
		case sl.Active:
			delete(s.inactiveSince, sl.Name)
		case sl.InactiveSeconds != nil: // 17+: the server knows
			r.InactiveSeconds = max(0, *sl.InactiveSeconds)
		default:
			first, ok := s.inactiveSince[sl.Name]
			if !ok {
				first = now
				s.inactiveSince[sl.Name] = now
			}
			r.InactiveSeconds = now.Sub(first).Seconds()
			r.InactiveTracked = true
		}

		if sl.ActivePID != 0 {
			if snd, ok := senders[sl.ActivePID]; ok {
				r.Sender = snd
				if snd.SentLSN != 0 {
					r.SentLagBytes = max(0, collect.Diff(snap.WALPosition, snd.SentLSN))
				}
			}
		}
		if st, ok := snap.SlotStats[sl.Name]; ok {
			r.Stats = &st
		}

		sp := s.spark[sl.Name]
		if sp == nil {
			sp = newRing(opts.SparkPoints)
			s.spark[sl.Name] = sp
		}
		if r.LagBytesOK {
			sp.add(Point{Time: now, Value: float64(r.LagBytes)})
		}
		r.Spark = sp.points()
		rep.Slots = append(rep.Slots, r)
	}
	for name := range s.spark {
		if !seen[name] {
			delete(s.spark, name)
		}
	}
	for name := range s.inactiveSince {
		if !seen[name] {
			delete(s.inactiveSince, name)
		}
	}
	return rep
}

// ring holds the last n points.
type ring struct {
	buf  []Point
	next int
	full bool
}

func newRing(n int) *ring { return &ring{buf: make([]Point, n)} }

func (r *ring) add(p Point) {
	r.buf[r.next] = p
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *ring) points() []Point {
	if !r.full {
		return append([]Point(nil), r.buf[:r.next]...)
	}
	out := make([]Point, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
