package poll

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPollOrderPrecondition: poll mode publishes an aggregate's events in
// seq order, taken at INSERT. That is their commit order exactly when each
// writer inserts its event after taking the aggregate's lock (the README's
// precondition): writers racing on a few aggregates, each locking the
// aggregate, counting its version, inserting the event and committing after
// a random pause, are read back in version order. A writer that inserts
// first and locks after breaks it, and the test shows how: the event
// committed first is read second. (The WAL relay publishes in commit order
// and needs no such rule.) OUTBOX_TEST_SEED repeats a draw.
func TestPollOrderPrecondition(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	admin := pg.Conn(t, "outbox")
	if _, err := admin.Exec(ctx, `CREATE TABLE agg (id text PRIMARY KEY, version int NOT NULL DEFAULT 0);
		INSERT INTO agg SELECT 'a' || g FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("OUTBOX_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (OUTBOX_TEST_SEED repeats it)", seed)
	pool, err := pgxpool.New(ctx, pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				id := fmt.Sprintf("a%d", 1+rng.IntN(3))
				pause := time.Duration(rng.IntN(3)) * time.Millisecond
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				var v int
				// The precondition: the aggregate's lock first, then the
				// event.
				err = tx.QueryRow(ctx, `UPDATE agg SET version = version + 1 WHERE id = $1 RETURNING version`, id).Scan(&v)
				if err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Agg', $1, 'T', jsonb_build_object('v', $2::int))`, id, v)
				}
				time.Sleep(pause)
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r, err := Open(ctx, pg.Conn(t, "outbox"), Config{Schema: "public", Table: "outbox", Key: "aggregateid", ID: "id", Buckets: 1, Batch: writers * each, BatchBytes: 1 << 24})
	if err != nil {
		t.Fatal(err)
	}
	r.own = []int{0}
	versions := func() map[string][]int {
		t.Helper()
		rows, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]int{}
		for _, row := range rows {
			var agg string
			var p struct{ V int }
			for i, f := range row.Fields {
				switch f.Name {
				case "aggregateid":
					agg = string(row.Values[i])
				case "payload":
					if err := json.Unmarshal(row.Values[i], &p); err != nil {
						t.Fatal(err)
					}
				}
			}
			out[agg] = append(out[agg], p.V)
		}
		return out
	}
	n := 0
	for agg, vs := range versions() {
		for i, v := range vs {
			if v != i+1 {
				t.Fatalf("seed %d: aggregate %s read in the order of versions %v; want 1, 2, 3, … (its commit order)", seed, agg, vs)
			}
		}
		n += len(vs)
	}
	if n != writers*each {
		t.Fatalf("read %d events; want %d", n, writers*each)
	}
	if _, err := admin.Exec(ctx, `UPDATE outbox SET published_at = now()`); err != nil {
		t.Fatal(err)
	}

	// Insert first, lock after: the first INSERT takes the smaller seq but
	// commits second.
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(ctx) }()
	if _, err := first.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Agg', 'late', 'T', '{"v": 2}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Agg', 'late', 'T', '{"v": 1}')`); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := versions()["late"]; len(got) != 2 || got[0] != 2 {
		t.Fatalf("insert-first writers read as %v; this test expected [2 1] (seq order, not commit order), showing why the precondition is needed", got)
	}
}
