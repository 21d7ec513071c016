package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/slotwatch/audit"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// maxLoggedMissing is how many of a round's missing events are logged.
const maxLoggedMissing = 100

// Options configures the end-to-end watch.
type Options struct {
	// Canary is nil when the canary is off.
	Canary *Canary
	// Audit is the continuous audit's template (window and callbacks are
	// filled per round); AuditInterval 0 turns it off.
	Audit         audit.Options
	AuditInterval time.Duration
	AuditWindow   time.Duration
	DB            *pgxpool.Pool
	Kafka         []kgo.Opt
	// Every is how often the pipeline report goes to OnReport.
	Every    time.Duration
	OnReport func(watch.Report)
	Log      *slog.Logger
	Metrics  *Metrics
	// Close releases what Run used (the pool), after Run returned.
	Close func()
}

// Watch runs the canary and the continuous audit and reports their state
// to the alert engine as the report of server "pipeline".
type Watch struct {
	o Options

	mu      sync.Mutex
	audited bool
	last    audit.Result
	// The audit's health, for AuditFailing: when it started, when a
	// round last succeeded, the rounds failed in a row since and the
	// last one's error.
	auditStarted time.Time
	auditOKAt    time.Time
	failures     int
	lastErr      string
	// missing and missingSample are what slotwatch_audit_missing_events
	// and EventsMissing show: the last round's, and after rounds catching
	// up a resumed stretch back to back, what all of them found (each
	// round adds its own to what the last showed while that one was
	// Behind), for one interval after the last of them. Without
	// the carry, an event a catching-up round found would show for the
	// moment until the next one, which starts at once. Held no longer:
	// those windows are judged once, so an event the relay was still
	// publishing from its own backlog is reported missing (as the single
	// resumed round did before), and holding it would prolong that false
	// alert; and the next usual round overlaps the last of them, so adding
	// its figure would count an event twice.
	missing       int64
	missingSample []string
	// The last stretch CatchUp left to no round, and when (AuditSkipped).
	skippedFrom, skippedTo, skippedAt time.Time
}

// New returns the watch; Run starts it.
func New(o Options) *Watch { return &Watch{o: o} }

// Report is the pipeline's report now.
func (w *Watch) Report(now time.Time) watch.Report {
	p := &watch.Pipeline{}
	if c := w.o.Canary; c != nil {
		p.Canary = true
		p.CanaryTimeout = c.o.Timeout
		p.CanaryAge, p.CanaryErr = c.Status(now)
	}
	w.mu.Lock()
	p.Audited = w.audited
	p.Missing = w.missing
	p.Sample = append([]string(nil), w.missingSample...)
	if w.audited {
		p.Window = fmt.Sprintf("%s to %s", w.last.Since.UTC().Format(time.RFC3339), w.last.Until.UTC().Format(time.RFC3339))
	}
	w.auditState(p)
	w.mu.Unlock()
	return watch.Report{Server: watch.PipelineServer, Time: now, Up: true, Collected: true, Pipeline: p}
}

// auditState fills the audit's health into p; w.mu is held.
func (w *Watch) auditState(p *watch.Pipeline) {
	p.AuditInterval = w.o.AuditInterval
	p.AuditStarted, p.AuditOKAt = w.auditStarted, w.auditOKAt
	p.AuditFailures, p.AuditErr = w.failures, w.lastErr
	p.SkippedFrom, p.SkippedTo, p.SkippedAt = w.skippedFrom, w.skippedTo, w.skippedAt
}

// AuditAge is how long no audit round has succeeded at now
// (slotwatch_audit_age_seconds): since the last success, else since the
// audit started; 0 when it is off.
func (w *Watch) AuditAge(now time.Time) time.Duration {
	var p watch.Pipeline
	w.mu.Lock()
	w.auditState(&p)
	w.mu.Unlock()
	return p.AuditAge(now)
}

// Close releases the watch's resources; call it after Run returned.
func (w *Watch) Close() {
	if w.o.Close != nil {
		w.o.Close()
	}
}

// Run runs until ctx ends.
func (w *Watch) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	if w.o.Canary != nil {
		g.Go(func() error { return w.o.Canary.Run(gctx) })
	}
	if w.o.AuditInterval > 0 {
		g.Go(func() error { return w.auditLoop(gctx) })
	}
	g.Go(func() error {
		t := time.NewTicker(w.o.Every)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case now := <-t.C:
				w.o.OnReport(w.Report(now))
			}
		}
	})
	return g.Wait()
}

func (w *Watch) auditLoop(ctx context.Context) error {
	w.mu.Lock()
	w.auditStarted = time.Now()
	w.mu.Unlock()
	w.o.Metrics.auditInterval.Set(w.o.AuditInterval.Seconds())
	// Where the last success ended is held in memory: a process that was
	// down (or crash-looping, AuditFailing) for longer than the window
	// minus the grace starts over from the window, and the stretch before
	// is audited only by hand.
	w.o.Log.Info("audit: the first round covers the last SLOTWATCH_AUDIT_WINDOW; if slotwatch was down for longer, audit the stretch before with slotwatch audit -since the last success (slotwatch_audit_last_success_timestamp_seconds) minus SLOTWATCH_AUDIT_WINDOW",
		"window", w.o.AuditWindow.String())
	cl, err := kgo.NewClient(append(audit.ClientOpts(), w.o.Kafka...)...)
	if err != nil {
		return fmt.Errorf("audit: Kafka client: %w", err)
	}
	defer cl.Close()
	w.rounds(ctx, func(ctx context.Context, o audit.Options) (audit.Result, error) { return audit.Run(ctx, w.o.DB, cl, o) })
	return nil
}

// rounds runs a round with run (audit.Run) every interval until ctx ends.
func (w *Watch) rounds(ctx context.Context, run func(context.Context, audit.Options) (audit.Result, error)) {
	t := time.NewTicker(w.o.AuditInterval)
	defer t.Stop()
	for {
		// A round catching up a resumed stretch one window at a time
		// (audit.Result.Behind) is followed at once by the next: each
		// advances the start by a window, so this ends.
		caughtUp := false
		for w.round(ctx, run) && ctx.Err() == nil {
			caughtUp = true
		}
		if caughtUp {
			// The sum the catching-up rounds found shows for a whole
			// interval: a tick left waiting while they ran would start
			// the next round, which replaces it, at once (Reset drops
			// it, since Go 1.23), before a scrape or a report saw it.
			t.Reset(w.o.AuditInterval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round audits the window that ends now − grace with run (audit.Run). It
// returns true when the round succeeded behind: a resumed stretch is not
// caught up yet.
func (w *Watch) round(ctx context.Context, run func(context.Context, audit.Options) (audit.Result, error)) bool {
	o := w.o.Audit
	// Both ends on the database's clock (audit.Run): Since is Window
	// before its now, Until its now − grace.
	o.Window = w.o.AuditWindow
	// After rounds that failed for longer than the window, the next one
	// starts where the last success ended: no stretch goes unaudited.
	w.mu.Lock()
	if w.audited {
		o.Resume = w.last.Until
	}
	w.mu.Unlock()
	// The missing events stream in as the audit walks the ids; they are
	// a verdict only if the round finishes, so they are kept (the first
	// maxLoggedMissing, the rest counted) and logged after it did.
	var found []audit.Missing
	var sample []string
	o.OnMissing = func(m audit.Missing) {
		if len(sample) < 5 {
			sample = append(sample, m.ID)
		}
		if len(found) < maxLoggedMissing {
			found = append(found, m)
		}
	}
	res, err := run(ctx, o)
	if ctx.Err() != nil {
		return false
	}
	m := w.o.Metrics
	if err != nil {
		m.runs.WithLabelValues("error").Inc()
		w.mu.Lock()
		w.failures++
		w.lastErr = err.Error()
		w.mu.Unlock()
		w.o.Log.Warn("audit: round failed; the last round's figures stay (AuditFailing fires after three intervals without a success)", "err", err)
		return false
	}
	now := time.Now()
	w.mu.Lock()
	var carried int64
	var shownSample []string
	if w.last.Behind { // a failed round in between leaves w.last as it was
		carried, shownSample = w.missing, append(shownSample, w.missingSample...)
	}
	shownSample = append(shownSample, sample...)
	w.missing, w.missingSample = res.Missing+carried, shownSample[:min(len(shownSample), 5)]
	shown := w.missing
	if !res.Skipped.IsZero() {
		w.skippedFrom, w.skippedTo, w.skippedAt = res.Skipped, res.Since, now
	}
	w.audited, w.last = true, res
	w.auditOKAt, w.failures, w.lastErr = now, 0, ""
	w.mu.Unlock()
	m.runs.WithLabelValues("ok").Inc()
	m.audited.Add(float64(res.Audited))
	m.missing.Set(float64(shown))
	m.duplicated.Set(float64(res.Duplicated))
	m.deadLettered.Set(float64(res.DeadLettered))
	m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	m.duration.Set(res.Elapsed.Seconds())
	for _, ev := range found {
		w.o.Log.Warn("audit: event missing from Kafka", "id", ev.ID, "aggregatetype", ev.AggregateType,
			"aggregateid", ev.AggregateID, "created_at", ev.CreatedAt, "topic", ev.Topic)
	}
	if more := res.Missing - int64(len(found)); more > 0 {
		w.o.Log.Warn("audit: more events missing from Kafka than logged; slotwatch audit lists them all", "more", more,
			"since", res.Since.UTC().Format(time.RFC3339Nano), "until", res.Until.UTC().Format(time.RFC3339Nano))
	}
	if !res.Skipped.IsZero() {
		m.skipped.Add(res.Since.Sub(res.Skipped).Seconds())
		// To the nanosecond: an -until cut to the second would leave the
		// stretch's last fraction of a second to no audit.
		from, to := res.Skipped.UTC().Format(time.RFC3339Nano), res.Since.UTC().Format(time.RFC3339Nano)
		w.o.Log.Warn("audit: the last round that succeeded ended more than SLOTWATCH_AUDIT_CATCH_UP ago; this round starts at the bound, and the events created between the two were audited by no round: audit them with slotwatch audit, before Kafka's retention drops their records (then they would all look missing)",
			"skipped_since", from, "skipped_until", to, "command", fmt.Sprintf("slotwatch audit -since %s -until %s", from, to))
	}
	if res.Unreadable > 0 {
		w.o.Log.Warn("audit: records with an id the audit cannot read on the routed topics (a null, or a converter slotwatch does not know: the audit reads the string, json and json-schema converters' ids; OUTBOX_ROUTE_HEADER_FORMAT)", "records", res.Unreadable,
			"topics", strings.Join(res.Topics, ","))
	}
	if res.Foreign > 0 {
		w.o.Log.Warn("audit: records without an id header on the routed topics: another producer writes to them (they are not counted as deliveries)", "records", res.Foreign,
			"topics", strings.Join(res.Topics, ","))
	}
	if res.Behind {
		w.o.Log.Info("audit: catching up where the last round that succeeded ended, one SLOTWATCH_AUDIT_WINDOW a round; the next round starts at once",
			"since", res.Since.UTC().Format(time.RFC3339Nano), "until", res.Until.UTC().Format(time.RFC3339Nano), "missing", res.Missing)
	}
	w.o.Log.Debug("audit: round done", "summary", res.Summary())
	return res.Behind
}
