package publish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// topicRun is one producer session of the missing-topic tests, driven by
// hand, with what it says: the log, the metrics, the Blocked hook's last
// reason.
type topicRun struct {
	t       *testing.T
	p       *Producer
	cl      *kgo.Client
	adm     *kadm.Client
	tr      *tracker.Tracker
	in      chan wal.Event
	done    chan error
	lb      *logBuffer
	m       *metrics.Metrics
	blocked atomic.Pointer[string]
	cancel  context.CancelFunc
}

func startTopicRun(t *testing.T, brokers string, cfg Config) *topicRun {
	t.Helper()
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.WithLogger(WatchFailures(nil))}, ClientOpts(100, 1<<20, "none", time.Millisecond)...)
	if cfg.Transactional {
		opts = append(opts, kgo.TransactionalID(fmt.Sprintf("outbox-connector-gone-%d", time.Now().UnixNano())))
		opts = append(opts, TxnRetryOpts()...)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := &topicRun{t: t, cl: cl, adm: kadm.NewClient(cl), tr: tracker.New(0), in: make(chan wal.Event, 4), done: make(chan error, 1), lb: newLogBuffer(t), m: metrics.New()}
	cfg.Blocked = func(s string) { r.blocked.Store(&s) }
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 1 << 20
	}
	cfg.Poison = &Poison{}
	cfg.TopicPartitions, cfg.TopicReplication = 1, -1
	cfg.TxnInterval, cfg.TxnMaxRecords = 20*time.Millisecond, 1000
	r.p = New(cfg, cl, router, nil, r.lb.logger(), r.m)
	r.p.topicWatch = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r.cancel = cancel
	t.Cleanup(cancel)
	go func() { r.done <- r.p.Run(ctx, r.in, func() {}) }()
	return r
}

// startTopicRunPublished starts a run and publishes its first event, as
// the relay would: a transactional session whose first commit franz-go
// ended without committing (errCommitAborted, errCommitSkipped: it may so
// end the first commit of a client to a topic new to it, and the producer
// fails the commit aloud) is followed by a new one (a new client, a new
// tracker) that sends the event again, as the relay's next session reads
// it again. Any other end of the session, an ack and then an end, or no
// ack and no end within 10 s, fails the test; so does a third such commit.
func startTopicRunPublished(t *testing.T, brokers string, cfg Config, end uint64, row *route.Row) *topicRun {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := startTopicRun(t, brokers, cfg)
		r.send(end, row)
		ended, err := r.firstAck(end)
		if !ended {
			return r
		}
		downgraded := errors.Is(err, errCommitAborted) || errors.Is(err, errCommitSkipped)
		if !cfg.Transactional || !downgraded || r.tr.Acked() == end || attempt == 3 {
			t.Fatalf("session %d ended with %v (acked %d) before its first event was published; want it acked in the session, or (transactional, at most twice) a commit franz-go did not make; log:\n%s", attempt, err, r.tr.Acked(), r.lb.String())
		}
		t.Logf("session %d: %v; the next sends the event again", attempt, err)
		r.cancel() // its client closes at the test's end
	}
}

// firstAck waits until end is acked (ended false) or the session ends
// (ended true, with its error); neither within 10 s fails the test.
func (r *topicRun) firstAck(end uint64) (ended bool, err error) {
	r.t.Helper()
	deadline := time.After(10 * time.Second)
	for r.tr.Acked() != end {
		select {
		case err := <-r.done:
			return true, err
		case <-deadline:
			r.t.Fatalf("the first event neither published nor the session ended within 10 s (acked %d); log:\n%s", r.tr.Acked(), r.lb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false, nil
}

func (r *topicRun) send(end uint64, row *route.Row) {
	tx := r.tr.Begin(end)
	tx.Add()
	r.in <- wal.Event{Txn: tx, Row: row}
	tx.Commit(end)
}

func (r *topicRun) missing(topic string) float64 {
	return metricValue(r.t, r.m.Registry, "outbox_connector_topic_missing", map[string]string{"topic": topic})
}

func (r *topicRun) reason() string {
	if s := r.blocked.Load(); s != nil {
		return *s
	}
	return ""
}

// waitFor waits until cond holds, or fails the test saying what.
func (r *topicRun) waitFor(within time.Duration, what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v (acked %d, topic_missing metric, Blocked %q); log:\n%s", what, within, r.tr.Acked(), r.reason(), r.lb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *topicRun) create(topic string) {
	r.t.Helper()
	resp, err := r.adm.CreateTopic(context.Background(), 1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

// TestTopicLookupFailsNotLetThrough: with OUTBOX_TOPIC_CREATE=false, a
// lookup of the topic that fails with something other than "unknown topic"
// does not let the topic through (franz-go would then wait for a missing
// one without a word): it is looked up again after a pause, said at warn
// level and to the Blocked hook; once the lookup answers, the missing topic
// is said aloud (error log, outbox_connector_topic_missing, Blocked), and
// once created it gets its event.
func TestTopicLookupFailsNotLetThrough(t *testing.T) {
	s := uniqueSuffix()
	aggType, dlq := "lookup"+s, "dlq"+s
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq))
	// Every lookup of the topic fails (franz-go's own metadata refreshes
	// too, which changes nothing: the topic does not exist).
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: topic, Err: kerr.UnknownServerError, Count: -1})
	r := startTopicRun(t, brokers, Config{DLQTopic: dlq})
	r.send(100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
	r.waitFor(5*time.Second, "the failed lookup said at warn level and to the Blocked hook", func() bool {
		return strings.Contains(r.lb.String(), "level=WARN") && strings.Contains(r.lb.String(), topic) && strings.Contains(r.reason(), topic)
	})
	if strings.Contains(r.lb.String(), "level=ERROR") || r.missing(topic) == 1 {
		t.Fatalf("the topic is said missing while its lookup fails: Kafka did not say so")
	}
	h.Remove()
	r.waitFor(10*time.Second, "the missing topic said aloud once the lookup answers", func() bool {
		return strings.Contains(r.lb.String(), "level=ERROR") && r.missing(topic) == 1 && strings.Contains(r.reason(), "OUTBOX_TOPIC_CREATE")
	})
	r.create(topic)
	r.waitFor(20*time.Second, "the event published once the topic exists", func() bool { return r.tr.Acked() == 100 })
	if r.missing(topic) != 0 || r.reason() != "" {
		t.Errorf("once published: topic_missing %v, Blocked %q; want 0 and \"\"", r.missing(topic), r.reason())
	}
	close(r.in)
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
}

// TestDeletedTopicSaidAloud: a topic deleted after the producer saw it
// exist (its first events published) is looked up again while its records
// wait, and said missing: an error log line naming it and
// OUTBOX_TOPIC_CREATE, outbox_connector_topic_missing{topic} at 1, the
// Blocked hook; nothing after it is acked (with OUTBOX_TOPIC_CREATE, while
// Kafka refuses to create it again). Created again, its events are
// delivered (in the session, or the session ends with an error that is not
// fatal and the next reads them again) and the alarm ends. In both modes.
func TestDeletedTopicSaidAloud(t *testing.T) {
	for _, c := range []struct{ txn, create bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("transactional=%v/create=%v", c.txn, c.create), func(t *testing.T) {
			s := uniqueSuffix()
			aggType, dlq := "gone"+s, "dlq"+s
			topic := "outbox.event." + aggType
			cl, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, dlq, topic))
			r := startTopicRunPublished(t, brokers, Config{DLQTopic: dlq, Transactional: c.txn, TopicCreate: c.create}, 100, eventRow("id", "e1", aggType, "a", `{}`, 90, 100))
			fix := "OUTBOX_TOPIC_CREATE=true"
			if !c.create {
				fix = "kafka-topics.sh --create"
			}
			// With OUTBOX_TOPIC_CREATE the producer creates the topic again
			// at its first look, and the alarm lasts a moment; Kafka refuses
			// the creation until the test has seen the alarm (the producer
			// says so and tries again at every look), then allows it.
			var refuse *kfake.FaultHandle
			if c.create {
				refuse = cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Topic: topic, Err: kerr.PolicyViolation, Count: -1})
			}
			resp, err := r.adm.DeleteTopic(context.Background(), topic)
			if err == nil {
				err = resp.Err
			}
			if err != nil {
				t.Fatal(err)
			}
			r.send(200, eventRow("id", "e2", aggType, "a", `{}`, 190, 200))
			r.waitFor(10*time.Second, "the deleted topic said missing", func() bool {
				log := r.lb.String()
				return strings.Contains(log, "level=ERROR") && strings.Contains(log, topic) && r.missing(topic) == 1 &&
					strings.Contains(r.reason(), topic) && strings.Contains(r.reason(), fix)
			})
			if r.tr.Acked() != 100 {
				t.Fatalf("acked %d while the topic is gone; want 100", r.tr.Acked())
			}
			if c.create {
				if refuse.Hits() == 0 {
					t.Fatalf("the deleted topic said missing, but the producer did not try to create it again (OUTBOX_TOPIC_CREATE=true)")
				}
				refuse.Remove()
			} else {
				r.create(topic)
			}
			deadline := time.After(30 * time.Second)
			for r.tr.Acked() != 200 {
				select {
				case err := <-r.done:
					if err == nil || fatal.Is(err) {
						t.Fatalf("the session ended with %v after the topic was created again; want the event published or an error that is not fatal", err)
					}
					t.Logf("the session ended: %v; the next reads e2 again", err)
					if c.create {
						// Only the producer creates it: Kafka's auto-creation is
						// off, and the test does not.
						details, lerr := r.adm.ListTopics(context.Background(), topic)
						if lerr != nil || details[topic].Err != nil {
							t.Errorf("the session ended, and topic %s does not exist (%v, %v); want it created again by the producer", topic, lerr, details[topic].Err)
						}
					}
					if r.missing(topic) != 0 || r.reason() != "" {
						t.Errorf("the session ended: topic_missing %v, Blocked %q; want 0 and \"\" (the next session looks again)", r.missing(topic), r.reason())
					}
					return
				case <-deadline:
					t.Fatalf("e2 neither published nor the session ended 30 s after the topic was created again; log:\n%s", r.lb.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			r.waitFor(5*time.Second, "the alarm ends once published", func() bool { return r.missing(topic) == 0 && r.reason() == "" })
			close(r.in)
			if err := <-r.done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

var topicSeq atomic.Int64

func uniqueSuffix() string { return fmt.Sprintf("%d%d", time.Now().UnixNano()%1e9, topicSeq.Add(1)) }
