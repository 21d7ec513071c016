package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestHandlerPanicIsAnAttempt (issue 14 defect 6): a handler panic is
// recovered and counts as a failed attempt: a record that always panics is
// dead-lettered after MaxAttempts with the panic as its reason, one that
// panics once is applied on the retry, and the consumer goes on.
func TestHandlerPanicIsAnAttempt(t *testing.T) {
	e := setup(t)
	var attempts attemptCounter
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		n := attempts.next(inbox.Header(r, "id"))
		switch {
		case string(r.Value) == "panic":
			panic("nil map in the handler")
		case string(r.Value) == "panic-once" && n == 1:
			var m map[string]int
			m["x"]++ // a real runtime panic
		}
		return effectHandler(ctx, tx, r)
	}
	e.produce(t, rec("ev-panic", "panic"), rec("ev-panic-once", "panic-once"), rec("ev-after", "ok"))
	c, err := inbox.New(e.pool, h, e.quiet())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all three handled", 30*time.Second, func() bool {
		s := c.Stats()
		return s.Processed+s.DeadLettered >= 3
	})
	stop()
	if s := c.Stats(); s.Processed != 2 || s.DeadLettered != 1 {
		t.Errorf("stats %+v; want 2 processed, 1 dead-lettered", s)
	}
	if n := attempts.get("ev-panic"); n != 3 {
		t.Errorf("the panicking handler ran %d times, want MaxAttempts (3)", n)
	}
	dlq := e.dlqReader(t)
	var dead *kgo.Record
	waitFor(t, "the panicking record in the DLQ", 10*time.Second, func() bool {
		dead = byID(dlq.read())["ev-panic"]
		return dead != nil
	})
	if reason := inbox.Header(dead, "inbox.error"); !strings.Contains(reason, "panic") || !strings.Contains(reason, "nil map in the handler") {
		t.Errorf("reason %q; want it to name the panic", reason)
	}
	if n := effectsOf(t, e, "ev-panic-once"); n != 1 {
		t.Errorf("ev-panic-once applied %d times, want once", n)
	}
}
