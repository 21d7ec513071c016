package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/slotwatch/audit"
)

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func (l *logBuffer) reset() {
	l.mu.Lock()
	l.b.Reset()
	l.mu.Unlock()
}

func testWatch(t testing.TB) (*Watch, *logBuffer) {
	t.Helper()
	var lb logBuffer
	return New(Options{
		AuditInterval: time.Minute, AuditWindow: 15 * time.Minute,
		Log: slog.New(slog.NewTextHandler(&lb, nil)), Metrics: NewMetrics(nil, func() float64 { return 0 }, func() float64 { return 0 }),
	}), &lb
}

// auditFinding reports n missing events, then ends with err.
func auditFinding(n int, err error) func(context.Context, audit.Options) (audit.Result, error) {
	return func(_ context.Context, o audit.Options) (audit.Result, error) {
		for i := 0; i < n; i++ {
			o.OnMissing(audit.Missing{ID: fmt.Sprintf("id-%03d", i), AggregateType: "Order", Topic: "outbox.event.Order"})
		}
		if err != nil {
			return audit.Result{}, err
		}
		return audit.Result{Since: o.Since, Until: o.Until, Audited: int64(n) + 10, Missing: int64(n)}, nil
	}
}

// TestAuditRoundLogsMissingOnceFinished: a round's missing events are
// logged once the round has finished; a round that fails logs none (what
// it streamed before failing is no verdict), and a long list is cut.
func TestAuditRoundLogsMissingOnceFinished(t *testing.T) {
	w, lb := testWatch(t)
	ctx := context.Background()

	w.round(ctx, auditFinding(3, errors.New("permission denied for table outbox")))
	if n := lb.count("event missing from Kafka"); n != 0 {
		t.Errorf("a failed round logged %d missing events; want none", n)
	}
	if lb.count("round failed") != 1 {
		t.Errorf("a failed round is not logged as one")
	}
	if p := w.Report(time.Now()).Pipeline; p.Audited || p.Missing != 0 || len(p.Sample) != 0 {
		t.Errorf("after a failed round the report says audited %v, %d missing, sample %v; want nothing", p.Audited, p.Missing, p.Sample)
	}

	lb.reset()
	w.round(ctx, auditFinding(150, nil))
	if n := lb.count("event missing from Kafka"); n != maxLoggedMissing {
		t.Errorf("a round with 150 missing logged %d of them; want the first %d", n, maxLoggedMissing)
	}
	if lb.count("more=50") != 1 {
		t.Errorf("the 50 not logged are not counted (more=50)")
	}
	p := w.Report(time.Now()).Pipeline
	if !p.Audited || p.Missing != 150 || strings.Join(p.Sample, ",") != "id-000,id-001,id-002,id-003,id-004" {
		t.Errorf("report: audited %v, %d missing, sample %v; want 150 and the first 5 ids", p.Audited, p.Missing, p.Sample)
	}
}

// TestAuditHealth: the report carries what AuditFailing needs: failures in
// a row with the last error, and the time of the last success.
func TestAuditHealth(t *testing.T) {
	w, _ := testWatch(t)
	ctx := context.Background()
	start := time.Now().Add(-10 * time.Minute)
	w.auditStarted = start
	if got := w.AuditAge(start.Add(4 * time.Minute)); got != 4*time.Minute {
		t.Errorf("age before any round = %s; want 4m from the start", got)
	}
	w.round(ctx, auditFinding(0, errors.New("dial tcp: connection refused")))
	w.round(ctx, auditFinding(0, errors.New("permission denied for table outbox")))
	p := w.Report(time.Now()).Pipeline
	if p.AuditInterval != time.Minute || !p.AuditStarted.Equal(start) || !p.AuditOKAt.IsZero() ||
		p.AuditFailures != 2 || p.AuditErr != "permission denied for table outbox" {
		t.Errorf("after two failed rounds: %+v", p)
	}
	w.round(ctx, auditFinding(0, nil))
	now := time.Now()
	p = w.Report(now).Pipeline
	if p.AuditOKAt.IsZero() || p.AuditFailures != 0 || p.AuditErr != "" {
		t.Errorf("after a round succeeded: %+v", p)
	}
	if age := w.AuditAge(now); age < 0 || age > time.Second {
		t.Errorf("age just after a success = %s", age)
	}
	if got := value(t, w.o.Metrics.runs.WithLabelValues("error")); got != 2 {
		t.Errorf("slotwatch_audit_runs_total{result=\"error\"} = %v; want 2", got)
	}
	off := New(Options{Metrics: w.o.Metrics})
	if got := off.AuditAge(time.Now()); got != 0 {
		t.Errorf("age with the audit off = %s; want 0", got)
	}
}

// TestAuditRoundResumes: a round after failed ones starts where the last
// success ended (audit.Options.Resume), so rounds that failed for longer
// than the window leave no stretch unaudited; before any success there is
// nothing to resume.
func TestAuditRoundResumes(t *testing.T) {
	w, _ := testWatch(t)
	ctx := context.Background()
	var seen []time.Time
	until := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	run := func(err error) func(context.Context, audit.Options) (audit.Result, error) {
		return func(_ context.Context, o audit.Options) (audit.Result, error) {
			seen = append(seen, o.Resume)
			if o.Window != 15*time.Minute || !o.Since.IsZero() {
				t.Errorf("round options: window %s, since %s; want the window from the database's clock", o.Window, o.Since)
			}
			if err != nil {
				return audit.Result{}, err
			}
			until = until.Add(time.Minute)
			return audit.Result{Since: until.Add(-15 * time.Minute), Until: until}, nil
		}
	}
	w.round(ctx, run(errors.New("down")))
	w.round(ctx, run(nil))
	w.round(ctx, run(errors.New("down")))
	w.round(ctx, run(errors.New("down")))
	w.round(ctx, run(nil))
	w.round(ctx, run(nil))
	t0 := time.Date(2026, 12, 5, 9, 1, 0, 0, time.UTC)
	want := []time.Time{{}, {}, t0, t0, t0, t0.Add(time.Minute)}
	if !slices.EqualFunc(seen, want, time.Time.Equal) {
		t.Errorf("Resume per round %v; want %v", seen, want)
	}
}

// TestAuditRoundLogsSkipped: a round whose start SLOTWATCH_AUDIT_CATCH_UP
// bounded (audit.Result.Skipped) logs the stretch no round audited, with
// the command that audits it; the bound reaches the round's options.
func TestAuditRoundLogsSkipped(t *testing.T) {
	w, lb := testWatch(t)
	w.o.Audit.CatchUp = 6 * time.Hour
	since := time.Date(2026, 12, 5, 9, 0, 0, 500_000_000, time.UTC)
	skipped := since.Add(-30 * time.Hour)
	w.round(context.Background(), func(_ context.Context, o audit.Options) (audit.Result, error) {
		if o.CatchUp != 6*time.Hour {
			t.Errorf("round's CatchUp %s; want 6h", o.CatchUp)
		}
		return audit.Result{Since: since, Until: since.Add(6 * time.Hour), Skipped: skipped}, nil
	})
	if lb.count("command=\"slotwatch audit -since 2026-12-04T03:00:00.5Z -until 2026-12-05T09:00:00.5Z\"") != 1 {
		t.Errorf("the skipped stretch is not logged with its command:\n%s", lb.b.String())
	}
	lb.reset()
	w.round(context.Background(), func(_ context.Context, o audit.Options) (audit.Result, error) {
		return audit.Result{Since: since, Until: since.Add(time.Hour)}, nil
	})
	if lb.count("SLOTWATCH_AUDIT_CATCH_UP") != 0 {
		t.Errorf("a round that skipped nothing logged a skip:\n%s", lb.b.String())
	}
}

// TestAuditCatchesUpBackToBack: after rounds failed for longer than the
// window, the resumed stretch is caught up one window a round
// (audit.Result.Behind), the rounds back to back without waiting for the
// interval; what the catching-up rounds found missing is summed in
// slotwatch_audit_missing_events and the report (EventsMissing) until the
// interval's round after them, not replaced by the next one at once.
func TestAuditCatchesUpBackToBack(t *testing.T) {
	w, lb := testWatch(t)
	// The catching-up rounds take longer than the interval together, so a
	// tick waits when they end: the sum they found must still show for an
	// interval, not be replaced by a round that tick starts at once
	// (review: it showed for a round's length only).
	const interval = 300 * time.Millisecond
	w.o.AuditInterval = interval
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var resumes []time.Time
	var lastEnd, nextStart time.Time
	shownBeforeNext := int64(-1)
	rounds := 0
	run := func(_ context.Context, o audit.Options) (audit.Result, error) {
		if rounds >= 2 && rounds <= 4 {
			time.Sleep(interval / 2) // a catching-up round's Kafka read
		}
		if rounds == 5 { // the round after catching up
			shownBeforeNext = w.Report(time.Now()).Pipeline.Missing
		}
		mu.Lock()
		defer mu.Unlock()
		rounds++
		resumes = append(resumes, o.Resume)
		if rounds == 6 {
			nextStart = time.Now()
			cancel()
			return audit.Result{}, ctx.Err()
		}
		if rounds == 5 {
			defer func() { lastEnd = time.Now() }()
		}
		switch {
		case rounds == 1: // the last success before an outage
			return audit.Result{Since: t0.Add(-15 * time.Minute), Until: t0}, nil
		case rounds <= 4: // three windows behind; the second finds 2 missing
			miss := 0
			if rounds == 3 {
				miss = 2
				o.OnMissing(audit.Missing{ID: "lost-1"})
				o.OnMissing(audit.Missing{ID: "lost-2"})
			}
			return audit.Result{Since: o.Resume, Until: o.Resume.Add(15 * time.Minute), Missing: int64(miss), Behind: true}, nil
		}
		// Caught up: then the loop waits for the interval.
		return audit.Result{Since: o.Resume, Until: o.Resume.Add(5 * time.Minute)}, nil
	}
	w.round(ctx, run) // the success before the outage
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.rounds(ctx, run)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("the rounds did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	caughtUp := t0.Add(50 * time.Minute)
	want := []time.Time{{}, t0, t0.Add(15 * time.Minute), t0.Add(30 * time.Minute), t0.Add(45 * time.Minute), caughtUp}
	if !slices.EqualFunc(resumes, want, time.Time.Equal) || rounds != 6 {
		t.Errorf("%d rounds resumed at %v; want 6 at %v (the 3 behind back to back)", rounds, resumes, want)
	}
	if gap := nextStart.Sub(lastEnd); gap < interval*8/10 {
		t.Errorf("the round after catching up started %s after it; want an interval (%s): the sum showed for no time", gap, interval)
	}
	if shownBeforeNext != 2 {
		t.Errorf("just before the next round the report showed %d missing; want the 2 found while catching up", shownBeforeNext)
	}
	w.mu.Lock()
	w.last.Until = caughtUp // the sixth round was cancelled
	w.mu.Unlock()
	rep := w.Report(time.Now()).Pipeline
	if rep.Missing != 2 || !slices.Equal(rep.Sample, []string{"lost-1", "lost-2"}) || value(t, w.o.Metrics.missing) != 2 {
		t.Errorf("after catching up: report %d missing %v, gauge %v; want the 2 found while catching up", rep.Missing, rep.Sample, value(t, w.o.Metrics.missing))
	}
	if lb.count("audit: catching up") != 3 {
		t.Errorf("catch-up rounds not logged:\n%s", lb.b.String())
	}
	// The interval's round after: its own figure (it overlaps the last
	// catching-up window; adding would count an event twice).
	w.round(context.Background(), auditFinding(1, nil))
	if rep := w.Report(time.Now()).Pipeline; rep.Missing != 1 || value(t, w.o.Metrics.missing) != 1 {
		t.Errorf("the round after: %d missing; want its own 1", rep.Missing)
	}
}

// TestAuditSkippedCounted: a stretch CatchUp left to no round is counted
// in slotwatch_audit_skipped_seconds_total and named in the report, for
// AuditSkipped.
func TestAuditSkippedCounted(t *testing.T) {
	w, _ := testWatch(t)
	since := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	w.round(context.Background(), func(_ context.Context, o audit.Options) (audit.Result, error) {
		return audit.Result{Since: since, Until: since.Add(15 * time.Minute), Skipped: since.Add(-2 * time.Hour)}, nil
	})
	w.round(context.Background(), func(_ context.Context, o audit.Options) (audit.Result, error) {
		return audit.Result{Since: since.Add(time.Minute), Until: since.Add(16 * time.Minute)}, nil
	})
	if got := value(t, w.o.Metrics.skipped); got != 7200 {
		t.Errorf("slotwatch_audit_skipped_seconds_total %v; want 7200", got)
	}
	p := w.Report(time.Now()).Pipeline
	if !p.SkippedFrom.Equal(since.Add(-2*time.Hour)) || !p.SkippedTo.Equal(since) || p.SkippedAt.IsZero() {
		t.Errorf("report: skipped %s to %s at %s; want %s to %s", p.SkippedFrom, p.SkippedTo, p.SkippedAt, since.Add(-2*time.Hour), since)
	}
}
