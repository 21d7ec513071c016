package publish

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/fatal"
	"github.com/pgoutbox/pgoutbox/route"
)

// faultAt places the bad event of a fault test: the row at in the WAL
// transaction tx (0 to 5), at 0 to 2.
type faultAt struct{ tx, at int }

// faultEvents are the events of one fault test: 6 WAL transactions of 4
// rows over 4 aggregates, the bad one (its payload carries mark) where f
// says, followed by a large one of the same aggregate (over half of
// OUTBOX_KAFKA_MAX_MESSAGE_BYTES) that Kafka fails with it.
func faultEvents(l *line, aggType, mark string, f faultAt) (good []testenv.Event, bad testenv.Event) {
	seq := map[string]int{}
	lsn := uint64(1000)
	for tx := range 6 {
		var rows []*route.Row
		for i := range 4 {
			agg := fmt.Sprintf("k%d", (tx+i)%4)
			if tx == f.tx && i == f.at+1 {
				agg = fmt.Sprintf("k%d", (tx+f.at)%4) // the bad event's aggregate
			}
			seq[agg]++
			ev := testenv.Event{ID: fmt.Sprintf("%s-%d-%d", aggType, tx, i), AggType: aggType, AggID: agg, Seq: seq[agg]}
			switch {
			case tx == f.tx && i == f.at:
				ev.Payload = fmt.Sprintf(`{"seq": %d, "mark": "%s"}`, ev.Seq, mark)
				bad = ev
			case tx == f.tx && i == f.at+1:
				ev.Payload = fmt.Sprintf(`{"seq": %d, "pad": "%s"}`, ev.Seq, strings.Repeat("p", 600<<10))
				good = append(good, ev)
			default:
				ev.Payload = fmt.Sprintf(`{"seq": %d}`, ev.Seq)
				good = append(good, ev)
			}
			lsn += 10
			rows = append(rows, eventRow("id", ev.ID, aggType, agg, ev.Payload, lsn, 0))
		}
		lsn += 10
		for _, r := range rows {
			r.Source.CommitLSN = lsn
		}
		l.add(lsn, rows...)
	}
	return good, bad
}

// TestBrokerFaultMatrix: per class of produce error, in both modes, the
// record Kafka refuses ends where it belongs, and its neighbours are
// published, in order per aggregate (first deliveries), never dead-lettered:
//   - retriable (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT), for a second:
//     retried with a backoff (a bounded number of produce requests in that
//     second), then published; nothing dead-lettered;
//   - refused for its own account (INVALID_TIMESTAMP, INVALID_RECORD,
//     POLICY_VIOLATION, MESSAGE_TOO_LARGE), every time: dead-lettered whole
//     with the broker's error (to the DLQ topic; to outbox_dead_letter when
//     too large), the other records of its batch, a large one among them,
//     published;
//   - the deployment's (TOPIC_AUTHORIZATION_FAILED): a fatal stop, nothing
//     dead-lettered and nothing confirmed past it.
//
// make test runs each case once, the bad event in the fourth transaction;
// make soak (OUTBOX_SOAK=1) 20 times, wherever it falls.
func TestBrokerFaultMatrix(t *testing.T) {
	pool := deadLetterPool(t)
	rounds := 1
	if os.Getenv("OUTBOX_SOAK") == "1" {
		rounds = 20
	}
	for _, mode := range []string{"transactional", "idempotent"} {
		for _, tc := range []struct {
			err  *kerr.Error
			kind string // retry, record, fatal
		}{
			{kerr.NotLeaderForPartition, "retry"},
			{kerr.RequestTimedOut, "retry"},
			{kerr.InvalidTimestamp, "record"},
			{kerr.InvalidRecord, "record"},
			{kerr.PolicyViolation, "record"},
			{kerr.MessageTooLarge, "record"},
			{kerr.TopicAuthorizationFailed, "fatal"},
		} {
			t.Run(mode+"/"+tc.err.Message, func(t *testing.T) {
				for round := range rounds {
					f := faultAt{3, 1}
					if round > 0 {
						f = faultAt{rand.IntN(6), rand.IntN(3)}
					}
					if _, err := pool.Exec(context.Background(), `DELETE FROM public.outbox_dead_letter`); err != nil {
						t.Fatal(err)
					}
					brokerFault(t, pool, mode == "transactional", tc.err, tc.kind, f)
					if t.Failed() {
						t.Fatalf("round %d, bad event at %+v", round, f)
					}
				}
			})
		}
	}
}

func brokerFault(t *testing.T, pool *pgxpool.Pool, transactional bool, ferr *kerr.Error, kind string, f faultAt) {
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	aggType, dlq := "fault"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic), kfake.SeedTopics(1, dlq))
	l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: transactional, TopicPartitions: 2}, route.DefaultConfig())
	l.pool = pool
	if transactional {
		l.opts = append(l.opts, TxnRetryOpts()...)
	}
	mark := "bad-" + suffix
	good, bad := faultEvents(l, aggType, mark, f)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: ferr, Count: -1,
		When: batchHolds(t, brokers, topic, mark)})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	switch kind {
	case "fatal":
		err := l.session(ctx)
		if !fatal.Is(err) {
			t.Fatalf("session ended with %v; want a fatal error", err)
		}
		if l.confirmed >= l.txns[f.tx].end {
			t.Errorf("confirmed %d, at or past the refused record's transaction (%d)", l.confirmed, l.txns[f.tx].end)
		}
		t.Logf("stopped: %v", err)
		assertDeadLetters(t, pool, brokers, dlq, nil, "")
		return
	case "retry":
		// The error holds for a second after it is first met.
		hits := make(chan int, 1)
		go func() {
			if err := h.Wait(ctx, 1); err != nil {
				hits <- -1
				return
			}
			time.Sleep(time.Second)
			n := h.Hits()
			h.Remove()
			hits <- n
		}()
		l.run(ctx, 3)
		n := <-hits
		// franz-go retries after its retry backoff, but counts failures
		// per request and clears the count whenever a request is
		// answered, as these are (the error is per partition): its
		// default backoff stays at 250 ms; the relay's for a
		// transactional client counts on until a batch is written
		// (TxnRetryOpts), 10 ms growing to 1 s. A loop without a delay
		// would make thousands.
		bound := 25
		t.Logf("%d produce requests answered %s in one second", n, ferr.Message)
		if n < 1 || n > bound {
			t.Errorf("%d produce requests answered %s in one second; want at least 1 and a backoff (at most %d)", n, ferr.Message, bound)
		}
		good = append(good, bad)
		assertDeadLetters(t, pool, brokers, dlq, nil, "")
	case "record":
		l.run(ctx, 10)
		assertDeadLetters(t, pool, brokers, dlq, &bad, ferr.Message)
		verdict := func(v string) float64 {
			return max(0, metricValue(t, l.m.Registry, "outbox_connector_kafka_refused_records_total", map[string]string{"topic": topic, "verdict": v}))
		}
		// Its batch may have held it alone (the first record, say).
		if g, i, s := verdict("guilty"), verdict("innocent"), verdict("suspect"); g != 1 || s != g+i {
			t.Errorf("refused records: %v suspects, %v innocent, %v guilty; want 1 guilty, the rest of its batch innocent", s, i, g)
		} else {
			t.Logf("refused records: %v suspects, %v innocent, %v guilty", s, i, g)
		}
	}
	cons := testenv.StartConsumer(t, brokers, topic)
	cons.WaitFor(t, good, 20*time.Second)
	dups := cons.Verify(t, good)
	for _, r := range cons.Records() {
		if testenv.Header(r, "id") == bad.ID && kind == "record" {
			t.Errorf("the refused record reached its topic")
		}
	}
	t.Logf("%d sessions, %d duplicates", l.sessions, dups)
}

// assertDeadLetters checks that the dead letters (the table and the DLQ
// topic) hold exactly bad (none if nil), whole, with an error naming why.
func assertDeadLetters(t *testing.T, pool *pgxpool.Pool, brokers, dlq string, bad *testenv.Event, why string) {
	t.Helper()
	var got []string
	rows, err := pool.Query(context.Background(), `SELECT id, coalesce(payload, ''), error FROM public.outbox_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, payload, msg string
		if err := rows.Scan(&id, &payload, &msg); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
		if bad != nil && id == bad.ID && (payload != bad.Payload || !strings.Contains(msg, why)) {
			t.Errorf("outbox_dead_letter row %s: payload %q, error %q; want the payload whole and an error naming %s", id, payload, msg, why)
		}
	}
	rows.Close()
	// Everything committed to the DLQ topic by now, read whole.
	n, err := testenv.CommittedRecords(context.Background(), brokers, dlq)
	if err != nil {
		t.Fatal(err)
	}
	dc := testenv.StartConsumer(t, brokers, dlq)
	for deadline := time.Now().Add(20 * time.Second); dc.Count() < int(n); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("read %d of the %d records of %s within 20s", dc.Count(), n, dlq)
		}
	}
	for _, r := range dc.Records() {
		id := testenv.Header(r, "id")
		got = append(got, id)
		if bad != nil && id == bad.ID {
			if msg := testenv.Header(r, "error"); !strings.Contains(msg, why) {
				t.Errorf("DLQ record %s: error %q; want it to name %s", id, msg, why)
			}
			if v := string(r.Value); !strings.Contains(v, fmt.Sprintf(`"aggregateid":"%s"`, bad.AggID)) || !strings.Contains(v, strings.ReplaceAll(bad.Payload, `"`, `\"`)) {
				t.Errorf("DLQ record %s does not hold the row whole: %s", id, v)
			}
		}
	}
	want := []string{}
	if bad != nil {
		want = []string{bad.ID}
	}
	// A dead letter may be stored twice (a session that stops after it and
	// before its position is confirmed): at least once, like any event.
	distinct := slices.Compact(slices.Sorted(slices.Values(got)))
	if fmt.Sprint(distinct) != fmt.Sprint(want) {
		t.Errorf("dead letters %v; want %v", got, want)
	} else if len(got) > len(distinct) {
		t.Logf("dead letters %v: stored more than once", got)
	}
}
