package poll

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestRebalance: readers joining and leaving share the buckets by their
// advisory locks: every bucket owned by exactly one reader, the shares
// within one of each other; a reader whose session ends frees its buckets,
// which the others take.
func TestRebalance(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	cfg := Config{Schema: "public", Table: "outbox", Key: "aggregateid", Buckets: 16, Batch: 10, BatchBytes: 1 << 20}
	var readers []*Reader
	var conns []*pgx.Conn
	join := func() {
		conn, err := pgx.Connect(ctx, pg.DSN("outbox"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		r, err := Open(ctx, conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		readers, conns = append(readers, r), append(conns, conn)
	}
	// settle runs rounds until every bucket is owned once and the shares
	// are within one, or fails after many.
	settle := func(what string) {
		t.Helper()
		for round := range 40 {
			for _, r := range readers {
				if _, err := r.Rebalance(ctx); err != nil {
					t.Fatal(err)
				}
			}
			seen := map[int]int{}
			lo, hi := cfg.Buckets, 0
			for _, r := range readers {
				for _, b := range r.Owned() {
					seen[b]++
				}
				lo, hi = min(lo, len(r.Owned())), max(hi, len(r.Owned()))
			}
			for b, n := range seen {
				if n > 1 {
					t.Fatalf("%s, round %d: bucket %d owned by %d readers", what, round, b, n)
				}
			}
			if len(seen) == cfg.Buckets && hi-lo <= 1 {
				t.Logf("%s: %d readers settled in %d rounds (shares %d to %d)", what, len(readers), round+1, lo, hi)
				return
			}
		}
		var shares []int
		for _, r := range readers {
			shares = append(shares, len(r.Owned()))
		}
		t.Fatalf("%s: %d readers did not settle in 40 rounds: shares %v", what, len(readers), shares)
	}
	join()
	settle("one reader")
	if got := readers[0].Owned(); len(got) != 16 || !slices.IsSorted(got) {
		t.Fatalf("one reader owns %v", got)
	}
	join()
	join()
	settle("three readers")
	for len(readers) < 10 {
		join()
	}
	settle("ten readers")
	for len(readers) < 20 {
		join()
	}
	settle("twenty readers")
	// Sessions end (a kill -9 closes the socket the same way): their locks
	// go with them, and the others take their buckets.
	for range 17 {
		conns[0].Close(ctx)
		readers, conns = readers[1:], conns[1:]
	}
	settle("three readers left")
}

// TestNotSession: a reader whose statements run in another server session
// than the one that joined (a transaction-mode pooler) says so instead of
// trusting locks it does not hold.
func TestNotSession(t *testing.T) {
	pg := startPrepared(t)
	ctx := context.Background()
	a, b := pg.Conn(t, "outbox"), pg.Conn(t, "outbox")
	r, err := Open(ctx, a, Config{Schema: "public", Table: "outbox", Key: "aggregateid", Buckets: 4, Batch: 10, BatchBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	r.conn = b // what a transaction pooler does between two statements
	if _, err := r.Rebalance(ctx); !errors.Is(err, ErrNotSession) {
		t.Fatalf("Rebalance on another session: %v; want ErrNotSession", err)
	}
}

// startPrepared starts a cluster for the test with the poll variant applied
// to its outbox.
func startPrepared(t *testing.T) *testenv.Postgres {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll.sql"); err != nil {
		t.Fatal(err)
	}
	return pg
}
