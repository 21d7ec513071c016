package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestHungHandlerHitsTheDeadline (issue 14 defect 7): a handler stuck in the
// database (it honours ctx) is cut off at TxTimeout; the cut counts as an
// attempt, so one that always hangs is dead-lettered after MaxAttempts and
// one that hangs once is applied on the retry. The partition moves on.
func TestHungHandlerHitsTheDeadline(t *testing.T) {
	e := setup(t)
	var attempts attemptCounter
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		n := attempts.next(inbox.Header(r, "id"))
		if v := string(r.Value); v == "hang" || (v == "hang-once" && n == 1) {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(3600)`); err != nil {
				return err
			}
		}
		return effectHandler(ctx, tx, r)
	}
	r1, r2, r3 := rec("ev-hang", "hang"), rec("ev-hang-once", "hang-once"), rec("ev-after", "ok")
	for _, r := range []*kgo.Record{r1, r2, r3} {
		r.Key = []byte("one-partition")
	}
	e.produce(t, r1, r2, r3)
	cfg := e.quiet()
	cfg.TxTimeout = 500 * time.Millisecond
	c, err := inbox.New(e.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := run(t, c)
	// 4 cuts of 0.5 s, backoff well under a second.
	waitFor(t, "all three handled", 10*time.Second, func() bool {
		s := c.Stats()
		return s.Processed+s.DeadLettered >= 3
	})
	took := time.Since(start)
	stop()
	if s := c.Stats(); s.Processed != 2 || s.DeadLettered != 1 {
		t.Errorf("stats %+v; want 2 processed, 1 dead-lettered", s)
	}
	if n := attempts.get("ev-hang"); n != cfg.MaxAttempts {
		t.Errorf("the hung handler ran %d times, want MaxAttempts (%d)", n, cfg.MaxAttempts)
	}
	dlq := e.dlqReader(t)
	var dead *kgo.Record
	waitFor(t, "ev-hang in the DLQ", 10*time.Second, func() bool {
		dead = byID(dlq.read())["ev-hang"]
		return dead != nil
	})
	if reason := inbox.Header(dead, "inbox.error"); !strings.Contains(reason, "TxTimeout") {
		t.Errorf("reason %q; want it to name the deadline", reason)
	}
	t.Logf("4 deadline cuts of %s and the rest in %s", cfg.TxTimeout, took.Round(time.Millisecond))
}

// TestUnsendableDeadLetterStopsTheMember (issue 14 defect 7): a dead letter
// the producer refuses for good (here larger than the client's batch limit)
// is retried a bounded number of times, then Run returns an error naming the
// record and the DLQ; the record is not marked processed nor its offset
// committed, so a member that can send it (the limit raised) dead-letters it
// and goes on.
func TestUnsendableDeadLetterStopsTheMember(t *testing.T) {
	e := setup(t)
	big := rec("ev-big", "big poison"+strings.Repeat("x", 200<<10))
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if strings.HasPrefix(string(r.Value), "big poison") {
			return inbox.Permanent(errors.New("cannot apply this one"))
		}
		return effectHandler(ctx, tx, r)
	}
	e.produce(t, rec("ev-before", "ok"))
	e.produce(t, big, rec("ev-after", "ok"))
	cfg := e.quiet()
	small := cfg
	small.KafkaOpts = []kgo.Opt{kgo.ProducerBatchMaxBytes(100 << 10)}
	c, err := inbox.New(e.pool, h, small)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Fatalf("Run still running 20s after a dead letter the producer refuses; stats %+v", c.Stats())
	}
	if err == nil || !strings.Contains(err.Error(), "ev-big") || !strings.Contains(err.Error(), e.dlq) {
		t.Fatalf("Run: %v; want an error naming the record and the DLQ topic", err)
	}
	t.Logf("Run: %v", err)
	if n := count(t, e.pool, `SELECT count(*) FROM inbox WHERE id = 'ev-big'`); n != 0 {
		t.Errorf("the unsent dead letter was marked processed (%d rows): that is a skip", n)
	}
	// A member that can send it takes over and goes on.
	c2, err := inbox.New(e.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c2)
	waitFor(t, "ev-big dead-lettered and ev-after processed", 30*time.Second, func() bool {
		return c2.Stats().DeadLettered == 1 && effectsOf(t, e, "ev-after") == 1
	})
	stop()
	if n := effectsOf(t, e, "ev-before"); n != 1 {
		t.Errorf("ev-before applied %d times, want once", n)
	}
}

// TestCommitMovesDuringBacklog (issue 14 defect 7): the consumer commits
// what its partitions' workers marked every second, so the group's committed
// offset moves while a backlog is worked off, instead of jumping once at the
// end of an unbounded fetch (during which rebalances were blocked). That the
// poll and the queues are bounded, TestRevokedPausedPartitionIsFetchedAgain
// shows (a queue of MaxPollRecords pauses its partition).
func TestCommitMovesDuringBacklog(t *testing.T) {
	e := setup(t)
	const n = 1200 // seconds of work: at least two commits on the way
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("ev-%d", i), "ok")
		recs[i].Key = []byte("one-partition")
	}
	e.produce(t, recs...)
	slow := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		time.Sleep(2 * time.Millisecond)
		return effectHandler(ctx, tx, r)
	}
	cfg := e.quiet()
	c, err := inbox.New(e.pool, slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	adm := kadm.NewClient(e.prod)
	seen := map[int64]bool{}
	deadline := time.Now().Add(60 * time.Second)
	var committed int64
	for committed < n && time.Now().Before(deadline) {
		offs, err := adm.FetchOffsets(context.Background(), cfg.Group)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !kerr.IsRetriable(err) {
			t.Fatal(err) // COORDINATOR_NOT_AVAILABLE is retriable: a broker's first group
		}
		committed = 0
		offs.Each(func(o kadm.OffsetResponse) { committed += o.At })
		seen[committed] = true
		time.Sleep(20 * time.Millisecond)
	}
	var between []int64
	for o := range seen {
		if o > 0 && o < n {
			between = append(between, o)
		}
	}
	if committed != n || len(between) < 2 {
		t.Errorf("committed %d of %d; committed offsets seen between 0 and %d: %v; want the commit to move at least twice on the way",
			committed, n, n, between)
	}
	t.Logf("committed offsets seen on the way: %d distinct values", len(between))
}

// TestDisableAutoCommitRefused: with kgo.DisableAutoCommit in KafkaOpts the
// Consumer would commit what it processed only on a revoke; New refuses it
// (franz-go does: it cannot be set beside kgo.AutoCommitMarks).
func TestDisableAutoCommitRefused(t *testing.T) {
	e := setup(t)
	cfg := e.quiet()
	cfg.KafkaOpts = []kgo.Opt{kgo.DisableAutoCommit()}
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err == nil {
		c.Client().Close()
		t.Fatal("New accepted kgo.DisableAutoCommit")
	}
	if !strings.Contains(err.Error(), "disable autocommitting") {
		t.Errorf("error %q does not say what is refused", err)
	}
}
