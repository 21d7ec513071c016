package publish

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// walTxn is one PostgreSQL transaction as the stream hands it over: its
// rows, in order, and its end LSN.
type walTxn struct {
	end  uint64
	rows []*route.Row
}

// line is the relay around a producer, as far as the producer can tell: a
// session reads the WAL from the confirmed position, hands every row to a
// new producer on a new Kafka client, and ends when the producer returns;
// the next one starts where the tracker got. Poison (and suspects) outlive
// sessions, as the relay keeps them.
type line struct {
	t       testing.TB
	brokers string
	cfg     Config
	router  *route.Router
	pool    *pgxpool.Pool
	m       *metrics.Metrics
	log     *logBuffer
	opts    []kgo.Opt     // extra client options
	pace    time.Duration // a pause after each row handed over
	noWatch bool          // no WatchFailures around the client's logger (the relay has one)

	txns      []walTxn
	confirmed uint64
	sessions  int
	errs      []error
}

func newLine(t testing.TB, brokers string, cfg Config, rcfg route.Config) *line {
	t.Helper()
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Poison == nil {
		cfg.Poison = &Poison{}
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 1 << 20
	}
	if cfg.TopicPartitions == 0 {
		cfg.TopicPartitions = 1
	}
	if cfg.TopicReplication == 0 {
		cfg.TopicReplication = -1
	}
	if cfg.TxnInterval == 0 {
		cfg.TxnInterval = 20 * time.Millisecond
	}
	if cfg.TxnMaxRecords == 0 {
		cfg.TxnMaxRecords = 1000
	}
	cfg.TopicCreate = true
	return &line{t: t, brokers: brokers, cfg: cfg, router: router, m: metrics.New(), log: newLogBuffer(t)}
}

// add appends a WAL transaction ending at end.
func (l *line) add(end uint64, rows ...*route.Row) {
	l.txns = append(l.txns, walTxn{end: end, rows: rows})
}

func (l *line) last() uint64 { return l.txns[len(l.txns)-1].end }

// session runs one session; it returns the producer's error.
func (l *line) session(ctx context.Context) error {
	l.t.Helper()
	l.sessions++
	opts := append([]kgo.Opt{kgo.SeedBrokers(l.brokers)}, ClientOpts(1000, l.cfg.MaxMessageBytes, "none", time.Millisecond)...)
	if l.cfg.Transactional {
		opts = append(opts, kgo.TransactionalID(fmt.Sprintf("outbox-connector-test-%p", l)),
			kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
	}
	if !l.noWatch {
		opts = append(opts, kgo.WithLogger(WatchFailures(nil)))
	}
	opts = append(opts, l.opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		l.t.Fatal(err)
	}
	defer cl.Close()
	tr := tracker.New(l.confirmed)
	in := make(chan wal.Event, 16)
	p := New(l.cfg, cl, l.router, l.pool, l.log.logger(), l.m)
	stopped := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, in, func() { once.Do(func() { close(stopped) }) }) }()
feed:
	for _, tx := range l.txns {
		if tx.end <= l.confirmed {
			continue
		}
		txn := tr.Begin(tx.end)
		for _, row := range tx.rows {
			txn.Add()
			select {
			case in <- wal.Event{Txn: txn, Row: row}:
				if l.pace > 0 {
					time.Sleep(l.pace)
				}
			case <-stopped:
				break feed
			case <-ctx.Done():
				break feed
			}
		}
		txn.Commit(tx.end)
	}
	close(in)
	err = <-done
	l.confirmed = tr.Acked()
	if err != nil {
		l.errs = append(l.errs, err)
		l.t.Logf("session %d ended: %v (confirmed %d of %d)", l.sessions, err, l.confirmed, l.last())
	}
	return err
}

// run runs sessions until everything is confirmed, at most max of them, a
// short pause between two (the relay backs off longer).
func (l *line) run(ctx context.Context, max int) {
	l.t.Helper()
	for l.confirmed < l.last() {
		if l.sessions >= max {
			l.t.Fatalf("not everything confirmed after %d sessions: %d of %d; errors: %v", l.sessions, l.confirmed, l.last(), l.errs)
		}
		if err := l.session(ctx); err != nil && fatal.Is(err) {
			l.t.Fatalf("fatal error: %v", err)
		}
		if ctx.Err() != nil {
			l.t.Fatalf("timed out: confirmed %d of %d after %d sessions; errors: %v", l.confirmed, l.last(), l.sessions, l.errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logBuffer keeps a test's log lines and passes them to t.Log.
type logBuffer struct {
	t  testing.TB
	mu sync.Mutex
	b  bytes.Buffer
}

func newLogBuffer(t testing.TB) *logBuffer { return &logBuffer{t: t} }

func (lb *logBuffer) Write(p []byte) (int, error) {
	lb.mu.Lock()
	lb.b.Write(p)
	lb.mu.Unlock()
	lb.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (lb *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func (lb *logBuffer) String() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.b.String()
}

// fakeKafka starts an in-process Kafka cluster.
func fakeKafka(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, strings.Join(c.ListenAddrs(), ",")
}

// batchHolds returns a fault filter: whether a produce request carries,
// for topic (which must exist), a record batch holding marker (the records
// are sent uncompressed by the tests). Only the topic's batches count: a
// request also carrying the marker for another topic (a dead letter of the
// marked event) is not the topic's refusal.
func batchHolds(t testing.TB, brokers, topic string, markers ...string) func(kmsg.Request) bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err == nil {
		err = details[topic].Err
	}
	if err != nil {
		t.Fatalf("look up topic %s: %v", topic, err)
	}
	id := details[topic].ID
	return func(req kmsg.Request) bool {
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return false
		}
		for _, pt := range pr.Topics {
			if pt.Topic != topic && pt.TopicID != id {
				continue
			}
			for _, p := range pt.Partitions {
				for _, m := range markers {
					if bytes.Contains(p.Records, []byte(m)) {
						return true
					}
				}
			}
		}
		return false
	}
}

// eventRow is an outbox row whose event id is in the column idCol.
func eventRow(idCol, id, aggType, aggID, payload string, lsn, commit uint64) *route.Row {
	idc := route.Column{Name: idCol, Type: route.OIDText, Value: []byte(id)}
	if id == "" {
		idc.Null = true
		idc.Value = nil
	}
	return &route.Row{
		Source: route.Source{LSN: lsn, CommitLSN: commit, CommitTime: time.Now(), Table: "public.outbox"},
		Columns: []route.Column{
			idc,
			{Name: "aggregatetype", Type: route.OIDText, Value: []byte(aggType)},
			{Name: "aggregateid", Type: route.OIDText, Value: []byte(aggID)},
			{Name: "type", Type: route.OIDText, Value: []byte("T")},
			{Name: "payload", Type: route.OIDJSONB, Value: []byte(payload)},
		},
	}
}
