package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestRedriveAppliesDeadLetter (issue 14 defect 4 and the per-aggregate
// order it implies): a dead letter republished unchanged to its source topic
// (the DLQ record's key, value and headers) is applied once; a second copy
// (built by inbox.Redrive) is a duplicate; one redriven too early is
// dead-lettered again, redrivable again; the aggregate's later event was
// applied before it (the inbox does not park an aggregate behind its dead
// letter). A dead letter the inbox could not mark (no id) is refused by
// Redrive.
func TestRedriveAppliesDeadLetter(t *testing.T) {
	e := setup(t)
	var broken atomic.Bool
	broken.Store(true)
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if string(r.Value) == "fixme" && broken.Load() {
			return inbox.Permanent(errors.New("the handler cannot apply this yet"))
		}
		return effectHandler(ctx, tx, r)
	}
	var recs []*kgo.Record
	for i, v := range []string{"ok", "fixme", "ok"} {
		r := rec(fmt.Sprintf("ev-%d", i+1), v)
		r.Key = []byte("order-1") // one aggregate: one partition, in order
		recs = append(recs, r)
	}
	e.produce(t, recs...)
	c, err := inbox.New(e.pool, h, e.quiet())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	dlq := e.dlqReader(t)
	var dead *kgo.Record
	waitFor(t, "ev-2 dead-lettered", 30*time.Second, func() bool {
		dead = byID(dlq.read())["ev-2"]
		return dead != nil
	})
	waitFor(t, "ev-3 applied", 30*time.Second, func() bool { return effectsOf(t, e, "ev-3") == 1 })
	redrive := func() {
		r := &kgo.Record{Topic: inbox.Header(dead, "inbox.source.topic"), Key: dead.Key, Value: dead.Value,
			Headers: append([]kgo.RecordHeader(nil), dead.Headers...)}
		if err := e.prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Redriven too early (the handler still broken), it is dead-lettered
	// again, with the inbox's headers of this failure only.
	redrive()
	waitFor(t, "ev-2 dead-lettered again", 30*time.Second, func() bool {
		n := 0
		for _, r := range dlq.read() {
			if inbox.Header(r, "id") == "ev-2" {
				n++
				dead = r
			}
		}
		return n == 2
	})
	for _, key := range []string{inbox.RedriveHeader, "inbox.error", "inbox.source.offset"} {
		n := 0
		for _, h := range dead.Headers {
			if h.Key == key {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the second dead letter has %d %s headers, want 1", n, key)
		}
	}
	broken.Store(false) // the handler is fixed; redrive the dead letter
	redrive()
	deadline := time.Now().Add(20 * time.Second)
	for effectsOf(t, e, "ev-2") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the redriven dead letter ev-2 was not applied within 20s; stats %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	again, err := inbox.Redrive(dead) // a second copy of the redrive is a duplicate
	if err != nil {
		t.Fatal(err)
	}
	if again.Topic != e.topic || inbox.Header(again, inbox.RedriveHeader) != "ev-2" || inbox.Header(again, "inbox.error") != "" {
		t.Errorf("Redrive: topic %q, headers %v; want the source topic, the redrive header, none of the dead letter's", again.Topic, again.Headers)
	}
	if err := e.prod.ProduceSync(context.Background(), again).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second redrive handled", 20*time.Second, func() bool { return c.Stats().Duplicates >= 1 })
	if n := effectsOf(t, e, "ev-2"); n != 1 {
		t.Errorf("ev-2 applied %d times, want once", n)
	}
	if s := c.Stats(); s.Redriven != 2 || s.DeadLettered != 2 {
		t.Errorf("stats %+v; want 2 redriven (one failed again), 2 dead-lettered", s)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM inbox WHERE id = 'ev-2' AND outcome = 'processed'`); n != 1 {
		t.Errorf("ev-2 is not marked processed after its redrive")
	}
	if _, err := inbox.Redrive(&kgo.Record{Topic: e.dlq, Value: []byte("no id"),
		Headers: []kgo.RecordHeader{{Key: "inbox.source.topic", Value: []byte(e.topic)}, {Key: "inbox.error", Value: []byte("no id")}}}); err == nil {
		t.Error("Redrive accepted a dead letter without an id")
	}
	rows, err := e.pool.Query(context.Background(), `SELECT event_id FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(order, ",") != "ev-1,ev-3,ev-2" {
		t.Errorf("effects applied in order %v, want ev-1,ev-3,ev-2 (the later event goes on, the redrive comes last)", order)
	}
}

// TestRedriveKeepsTheOriginalPayload (review finding 6): a dead letter
// redriven with a corrected payload is applied, and afterwards a late copy
// of the original event (a relay replaying it, a consumer that lost its
// offsets) is a duplicate, as is a second copy of the redrive: the table
// keeps the hash of both payloads. The redrive replaced the stored hash, so
// the original's copy was dead-lettered as "id reused". A third payload under
// the id is still dead-lettered as reused.
func TestRedriveKeepsTheOriginalPayload(t *testing.T) {
	e := setup(t)
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if string(r.Value) == "ok, amount as a string" {
			return inbox.Permanent(errors.New("amount must be a number"))
		}
		return effectHandler(ctx, tx, r)
	}
	original := rec("ev-1", "ok, amount as a string")
	original.Key = []byte("order-1")
	e.produce(t, original)
	c, err := inbox.New(e.pool, h, e.quiet())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	dlq := e.dlqReader(t)
	var dead *kgo.Record
	waitFor(t, "ev-1 dead-lettered", 30*time.Second, func() bool {
		dead = byID(dlq.read())["ev-1"]
		return dead != nil
	})
	redrive, err := inbox.Redrive(dead)
	if err != nil {
		t.Fatal(err)
	}
	redrive.Value = []byte("ok, amount as a number") // the operator corrected it
	if err := e.prod.ProduceSync(context.Background(), redrive).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the corrected redrive applied", 30*time.Second, func() bool { return effectsOf(t, e, "ev-1") == 1 })
	lateOriginal := rec("ev-1", "ok, amount as a string")
	lateOriginal.Key = []byte("order-1")
	second := &kgo.Record{Key: redrive.Key, Value: redrive.Value, Headers: redrive.Headers}
	e.produce(t, lateOriginal, second)
	waitFor(t, "both late copies handled", 30*time.Second, func() bool {
		s := c.Stats()
		return s.Duplicates+s.DeadLettered >= 3
	})
	if s := c.Stats(); s.Duplicates != 2 || s.DeadLettered != 1 || s.IDReused != 0 {
		t.Errorf("stats %+v; want 2 duplicates (the original's late copy, the redrive's second copy), 1 dead letter (the first), no id reused", s)
	}
	third := rec("ev-1", "another event under the same id")
	third.Key = []byte("order-1")
	e.produce(t, third)
	waitFor(t, "the third payload handled", 30*time.Second, func() bool { return c.Stats().IDReused >= 1 })
	if n := effectsOf(t, e, "ev-1"); n != 1 {
		t.Errorf("ev-1 applied %d times, want once", n)
	}
}

// TestRedriveAppliesOnlyInItsGroup (review finding 9): two groups read one
// topic, and both dead-lettered ev-1. The operator redrives group A's dead
// letter (unchanged, and as Redrive builds it): A applies it; B, whose
// reason has passed too but whose operator did not redrive it, does not:
// for B the record is a duplicate of the id it dead-lettered. A redrive
// applies in the group named by the dead letter's inbox.consumer header; it
// applied in every group that had the id dead-lettered.
func TestRedriveAppliesOnlyInItsGroup(t *testing.T) {
	e := setup(t)
	var fixed atomic.Bool
	h := func(group string) inbox.Handler {
		return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if string(r.Value) == "fixme" && !fixed.Load() {
				return inbox.Permanent(errors.New("the handler cannot apply this yet"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, group+"/"+inbox.Header(r, "id"))
			return err
		}
	}
	e.produce(t, rec("ev-1", "fixme"))
	var cs []*inbox.Consumer
	for _, g := range []string{"a", "b"} {
		cfg := e.quiet()
		cfg.Group += "-" + g
		c, err := inbox.New(e.pool, h(g), cfg)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		stop := run(t, c)
		defer stop()
	}
	a, b := cs[0], cs[1]
	dlq := e.dlqReader(t)
	var deadA *kgo.Record
	waitFor(t, "ev-1 dead-lettered by both groups", 30*time.Second, func() bool {
		n := 0
		for _, r := range dlq.read() {
			n++
			if inbox.Header(r, "inbox.consumer") == e.quiet().Group+"-a" {
				deadA = r
			}
		}
		return n == 2 && deadA != nil
	})
	fixed.Store(true)
	raw := &kgo.Record{Topic: inbox.Header(deadA, "inbox.source.topic"), Key: deadA.Key, Value: deadA.Value,
		Headers: append([]kgo.RecordHeader(nil), deadA.Headers...)}
	built, err := inbox.Redrive(deadA)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.prod.ProduceSync(context.Background(), raw, built).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both redrive copies handled by both groups", 30*time.Second, func() bool {
		return a.Stats().Processed+a.Stats().Duplicates >= 2 && b.Stats().Processed+b.Stats().Duplicates >= 2
	})
	if n := effectsOf(t, e, "a/ev-1"); n != 1 {
		t.Errorf("group a applied its redriven ev-1 %d times, want once", n)
	}
	if n := effectsOf(t, e, "b/ev-1"); n != 0 {
		t.Errorf("group b applied ev-1 %d times from group a's redrive, want 0 (b's dead letter was not redriven); stats %+v", n, b.Stats())
	}
	if s := b.Stats(); s.Redriven != 0 || s.Duplicates != 2 {
		t.Errorf("group b: stats %+v; want no redrive, 2 duplicates", s)
	}
}
