package publish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// idemUnit is an idempotent producer's session state without a Kafka
// client, for driving its promise and its checks by hand.
func idemUnit(t testing.TB) *Producer {
	t.Helper()
	p := New(Config{Poison: &Poison{}}, nil, nil, nil, newLogBuffer(t).logger(), metrics.New())
	p.idm.halt, p.idm.cancel = context.WithCancel(context.Background())
	t.Cleanup(p.idm.cancel)
	p.idm.wake = make(chan struct{}, 1)
	return p
}

// failedRecord is a record of topic (partition 0, key k) whose promise
// reports a failure, as franz-go hands it over.
func failedRecord(p *Producer, topic string, lsn uint64) *kgo.Record {
	row := eventRow("id", fmt.Sprint("ev-", lsn), "agg", "k", `{}`, lsn, lsn+5)
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte("k"),
		Context: &recEvent{Context: p.idm.halt, ev: wal.Event{Row: row}, id: rowID{commit: lsn + 5, lsn: lsn}}}
}

// TestIdemHaltCause: the error a session of the idempotent mode ends with
// is its first failure's, unless a weightier one follows (the fatal over
// the fenced over any other): the records franz-go fails because of the
// first failure (their context, halt, cancelled; the client closed) must
// not hide why the session ended, and a refused credential or a lost
// fence must not be hidden behind a refused record. Every failure cancels
// halt, so that franz-go fails the records not yet sent, and wakes Run.
func TestIdemHaltCause(t *testing.T) {
	isFatal := func(err error) bool { return fatal.Is(err) }
	fenced := func(err error) bool { return errors.Is(err, ErrFenced) && !fatal.Is(err) }
	refused := func(err error) bool { return errors.Is(err, kerr.InvalidRecord) && !errors.Is(err, ErrFenced) }
	transient := func(err error) bool { return errors.Is(err, kerr.NotLeaderForPartition) }
	for _, tc := range []struct {
		name string
		errs []error
		want func(error) bool
	}{
		{"refused then its consequences", []error{kerr.InvalidRecord, context.Canceled, kgo.ErrClientClosed}, refused},
		{"transient then a refusal", []error{kerr.NotLeaderForPartition, kerr.InvalidRecord}, transient},
		{"refused then fenced", []error{kerr.InvalidRecord, kerr.ProducerFenced, context.Canceled}, fenced},
		{"refused then fatal", []error{kerr.InvalidRecord, kerr.TopicAuthorizationFailed}, isFatal},
		{"fenced then fatal", []error{kerr.ProducerFenced, kerr.TopicAuthorizationFailed, kerr.InvalidRecord}, isFatal},
		{"fatal then fenced", []error{kerr.TopicAuthorizationFailed, kerr.ProducerFenced, kerr.InvalidRecord}, isFatal},
		{"fenced then refused", []error{kerr.ProducerFenced, kerr.InvalidRecord}, fenced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := idemUnit(t)
			if err := p.haltErr(); err != nil {
				t.Fatalf("haltErr before any failure = %v", err)
			}
			for i, err := range tc.errs {
				p.idemPromise(failedRecord(p, "t", uint64(100+10*i)), err)
				if i == 0 {
					if p.idm.halt.Err() == nil {
						t.Fatal("a failed record left halt uncancelled: franz-go would still send the records behind it")
					}
					select {
					case <-p.idm.wake:
					default:
						t.Fatal("a failed record did not wake Run")
					}
				}
			}
			if err := p.haltErr(); err == nil || !tc.want(err) {
				t.Errorf("after %v the session ends with %v", tc.errs, err)
			}
		})
	}
}

// TestSendIdemAfterRefusal: once WatchFailures saw Kafka refuse a batch,
// sendIdem produces nothing more (the client here is nil: producing would
// panic) and returns why the session ends: at once when a failed record's
// promise said so already, else as soon as one does.
func TestSendIdemAfterRefusal(t *testing.T) {
	rec := func() *kgo.Record { return &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte("v")} }
	ev := wal.Event{Row: eventRow("id", "e", "agg", "k", `{}`, 1, 2)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()

	t.Run("failure known", func(t *testing.T) {
		p := idemUnit(t)
		p.batchRefused()
		p.idemPromise(failedRecord(p, "t", 100), kerr.InvalidRecord)
		if err := p.sendIdem(ctx, ev, rowID{}, rec(), false); !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("sendIdem after the refusal = %v; want the refusal", err)
		}
	})
	t.Run("failure pending", func(t *testing.T) {
		p := idemUnit(t)
		p.batchRefused()
		if p.idm.halt.Err() == nil {
			t.Fatal("batchRefused left halt uncancelled")
		}
		res := make(chan error, 1)
		go func() { res <- p.sendIdem(ctx, ev, rowID{}, rec(), false) }()
		select {
		case err := <-res:
			t.Fatalf("sendIdem returned %v before the failed record's promise ran", err)
		case <-time.After(20 * time.Millisecond):
		}
		p.idemPromise(failedRecord(p, "t", 100), kerr.InvalidRecord)
		if err := <-res; !errors.Is(err, kerr.InvalidRecord) {
			t.Fatalf("sendIdem after the promise = %v; want the refusal", err)
		}
	})
	t.Run("produced alone", func(t *testing.T) {
		// A suspect produced alone is expected to fail: its refusal halts
		// nothing.
		p := idemUnit(t)
		p.idm.alone.Store(true)
		p.batchRefused()
		if p.idm.stop.Load() || p.idm.halt.Err() != nil {
			t.Fatal("a refusal of a record produced alone stopped the session")
		}
	})
}

// TestIdemFailureEndsFlush: the events handed over, the stream closes the
// hand-over and the producer flushes; one record is refused meanwhile
// while another waits for a topic that has no leader. The failure fails
// the waiting record too (every record's context is halt), so the flush
// ends at once and the session ends with the refusal, the waiting event
// unconfirmed; the flush does not wait for what the broker will not take,
// and the failure seen during it is not lost. With WatchFailures and
// without (then only the failed record's promise cancels halt).
func TestIdemFailureEndsFlush(t *testing.T) {
	for _, watched := range []bool{true, false} {
		t.Run(map[bool]string{true: "watched", false: "unwatched"}[watched], func(t *testing.T) {
			suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
			bad, stuck, dlq := "bad"+suffix, "stuck"+suffix, "dlq"+suffix
			c, brokers := fakeKafka(t, kfake.NumBrokers(1),
				kfake.SeedTopics(1, "outbox.event."+bad, "outbox.event."+stuck, dlq))
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.event." + bad, Err: kerr.InvalidRecord, Count: -1})
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: "outbox.event." + stuck, Err: kerr.LeaderNotAvailable, Count: -1})
			l := newLine(t, brokers, Config{DLQTopic: dlq}, route.DefaultConfig())
			l.noWatch = !watched
			l.add(105, eventRow("id", "e1", stuck, "a", `{"seq": 1}`, 100, 105))
			l.add(115, eventRow("id", "e2", bad, "a", `{"seq": 2}`, 110, 115))
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			start := time.Now()
			err := l.session(ctx)
			took := time.Since(start)
			if !errors.Is(err, kerr.InvalidRecord) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("session ended after %v with %v; want the refusal", took, err)
			}
			if took > 2*time.Second {
				t.Errorf("session took %v to end after the refusal", took)
			}
			if l.confirmed != 0 {
				t.Errorf("confirmed %d; the waiting event (105) was never acked", l.confirmed)
			}
		})
	}
}

// lineLog is a kgo.Logger that keeps what it is handed.
type lineLog struct {
	level kgo.LogLevel
	got   []string
}

func (l *lineLog) Level() kgo.LogLevel { return l.level }
func (l *lineLog) Log(level kgo.LogLevel, msg string, _ ...any) {
	l.got = append(l.got, fmt.Sprintf("%d:%s", level, msg))
}

// TestWatchFailuresLogging: WatchFailures passes every line on to the
// logger it wraps exactly as that logger's level says, asks franz-go for
// info lines at least (where the batch-failed line is), and fires on the
// batch-failed line at error, warn or info level, never on another line
// nor on a debug one.
func TestWatchFailuresLogging(t *testing.T) {
	for _, lvl := range []kgo.LogLevel{kgo.LogLevelError, kgo.LogLevelInfo, kgo.LogLevelDebug} {
		inner := &lineLog{level: lvl}
		w := WatchFailures(inner)
		if got, want := w.Level(), max(lvl, kgo.LogLevelInfo); got != want {
			t.Errorf("inner level %v: Level() = %v; want %v", lvl, got, want)
		}
		fired := 0
		f := func() { fired++ }
		w.(*failureWatch).refused.Store(&f)
		var want []string
		for _, l := range []kgo.LogLevel{kgo.LogLevelError, kgo.LogLevelWarn, kgo.LogLevelInfo, kgo.LogLevelDebug} {
			for _, msg := range []string{batchFailedMsg, "other"} {
				w.Log(l, msg, "k", "v")
				if l <= lvl {
					want = append(want, fmt.Sprintf("%d:%s", l, msg))
				}
			}
		}
		if strings.Join(inner.got, ",") != strings.Join(want, ",") {
			t.Errorf("inner level %v was handed %v; want %v", lvl, inner.got, want)
		}
		if fired != 3 {
			t.Errorf("inner level %v: the watch fired %d times; want 3 (error, warn, info)", lvl, fired)
		}
	}
	w := WatchFailures(nil)
	if w.Level() != kgo.LogLevelInfo {
		t.Errorf("without an inner logger Level() = %v; want info", w.Level())
	}
	w.Log(kgo.LogLevelInfo, batchFailedMsg) // nothing to fire, nothing to log to
}
