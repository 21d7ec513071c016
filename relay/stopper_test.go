package relay

import (
	"context"
	"testing"
	"time"
)

// TestStopper: a soft stop ends reading at once and producing only after
// the grace; the term's end ends both at once; neither leaks into the
// caller's context; release ends everything.
func TestStopper(t *testing.T) {
	done := func(ctx context.Context) bool { return ctx.Err() != nil }
	within := func(ctx context.Context, d time.Duration) bool {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(d):
			return false
		}
	}
	const grace = 150 * time.Millisecond

	t.Run("soft", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		term, endTerm := context.WithCancel(context.Background())
		defer endTerm()
		s := newStopper(ctx, term, grace)
		defer s.release()
		if done(s.read) || done(s.hard) || s.graceful() {
			t.Fatal("stopped before any stop")
		}
		start := time.Now()
		cancel()
		if !within(s.read, time.Second) {
			t.Fatal("a soft stop did not end reading")
		}
		if !s.graceful() {
			t.Error("a soft stop with the term held is not graceful")
		}
		if done(s.hard) {
			t.Error("a soft stop ended producing at once")
		}
		if !within(s.hard, 5*time.Second) || time.Since(start) < grace {
			t.Errorf("producing ended after %s; want the grace, %s", time.Since(start), grace)
		}
	})
	t.Run("term", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		term, endTerm := context.WithCancel(context.Background())
		s := newStopper(ctx, term, time.Hour)
		defer s.release()
		endTerm()
		if !within(s.read, time.Second) || !within(s.hard, time.Second) {
			t.Fatal("the term's end did not stop reading and producing at once")
		}
		if s.graceful() || done(ctx) {
			t.Errorf("graceful %v, caller's context done %v", s.graceful(), done(ctx))
		}
		cancel()
		if s.graceful() {
			t.Error("a soft stop after the term's end is graceful")
		}
	})
	t.Run("cut", func(t *testing.T) {
		s := newStopper(context.Background(), context.Background(), time.Hour)
		s.cutRead()
		if !done(s.read) || done(s.hard) || s.graceful() {
			t.Errorf("cutRead: read %v, hard %v, graceful %v; want only reading ended", done(s.read), done(s.hard), s.graceful())
		}
		s.release()
		if !done(s.hard) {
			t.Error("release left producing running")
		}
	})
}
