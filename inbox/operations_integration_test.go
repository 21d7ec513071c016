package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestMetricsSurviveAReplacedMember (review finding 8a): after a member
// stopped with ErrDeadLetterRefused, a new Consumer of the same group in the
// same process, on the same Registerer, starts (New refused it: "already
// registered", the stopped member's metrics were never unregistered) and
// its counts continue the group's series: inbox_*_total count both members.
func TestMetricsSurviveAReplacedMember(t *testing.T) {
	e := setup(t)
	big := rec("ev-big", "big poison"+strings.Repeat("x", 200<<10))
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if strings.HasPrefix(string(r.Value), "big poison") {
			return inbox.Permanent(errors.New("cannot apply this one"))
		}
		return effectHandler(ctx, tx, r)
	}
	for _, r := range []*kgo.Record{rec("ev-before", "ok"), big, rec("ev-after", "ok")} {
		r.Key = []byte("one-partition")
		e.produce(t, r)
	}
	reg := prometheus.NewRegistry()
	cfg := e.quiet()
	cfg.Registerer = reg
	small := cfg
	small.KafkaOpts = []kgo.Opt{kgo.ProducerBatchMaxBytes(100 << 10)}
	c1, err := inbox.New(e.pool, h, small)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c1.Run(ctx); !errors.Is(err, inbox.ErrDeadLetterRefused) {
		t.Fatalf("the first member: Run = %v, want ErrDeadLetterRefused", err)
	}
	c2, err := inbox.New(e.pool, h, cfg)
	if err != nil {
		t.Fatalf("a new member of the group on the same Registerer after the first stopped: %v", err)
	}
	stop := run(t, c2)
	waitFor(t, "ev-big dead-lettered and ev-after applied", 30*time.Second, func() bool {
		return c2.Stats().DeadLettered == 1 && effectsOf(t, e, "ev-after") == 1
	})
	stop()
	if v := metricValue(t, reg, "inbox_processed_total"); v != 2 {
		t.Errorf("inbox_processed_total = %v, want 2 (ev-before by the first member, ev-after by the second)", v)
	}
	if v := metricValue(t, reg, "inbox_dead_lettered_total"); v != 1 {
		t.Errorf("inbox_dead_lettered_total = %v, want 1", v)
	}
	if s := c2.Stats(); s.Processed != 1 {
		t.Errorf("the second member's Stats %+v; want its own counts only (1 processed)", s)
	}
}

// TestMissingDLQTopicIsCreated (review finding 8b): a DLQ topic that is
// missing when a record is dead-lettered (deleted, or not created at the
// member's start because Kafka was away; the shared broker does not
// auto-create topics) is created then, and the dead letter is sent. Before,
// the produce failed with UNKNOWN_TOPIC_OR_PARTITION, which franz-go calls
// retriable, and the member retried it forever with a warning per try.
func TestMissingDLQTopicIsCreated(t *testing.T) {
	e := setup(t)
	cfg := e.quiet()
	logs := &testenv.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	adm := kadm.NewClient(e.prod)
	waitFor(t, "the DLQ topic created at start", 20*time.Second, func() bool {
		td, err := adm.ListTopics(context.Background(), e.dlq)
		return err == nil && td.Has(e.dlq)
	})
	if _, err := adm.DeleteTopic(context.Background(), e.dlq); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the DLQ topic gone", 20*time.Second, func() bool {
		td, err := adm.ListTopics(context.Background(), e.dlq)
		return err == nil && !td.Has(e.dlq)
	})
	e.produce(t, rec("ev-poison", "malformed"), rec("ev-after", "ok"))
	deadline := time.Now().Add(40 * time.Second)
	for c.Stats().DeadLettered == 0 {
		if time.Now().After(deadline) {
			out := logs.String()
			t.Fatalf("not dead-lettered within 40s of the DLQ topic's deletion; stats %+v; %d warnings; the log's end:\n%s",
				c.Stats(), strings.Count(out, "dead-letter produce failed"), out[max(0, len(out)-2000):])
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, "ev-after applied", 20*time.Second, func() bool { return effectsOf(t, e, "ev-after") == 1 })
	dlq := e.dlqReader(t)
	waitFor(t, "ev-poison in the re-created DLQ topic", 20*time.Second, func() bool { return byID(dlq.read())["ev-poison"] != nil })
}

// TestMissingDLQTopicStopsTheMember (review finding 8b): a DLQ topic that is
// missing and cannot be created (auto-creation off, CreateTopics denied) is a
// dead letter Kafka refuses for good: after a bounded number of tries Run
// returns ErrDeadLetterRefused naming the topic, the record unmarked,
// instead of retrying forever with only a warning. kfake here, for the
// denied CreateTopics.
func TestMissingDLQTopicStopsTheMember(t *testing.T) {
	e := setup(t) // PostgreSQL; Kafka is kfake
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, e.topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Err: kerr.TopicAuthorizationFailed, Count: -1})
	brokers := kc.ListenAddrs()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	r := rec("ev-poison", "malformed")
	r.Topic = e.topic
	if err := prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := e.quiet()
	cfg.Brokers = brokers
	// Faster metadata, so that each of the bounded tries takes well under
	// a second instead of about ten (the bound, not franz-go's pace, is
	// under test).
	cfg.KafkaOpts = []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond), kgo.UnknownTopicRetries(1)}
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cancel()
		<-done
		t.Fatalf("Run still running 60s after a dead letter whose DLQ topic is missing and cannot be created; stats %+v", c.Stats())
	}
	if !errors.Is(err, inbox.ErrDeadLetterRefused) || !strings.Contains(err.Error(), e.dlq) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Run: %v; want ErrDeadLetterRefused naming the missing DLQ topic", err)
	}
	t.Logf("after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if n := count(t, e.pool, `SELECT count(*) FROM inbox WHERE id = 'ev-poison'`); n != 0 {
		t.Errorf("the unsent dead letter was marked (%d rows): that is a skip", n)
	}
}

// TestCleanupFailuresAreCounted (review finding 8c): a cleanup that fails
// (here a trigger refuses the DELETE) is counted in
// inbox_cleanup_failures_total, so an alert can see a table that stopped
// shrinking; it was only logged.
func TestCleanupFailuresAreCounted(t *testing.T) {
	e := setup(t)
	if _, err := e.pool.Exec(context.Background(), `
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no deletes today'; END $$;
		CREATE TRIGGER no_delete BEFORE DELETE ON inbox FOR EACH STATEMENT EXECUTE FUNCTION refuse();`); err != nil {
		t.Fatal(err)
	}
	cfg := e.quiet()
	cfg.CleanupInterval = 100 * time.Millisecond
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	c, err := inbox.New(e.pool, effectHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	time.Sleep(time.Second)
	if v := metricValue(t, reg, "inbox_cleanup_failures_total"); v < 3 {
		t.Errorf("inbox_cleanup_failures_total = %v after 1s of cleanups every 100ms that all fail, want at least 3", v)
	}
}
