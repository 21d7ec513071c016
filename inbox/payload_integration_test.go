package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestIDReusedWithDifferentPayload (issue 14 defect 5): a record repeating
// a processed id with a different payload is dead-lettered with that reason,
// never skipped as a duplicate, and counted (Stats.IDReused and the metric
// inbox_id_reused_total); a true duplicate (same payload) is skipped.
func TestIDReusedWithDifferentPayload(t *testing.T) {
	e := setup(t)
	e.produce(t, rec("ev-1", "ok"), rec("ev-1", "ok, but another event"), rec("ev-1", "ok"), rec("ev-2", "ok"))
	cfg := e.quiet()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all four handled", 30*time.Second, func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.DeadLettered >= 4
	})
	stop()
	if s := c.Stats(); s.Processed != 2 || s.Duplicates != 1 || s.DeadLettered != 1 || s.IDReused != 1 {
		t.Errorf("stats %+v; want 2 processed, 1 duplicate, 1 dead-lettered (the reused id), 1 id reused", s)
	}
	if v := metricValue(t, reg, "inbox_id_reused_total"); v != 1 {
		t.Errorf("inbox_id_reused_total = %v, want 1", v)
	}
	dlq := e.dlqReader(t)
	var dead *kgo.Record
	waitFor(t, "the reused id in the DLQ", 10*time.Second, func() bool {
		dead = byID(dlq.read())["ev-1"]
		return dead != nil
	})
	if string(dead.Value) != "ok, but another event" || !strings.Contains(inbox.Header(dead, "inbox.error"), "different payload") {
		t.Errorf("dead letter %q with reason %q; want the second payload, reason naming a different payload",
			dead.Value, inbox.Header(dead, "inbox.error"))
	}
	if n := effectsOf(t, e, "ev-1"); n != 1 {
		t.Errorf("ev-1 applied %d times, want once", n)
	}
}

func metricValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestSchemaUpgradeKeepsOldRows: EnsureSchema on a table created before
// payload_sha256 existed adds the column and keeps the rows; an id processed
// then (no hash) is a duplicate whatever payload repeats it.
func TestSchemaUpgradeKeepsOldRows(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE public.inbox_v1 (
		consumer text NOT NULL, id text NOT NULL, topic text NOT NULL, kafka_partition integer NOT NULL,
		kafka_offset bigint NOT NULL, outcome text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (consumer, id))`); err != nil {
		t.Fatal(err)
	}
	cfg := e.quiet()
	cfg.Table = "public.inbox_v1"
	if _, err := e.pool.Exec(ctx, `INSERT INTO inbox_v1 (consumer, id, topic, kafka_partition, kafka_offset, outcome)
		VALUES ($1, 'ev-old', $2, 0, 0, 'processed')`, cfg.Group, e.topic); err != nil {
		t.Fatal(err)
	}
	if err := inbox.EnsureSchema(ctx, e.pool, cfg.Table); err != nil {
		t.Fatal(err)
	}
	if err := inbox.EnsureSchema(ctx, e.pool, cfg.Table); err != nil { // idempotent
		t.Fatal(err)
	}
	e.produce(t, rec("ev-old", "ok, whatever it said then"), rec("ev-new", "ok"), rec("ev-new", "ok"))
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, "all three handled", 30*time.Second, func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.DeadLettered >= 3
	})
	stop()
	if s := c.Stats(); s.Processed != 1 || s.Duplicates != 2 || s.DeadLettered != 0 {
		t.Errorf("stats %+v; want 1 processed (ev-new), 2 duplicates (ev-old unhashed, ev-new)", s)
	}
	if n := count(t, e.pool, `SELECT count(*) FROM inbox_v1 WHERE payload_sha256 IS NOT NULL`); n != 1 {
		t.Errorf("%d hashed rows, want 1 (ev-new)", n)
	}
}
