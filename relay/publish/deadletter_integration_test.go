package publish

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/tracker"
	"github.com/pgoutbox/pgoutbox/relay/wal"
	"github.com/pgoutbox/pgoutbox/route"
)

func deadLetterPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	pool, err := pgxpool.New(context.Background(), pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// deadLetters returns outbox_dead_letter's rows as "id payload", sorted.
func deadLetters(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, coalesce(payload, '') FROM public.outbox_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, payload string
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, id+" "+payload)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestDeadLetterTableIDs: with table.field.event.id naming another column
// than id, every event that goes to outbox_dead_letter is stored under its
// own event id, and events without one (a null id) under an id of their
// own from their place in the WAL, so that two snapshot rows (LSN 0) or two
// rows of one COPY (one LSN) are both kept; a repeat of a stored event
// (read again after a restart) adds nothing and is acked; a different event
// reusing a stored event id is kept under a suffixed id. Every event is
// acked (done for the tracker) only once its row is in the table.
func TestDeadLetterTableIDs(t *testing.T) {
	pool := deadLetterPool(t)
	rcfg := route.DefaultConfig()
	rcfg.FieldEventID = "event_id"
	router, err := route.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	// Every record is over the limit: each event goes to the table.
	newProducer := func() *Producer {
		return New(Config{MaxMessageBytes: 10}, nil, router, pool, slog.New(slog.NewTextHandler(testWriter{t}, nil)), metrics.New())
	}
	ctx := context.Background()
	tr := tracker.New(0)
	send := func(p *Producer, end uint64, rows ...*route.Row) {
		t.Helper()
		txn := tr.Begin(end)
		for _, row := range rows {
			txn.Add()
			if err := p.handle(ctx, wal.Event{Txn: txn, Row: row}); err != nil {
				t.Fatal(err)
			}
		}
		txn.Commit(end)
		if got := tr.Acked(); got != end {
			t.Fatalf("acked %d after the dead letters of the transaction ending at %d; want %d", got, end, end)
		}
	}
	p := newProducer()
	// One COPY: two rows at one LSN, without event ids.
	send(p, 900, eventRow("event_id", "", "dl", "a", `{"copy": 1}`, 500, 900), eventRow("event_id", "", "dl", "a", `{"copy": 2}`, 500, 900))
	// A snapshot: every row has LSN 0.
	snap := []*route.Row{eventRow("event_id", "e1", "dl", "a", `{"snap": 1}`, 0, 1000), eventRow("event_id", "e2", "dl", "a", `{"snap": 2}`, 0, 1000)}
	send(p, 1000, snap...)
	want := []string{
		`e1 {"snap": 1}`, `e2 {"snap": 2}`,
		`lsn:0/384:0/1F4:0 {"copy": 1}`, `lsn:0/384:0/1F4:1 {"copy": 2}`,
	}
	if got := deadLetters(t, pool); !slices.Equal(got, want) {
		t.Fatalf("outbox_dead_letter holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A new session reads the snapshot again: nothing new is stored.
	tr = tracker.New(0)
	send(newProducer(), 1000, snap...)
	if got := deadLetters(t, pool); !slices.Equal(got, want) {
		t.Fatalf("after the snapshot was read again, outbox_dead_letter holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Another event with the id e1: kept too, under e1#2.
	send(p, 2000, eventRow("event_id", "e1", "dl", "a", `{"other": 1}`, 1500, 2000))
	want = append(want, `e1#2 {"other": 1}`)
	slices.Sort(want)
	if got := deadLetters(t, pool); !slices.Equal(got, want) {
		t.Fatalf("after an event reused the id e1, outbox_dead_letter holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Every suffixed variant of e1 taken by other events: the next event
	// with the id e1 is kept under the id and its place in the WAL, not
	// retried forever.
	if _, err := pool.Exec(ctx, `INSERT INTO public.outbox_dead_letter (id, row_data, error, error_class)
		SELECT 'e1#' || n, '{}', 'filler', 'test' FROM generate_series(3, $1::int) AS n`, maxDeadLetterIDs); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(p, 3000, eventRow("event_id", "e1", "dl", "a", `{"other": 2}`, 2500, 3000))
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the dead letter of an event whose id and every variant of it are taken was not stored within 30 s")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM public.outbox_dead_letter WHERE id = 'e1@lsn:0/BB8:0/9C4:0' AND payload = '{"other": 2}'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the event is not stored under its id and place in the WAL (%d rows, %v); table:\n%s", n, err, strings.Join(deadLetters(t, pool), "\n"))
	}
}

// TestPoisonedSnapshotRowAlone: a snapshot row that Kafka refuses (here
// INVALID_RECORD for any batch holding it) is dead-lettered; the other rows
// of the snapshot, which share its LSN (0) and, with table.field.event.id
// naming another column, have no column id, are published and not
// dead-lettered.
func TestPoisonedSnapshotRowAlone(t *testing.T) {
	pool := deadLetterPool(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	c, brokers := fakeKafka(t, kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event.snap"+suffix))
	aggType, dlq := "snap"+suffix, "dlq"+suffix
	topic := "outbox.event." + aggType
	rcfg := route.DefaultConfig()
	rcfg.FieldEventID = "event_id"
	l := newLine(t, brokers, Config{DLQTopic: dlq, Transactional: true, TxnMaxRecords: 1}, rcfg)
	l.pool = pool
	var rows []*route.Row
	var good []testenv.Event
	for i := range 5 {
		id := fmt.Sprintf("ev-%s-%d", suffix, i)
		rows = append(rows, eventRow("event_id", id, aggType, "a1", fmt.Sprintf(`{"n": %d, "mark": "row-%d"}`, i, i), 0, 1000))
		if i != 2 {
			good = append(good, testenv.Event{ID: id})
		}
	}
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.InvalidRecord, Count: -1,
		When: batchHolds(t, brokers, topic, `"mark": "row-2"`)})
	l.add(1000, rows...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l.run(ctx, 10)

	cons := testenv.StartConsumer(t, brokers, topic)
	cons.WaitFor(t, good, 30*time.Second)
	badID := fmt.Sprintf("ev-%s-2", suffix)
	var stored []string
	for _, s := range deadLetters(t, pool) {
		stored = append(stored, strings.Fields(s)[0])
	}
	n, err := testenv.CommittedRecords(ctx, brokers, dlq)
	if err != nil {
		t.Fatal(err)
	}
	dc := testenv.StartConsumer(t, brokers, dlq)
	for dc.Count() < int(n) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range dc.Records() {
		stored = append(stored, testenv.Header(r, "id"))
	}
	if !slices.Equal(stored, []string{badID}) {
		t.Errorf("dead letters (table, then DLQ topic): %v; want only the refused row %s", stored, badID)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
