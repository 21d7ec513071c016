package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestPollCompetingKill9: three poll-mode connectors (OUTBOX_SOURCE=poll)
// share one outbox while 8 writers commit transactions that interleave,
// sometimes run for seconds and sometimes roll back, each writer holding
// its aggregates' row locks as applications do; one connector is killed
// with kill -9 and started again, at least 10 times. Every committed event
// arrives, none of a rolled-back transaction, each aggregate's first
// deliveries are in its write order; duplicates (only around kills) are
// counted.
func TestPollCompetingKill9(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	if err := pg.Psql("outbox", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll.sql"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	const aggs = 40
	if _, err := conn.Exec(ctx, `CREATE TABLE agg_state (id text PRIMARY KEY, seq int NOT NULL DEFAULT 0);
		INSERT INTO agg_state SELECT 'agg-' || g FROM generate_series(0, 39) g`); err != nil {
		t.Fatal(err)
	}
	aggType := fmt.Sprintf("compete%d", time.Now().UnixNano()%1e9)
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)

	bin := testenv.Binary(t, "connector")
	env := connectorEnv(pg, brokers, "OUTBOX_SOURCE", "poll", "OUTBOX_POLL_INTERVAL", "50ms", "OUTBOX_SHUTDOWN_TIMEOUT", "5s")
	procs := make([]*testenv.Proc, 3)
	for i := range procs {
		procs[i] = testenv.StartProc(t, bin, env)
	}
	for _, p := range procs {
		waitOutput(t, p, "poll mode: reading", 60*time.Second)
	}

	// The writers.
	var mu sync.Mutex
	var committed []testenv.Event
	var rolledBack []string
	stop := make(chan struct{})
	var writers sync.WaitGroup
	var writeErrs sync.Map
	for w := range 8 {
		writers.Go(func() {
			wc, err := pgx.Connect(ctx, pg.DSN("outbox"))
			if err != nil {
				writeErrs.Store(w, err)
				return
			}
			defer wc.Close(ctx)
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				default:
				}
				evs, rollback, err := writePollTx(ctx, wc, rng, aggType, aggs)
				if err != nil {
					writeErrs.Store(w, err)
					return
				}
				mu.Lock()
				if rollback {
					for _, e := range evs {
						rolledBack = append(rolledBack, e.ID)
					}
				} else {
					committed = append(committed, evs...)
				}
				mu.Unlock()
			}
		})
	}

	// The kills: one instance at a time, started again at once.
	kills := 0
	deadline := time.Now().Add(40 * time.Second)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for kills < 12 || time.Now().Before(deadline) {
		time.Sleep(time.Duration(1500+rng.IntN(1500)) * time.Millisecond)
		i := rng.IntN(len(procs))
		procs[i].Signal(syscall.SIGKILL)
		procs[i].Wait(t, 10*time.Second)
		kills++
		procs[i] = testenv.StartProc(t, bin, env)
	}
	close(stop)
	writers.Wait()
	writeErrs.Range(func(k, v any) bool {
		t.Errorf("writer %v: %v", k, v)
		return true
	})
	if t.Failed() {
		return
	}
	mu.Lock()
	want := append([]testenv.Event(nil), committed...)
	ghosts := append([]string(nil), rolledBack...)
	mu.Unlock()
	c.WaitFor(t, want, 120*time.Second)
	dups := c.Verify(t, want)
	ghost := map[string]bool{}
	for _, id := range ghosts {
		ghost[id] = true
	}
	for _, r := range c.Records() {
		if ghost[testenv.Header(r, "id")] {
			t.Errorf("event %s of a rolled-back transaction was published", testenv.Header(r, "id"))
		}
	}
	t.Logf("%d kill -9s, %d events committed, %d rolled back, %d duplicates (%.2f%%)",
		kills, len(want), len(ghosts), dups, 100*float64(dups)/float64(max(len(want), 1)))
	if t.Failed() || os.Getenv("OUTBOX_POLL_LOGS") != "" {
		for i, p := range procs {
			t.Logf("instance %d:\n%s", i, tail(p.Output()))
		}
	}
}

// writePollTx writes one transaction as an application does: it locks the
// aggregates it writes (in id order, as applications do to avoid
// deadlocks), takes each event's number from the aggregate's row, inserts
// the events; sometimes it runs for seconds, sometimes it rolls back.
func writePollTx(ctx context.Context, conn *pgx.Conn, rng *rand.Rand, aggType string, aggs int) ([]testenv.Event, bool, error) {
	a, b := rng.IntN(aggs), rng.IntN(aggs)
	if a > b {
		a, b = b, a
	}
	ids := []string{fmt.Sprintf("agg-%d", a)}
	if b != a && rng.IntN(3) == 0 {
		ids = append(ids, fmt.Sprintf("agg-%d", b))
	}
	// Lock in the text order the rows sort in: no deadlock between writers.
	if len(ids) == 2 && ids[1] < ids[0] {
		ids[0], ids[1] = ids[1], ids[0]
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op
	var evs []testenv.Event
	for _, agg := range ids {
		n := 1 + rng.IntN(4)
		var last int
		if err := tx.QueryRow(ctx, "UPDATE agg_state SET seq = seq + $2 WHERE id = $1 RETURNING seq", agg, n).Scan(&last); err != nil {
			return nil, false, err
		}
		for s := last - n + 1; s <= last; s++ {
			e := testenv.Event{ID: uuid.NewString(), AggType: aggType, AggID: agg, Type: "Tested", Seq: s}
			e.Payload = fmt.Sprintf(`{"agg": "%s", "seq": %d}`, agg, s)
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`,
				e.ID, e.AggType, e.AggID, e.Type, e.Payload); err != nil {
				return nil, false, err
			}
			evs = append(evs, e)
		}
	}
	switch r := rng.IntN(20); {
	case r == 0:
		// A long transaction: its events take their place in the sequence
		// now and become visible seconds later.
		time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
	case r < 3:
		return evs, true, tx.Rollback(ctx)
	default:
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, errors.Join(errors.New("commit"), err)
	}
	return evs, false, nil
}
