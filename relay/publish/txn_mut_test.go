package publish

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	faultstep "github.com/pgoutbox/pgoutbox/relay/fault"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

// Unit tests of txn.go, against kfake: when a Kafka transaction commits,
// what a failed step leaves acked (nothing it did not commit), what a
// refused record becomes, and that no transaction is left open.

// txnFixture is a kfake cluster with an event topic and a DLQ topic.
type txnFixture struct {
	c              *kfake.Cluster
	brokers        string
	aggType, topic string
	dlq            string
}

func newTxnFixture(t *testing.T, name string) *txnFixture {
	s := uniq()
	f := &txnFixture{aggType: name + s, dlq: "dlq" + s}
	f.topic = "outbox.event." + f.aggType
	f.c, f.brokers = fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, f.topic, f.dlq))
	return f
}

// row is event i of the fixture's topic, at LSN 100i-10, ending 100i.
func (f *txnFixture) row(i int, payload string) *route.Row {
	if payload == "" {
		payload = fmt.Sprintf(`{"n": %d}`, i)
	}
	return eventRow("id", fmt.Sprintf("e%d", i), f.aggType, "a", payload, uint64(100*i-10), uint64(100*i))
}

// TestTxnMaxRecords: a transaction commits once it holds TxnMaxRecords
// records, not one more (bounded memory: its records are kept until it
// commits), even while the stream keeps handing events over; and not
// before, while more are waiting (no linger yet, TxnInterval far off).
func TestTxnMaxRecords(t *testing.T) {
	f := newTxnFixture(t, "maxrec")
	var sizes []int
	var m *session
	cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnMaxRecords: 3, TxnInterval: time.Minute,
		Faults: func(s faultstep.Step) error {
			if s == faultstep.BeforeKafkaCommit {
				sizes = append(sizes, len(m.p.txn.recs))
			}
			return nil
		}}
	// A channel large enough that 31 waiting events are not load.
	m = newSession(t, f.brokers, cfg, sessionOpts{inCap: 64})
	for i := 1; i <= 31; i++ {
		m.send(uint64(100*i), f.row(i, ""))
	}
	m.start()
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if want := "[3 3 3 3 3 3 3 3 3 3 1]"; fmt.Sprint(sizes) != want {
		t.Errorf("transactions of %v records; want %s", sizes, want)
	}
	if m.tr.Acked() != 3100 || len(committed(t, f.brokers, f.topic)) != 31 {
		t.Errorf("acked %d; want 3100, all 31 committed", m.tr.Acked())
	}
}

// TestTxnCommitsAtOnceUnderLightLoad: with nothing more waiting after a
// record, its transaction commits at once, not after TxnInterval, and
// even when the commits are slow: a trickle has nothing to batch.
func TestTxnCommitsAtOnceUnderLightLoad(t *testing.T) {
	f := newTxnFixture(t, "light")
	var m *session
	var open []time.Duration // how long each transaction was open at its commit
	cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnInterval: time.Minute,
		Faults: func(s faultstep.Step) error {
			if s == faultstep.BeforeKafkaCommit {
				open = append(open, time.Since(m.p.txn.started))
				time.Sleep(100 * time.Millisecond) // a slow commit: 4x is a linger of 400 ms
			}
			return nil
		}}
	m = newSession(t, f.brokers, cfg, sessionOpts{}).start()
	for i := 1; i <= 3; i++ {
		m.send(uint64(100*i), f.row(i, ""))
		if !m.waitAcked(uint64(100*i), 5*time.Second) {
			t.Fatalf("event %d not acked within 5 s (TxnInterval is a minute)", i)
		}
	}
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	for i, d := range open {
		if d > 300*time.Millisecond {
			t.Errorf("transaction %d open %v before its commit; want it committed at once", i+1, d)
		}
	}
}

// TestTxnLingersUnderLoad: events waiting after a commit mean load; the
// next transaction then stays open four times as long as that commit
// took (at most TxnInterval) before it commits by its timer, or as the
// stream ends. A commit that fails on either path ends the session with
// the error, its records not acked, and no Kafka transaction left open.
// The stream ending inside a PostgreSQL transaction (its commit not read)
// aborts the open Kafka transaction holding its records, even when they
// are all it holds: the next session reads that transaction again whole.
func TestTxnLingersUnderLoad(t *testing.T) {
	for _, end := range []string{"timer", "stream closed", "stream closed inside a transaction"} {
		t.Run(end, func(t *testing.T) {
			f := newTxnFixture(t, "linger")
			var m *session
			commits := 0
			var lingered, linger, lastCommit time.Duration
			injected := errors.New("injected")
			cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnInterval: 3 * time.Second,
				Faults: func(s faultstep.Step) error {
					if s != faultstep.BeforeKafkaCommit {
						return nil
					}
					commits++
					if commits == 1 {
						// A slow commit, during which the next event comes.
						time.Sleep(100 * time.Millisecond)
						switch end {
						case "timer":
							m.send(200, f.row(2, ""))
						case "stream closed":
							m.send(200, f.row(2, ""))
							close(m.in)
						default: // its commit never comes
							txn := m.tr.Begin(200)
							txn.Add()
							m.in <- wal.Event{Txn: txn, Row: f.row(2, "")}
							close(m.in)
						}
						return nil
					}
					lingered, linger, lastCommit = time.Since(m.p.txn.started), m.p.txn.linger, m.p.txn.lastCommit
					return injected
				}}
			// One event waiting is load for a channel of 2.
			m = newSession(t, f.brokers, cfg, sessionOpts{inCap: 2})
			m.send(100, f.row(1, ""))
			m.start()
			err := m.wait(10 * time.Second)
			if end == "stream closed inside a transaction" {
				aborts := metricValue(t, m.m.Registry, "outbox_connector_kafka_transactions_total", map[string]string{"result": "abort"})
				if err != nil || commits != 1 || m.tr.Acked() != 100 || aborts != 1 {
					t.Errorf("Run: %v after %d commits, %v aborts, acked %d; want nil after 1 commit and 1 abort, acked 100", err, commits, aborts, m.tr.Acked())
				}
				if got := ids(committed(t, f.brokers, f.topic)); fmt.Sprint(got) != "[e1]" {
					t.Errorf("%s holds %v; want [e1]: e2's transaction was not read to its commit", f.topic, got)
				}
				return
			}
			if !errors.Is(err, injected) || !faultstep.Is(err) || !m.fatal.Load() {
				t.Fatalf("Run: %v (onFatal %v); want the injected commit failure", err, m.fatal.Load())
			}
			if commits != 2 {
				t.Fatalf("%d commits; want 2", commits)
			}
			if m.tr.Acked() != 100 {
				t.Errorf("acked %d; want 100: only the first transaction committed", m.tr.Acked())
			}
			if lastCommit < 100*time.Millisecond || linger != 4*lastCommit {
				t.Errorf("linger %v after a commit of %v; want four times it", linger, lastCommit)
			}
			switch end {
			case "timer":
				if lingered < linger || lingered > 2500*time.Millisecond {
					t.Errorf("the loaded transaction committed after %v open; want its linger, %v, not TxnInterval", lingered, linger)
				}
			case "stream closed":
				if lingered >= linger {
					t.Errorf("the transaction committed after %v open, its linger %v; want at once as the stream closed", lingered, linger)
				}
			}
			if got := ids(committed(t, f.brokers, f.topic)); fmt.Sprint(got) != "[e1]" {
				t.Errorf("%s holds %v; want [e1]", f.topic, got)
			}
		})
	}
}

// TestTxnCommitStepFails: a failure just before the Kafka commit, or just
// after it, ends the session with that failure, acks nothing of the
// transaction (after the commit: its records are read again, duplicates),
// and leaves no transaction open; a failed final commit, as the stream
// ends, is returned too. Only real aborts are counted.
func TestTxnCommitStepFails(t *testing.T) {
	for _, step := range []faultstep.Step{faultstep.BeforeKafkaCommit, faultstep.AfterKafkaCommit} {
		t.Run(string(step), func(t *testing.T) {
			f := newTxnFixture(t, "step")
			injected := errors.New("injected")
			cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnInterval: time.Minute,
				Faults: func(s faultstep.Step) error {
					if s == step {
						return injected
					}
					return nil
				}}
			m := newSession(t, f.brokers, cfg, sessionOpts{}).start()
			m.send(100, f.row(1, ""))
			err := m.wait(10 * time.Second)
			if !errors.Is(err, injected) || !m.fatal.Load() {
				t.Fatalf("Run: %v; want the injected failure", err)
			}
			if m.tr.Acked() != 0 {
				t.Errorf("acked %d after a failure at %s", m.tr.Acked(), step)
			}
			got := ids(committed(t, f.brokers, f.topic))
			aborts := metricValue(t, m.m.Registry, "outbox_connector_kafka_transactions_total", map[string]string{"result": "abort"})
			if step == faultstep.BeforeKafkaCommit {
				if len(got) != 0 || aborts != 1 {
					t.Errorf("%s holds %v, %v aborts counted; want nothing committed, one abort", f.topic, got, aborts)
				}
			} else if fmt.Sprint(got) != "[e1]" {
				// (abort() counts an abort here too, of a transaction
				// that committed: EndTransaction answers nil when none is
				// open. Only this test-only step gets there.)
				t.Errorf("%s holds %v (%v aborts counted); want e1 committed", f.topic, got, aborts)
			}
		})
	}
	// Kafka refusing the commit itself (EndTxn): nothing acked, and the
	// session ends saying why: the lease lost for a fenced producer, a
	// fatal.Error naming the setting for refused access, an error to read
	// again after for the rest.
	for _, tc := range []struct {
		ferr  *kerr.Error
		check func(error) bool
	}{
		{kerr.InvalidTxnState, func(err error) bool { return !fatal.Is(err) && !errors.Is(err, ErrFenced) }},
		{kerr.ProducerFenced, func(err error) bool { return errors.Is(err, ErrFenced) }},
		{kerr.TransactionalIDAuthorizationFailed, func(err error) bool {
			return fatal.Is(err) && strings.Contains(err.Error(), "OUTBOX_KAFKA_TRANSACTIONAL")
		}},
	} {
		t.Run("EndTxn "+tc.ferr.Message, func(t *testing.T) {
			f := newTxnFixture(t, "endtxn")
			f.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: tc.ferr, Count: -1})
			m := newSession(t, f.brokers, Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnInterval: time.Minute}, sessionOpts{}).start()
			m.send(100, f.row(1, ""))
			err := m.wait(3 * time.Second)
			if !errors.Is(err, tc.ferr) || !tc.check(err) || !m.fatal.Load() {
				t.Errorf("Run: %v (onFatal %v)", err, m.fatal.Load())
			}
			if m.tr.Acked() != 0 {
				t.Errorf("acked %d of a transaction Kafka did not commit", m.tr.Acked())
			}
		})
	}
	t.Run("nothing open", func(t *testing.T) {
		f := newTxnFixture(t, "none")
		// The lease is lost before the first record: nothing to abort.
		cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, Valid: func() bool { return false }}
		m := newSession(t, f.brokers, cfg, sessionOpts{}).start()
		m.send(100, f.row(1, ""))
		if err := m.wait(10 * time.Second); !errors.Is(err, ErrFenced) {
			t.Fatalf("Run: %v; want ErrFenced", err)
		}
		if n := metricValue(t, m.m.Registry, "outbox_connector_kafka_transactions_total", map[string]string{"result": "abort"}); n > 0 {
			t.Errorf("%v aborts counted with no transaction open", n)
		}
	})
}

// TestTxnRefusedRecord: a record Kafka refuses in a transaction (with its
// batch) aborts it: nothing of it is acked or committed, the session ends
// saying why, and every record of the batch is a suspect, the refused one
// (first in its transaction) among them. Read again, each suspect is
// produced alone: the guilty one is dead-lettered (the DLQ topic, class
// kafka-refused), the innocent ones are published, in order. A record
// produced after a failure into the doomed transaction is never committed
// with it.
func TestTxnRefusedRecord(t *testing.T) {
	f := newTxnFixture(t, "refused")
	mark := "bad-" + f.aggType
	f.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: f.topic, Err: kerr.PolicyViolation, Count: -1,
		When: batchHolds(t, f.brokers, f.topic, mark)})
	poison := &Poison{}
	var m *session
	cfg := Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true, TxnInterval: time.Minute, Poison: poison,
		// The second record is produced once the first one's failure is
		// known: into a transaction that can no longer commit.
		Headers: func() []kgo.RecordHeader {
			for deadline := time.Now().Add(5 * time.Second); m.p.txn.open && !m.p.txn.bad.Load() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			return nil
		}}
	rows := []*route.Row{f.row(1, `{"n": 1, "m": "`+mark+`"}`), f.row(2, ""), f.row(3, "")}
	m = newSession(t, f.brokers, cfg, sessionOpts{})
	for i, r := range rows {
		m.send(uint64(100*(i+1)), r)
	}
	m.start()
	err := m.close()
	var rf *refusedError
	if !errors.As(err, &rf) || !errors.Is(err, kerr.PolicyViolation) {
		t.Fatalf("Run: %v; want the refusal", err)
	}
	if m.tr.Acked() != 0 {
		t.Errorf("acked %d of a refused transaction", m.tr.Acked())
	}
	if n := metricValue(t, m.m.Registry, "outbox_connector_kafka_transactions_total", map[string]string{"result": "abort"}); n != 1 {
		t.Errorf("%v aborts counted; want 1", n)
	}
	if got := committed(t, f.brokers, f.topic); len(got) != 0 {
		t.Errorf("%s holds %v after the abort", f.topic, ids(got))
	}
	idp := New(Config{}, nil, nil, nil, nil, nil)
	if v, ok := poison.lookup(f.topic, idp.identify(rows[0])); !ok || v.guilty {
		t.Fatalf("the refused record: %+v, %v; want a suspect", v, ok)
	}

	// The next sessions: the suspects alone.
	r := newRig(t, f.brokers, cfg, sessionOpts{})
	r.cfg.Headers = nil
	for i, row := range rows {
		r.add(uint64(100*(i+1)), row)
	}
	r.run(4)
	if got := ids(committed(t, f.brokers, f.topic)); fmt.Sprint(got) != "[e2 e3]" {
		t.Errorf("%s holds %v; want [e2 e3]", f.topic, got)
	}
	dls := committed(t, f.brokers, f.dlq)
	if fmt.Sprint(ids(dls)) != "[e1]" || testenv.Header(dls[0], "error.class") != string(ClassRefused) {
		t.Errorf("dead letters %v; want e1 as %s", ids(dls), ClassRefused)
	}
	if v, ok := poison.lookup(f.topic, idp.identify(rows[0])); !ok || !v.guilty {
		t.Errorf("the refused record: %+v, %v; want guilty", v, ok)
	}
	if n := poison.n.Load(); n != 1 {
		t.Errorf("%d records remembered; want the guilty one only (the innocent acquitted)", n)
	}
}

// TestTxnDeploymentFaults: Kafka refusing a transaction's records for the
// deployment's sake stops the line, saying so: TOPIC_AUTHORIZATION_FAILED
// is fatal and names the topic to grant; a fenced producer (a newer one
// took the transactional id) has lost the lease. Nothing is acked or
// dead-lettered for either.
func TestTxnDeploymentFaults(t *testing.T) {
	for _, tc := range []struct {
		ferr  *kerr.Error
		check func(error) bool
	}{
		{kerr.TopicAuthorizationFailed, func(err error) bool { var fe *fatal.Error; return errors.As(err, &fe) }},
		{kerr.InvalidProducerEpoch, func(err error) bool { return errors.Is(err, ErrFenced) }},
	} {
		t.Run(tc.ferr.Message, func(t *testing.T) {
			f := newTxnFixture(t, "deploy")
			f.c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: f.topic, Err: tc.ferr, Count: -1})
			m := newSession(t, f.brokers, Config{DLQTopic: f.dlq, TopicCreate: true, Transactional: true}, sessionOpts{db: newFakeDeadLetters()}).start()
			m.send(100, f.row(1, ""))
			err := m.close()
			if !tc.check(err) || !errors.Is(err, tc.ferr) {
				t.Fatalf("Run: %v", err)
			}
			if tc.ferr == kerr.TopicAuthorizationFailed && !strings.Contains(err.Error(), fmt.Sprintf("%q", f.topic)) {
				t.Errorf("the fatal error does not name the topic %s: %v", f.topic, err)
			}
			if m.tr.Acked() != 0 || len(committed(t, f.brokers, f.dlq)) != 0 {
				t.Errorf("acked %d, or dead-lettered", m.tr.Acked())
			}
		})
	}
}

// TestTxnBeginFenced: a client whose producer id Kafka fenced (a newer
// producer took the transactional id) cannot begin a transaction: that is
// the lease lost (ErrFenced), not a passing error to read again after.
func TestTxnBeginFenced(t *testing.T) {
	f := newTxnFixture(t, "begin")
	f.c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		resp := req.(*kmsg.InitProducerIDRequest).ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.ProducerFenced.Code
		return resp, nil, true
	})
	m := newSession(t, f.brokers, Config{DLQTopic: f.dlq, Transactional: true}, sessionOpts{}).start()
	m.send(100, f.row(1, ""))
	err := m.close()
	if !errors.Is(err, ErrFenced) || !errors.Is(err, kerr.ProducerFenced) || !strings.Contains(err.Error(), "begin a Kafka transaction") {
		t.Errorf("Run: %v; want ErrFenced as the transaction began", err)
	}
	if m.tr.Acked() != 0 {
		t.Errorf("acked %d", m.tr.Acked())
	}
}
