package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// TestPartitionsDoNotWaitForEachOther (issue 14, stalls): one member owns
// every partition; partition 0 has a backlog of slow records, and records
// that arrive on partition 1 meanwhile are applied at once, not after the
// member has worked through what it fetched of partition 0. (Before each
// partition had a worker of its own, the member handled each poll before
// the next, franz-go handed out partition 0's fetch, 1 MiB of these small
// records, before it fetched again, and partition 1 waited for all of it.)
func TestPartitionsDoNotWaitForEachOther(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.brokers), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const backlog = 3000
	const slowEach = 3 * time.Millisecond // partition 0 takes at least 9 s
	produce := func(p int32, prefix string, n int) {
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = rec(fmt.Sprintf("%s-%04d", prefix, i), "ok")
			recs[i].Topic, recs[i].Partition = e.topic, p
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, "slow", backlog)
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if r.Partition == 0 {
			time.Sleep(slowEach)
		}
		return effectHandler(ctx, tx, r)
	}
	c, err := inbox.New(e.pool, h, e.quiet())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	slowDone := func() int { return count(t, e.pool, `SELECT count(*) FROM effects WHERE event_id LIKE 'slow-%'`) }
	waitFor(t, "partition 0 under way", 30*time.Second, func() bool { return slowDone() >= 100 })

	produce(1, "fast", 20)
	sent := time.Now()
	waitFor(t, "partition 1's records applied", 60*time.Second, func() bool {
		return count(t, e.pool, `SELECT count(*) FROM effects WHERE event_id LIKE 'fast-%'`) == 20
	})
	took, behind := time.Since(sent), backlog-slowDone()
	t.Logf("partition 1's 20 records applied %s after they were sent, with %d of partition 0's %d still to do",
		took.Round(10*time.Millisecond), behind, backlog)
	// A fetch wait (500 ms) and twenty transactions; partition 0 has seconds
	// of work left.
	if took > 3*time.Second || behind < backlog/3 {
		t.Errorf("partition 1 waited %s for partition 0 (%d of whose records were left): want under 3s, with at least a third of partition 0 left",
			took.Round(10*time.Millisecond), behind)
	}
}

// TestRevokedPausedPartitionIsFetchedAgain: a partition whose fetching is
// paused (its worker's queue is full) when it is revoked is fetched again
// when it is assigned back. franz-go keeps a pause across rebalances: a
// member that did not resume its revoked partitions would never fetch one
// again, a wedge no error shows (without the resume this test timed out).
// Member A works through a backlog on every partition (each paused in
// turn), member B joins and takes some, B leaves and A gets them back:
// every event is applied once, each partition's records in offset order,
// and no partition's handler runs twice at once (two workers on one
// partition, which the dedupe table would hide).
// With the default (cooperative) balancer and an eager one, which revokes
// every partition at each rebalance.
func TestRevokedPausedPartitionIsFetchedAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
	}{
		{"cooperative", nil},
		{"eager", []kgo.Opt{kgo.Balancers(kgo.RoundRobinBalancer())}},
	} {
		t.Run(tc.name, func(t *testing.T) { revokedPaused(t, tc.opts) })
	}
}

func revokedPaused(t *testing.T, opts []kgo.Opt) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, p int NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const n = 1800
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("ev-%04d", i), "ok")
		recs[i].Key = []byte(fmt.Sprintf("agg-%d", i%30))
	}
	e.produce(t, recs...)
	// Both members run in this process: a partition handled by two workers
	// at once shows as two handlers of it running at the same time.
	var mu sync.Mutex
	running, overlaps := map[int32]int{}, 0
	slow := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		mu.Lock()
		if running[r.Partition]++; running[r.Partition] > 1 {
			overlaps++
		}
		mu.Unlock()
		defer func() { mu.Lock(); running[r.Partition]--; mu.Unlock() }()
		time.Sleep(5 * time.Millisecond)
		if _, err := tx.Exec(ctx, `INSERT INTO applied (p, off) VALUES ($1, $2)`, r.Partition, r.Offset); err != nil {
			return err
		}
		return effectHandler(ctx, tx, r)
	}
	cfg := e.quiet()
	cfg.MaxPollRecords = 20 // a queue of 20 pauses its partition
	cfg.KafkaOpts = opts
	a, err := inbox.New(e.pool, slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, a)
	defer stopA()
	done := func() int { return count(t, e.pool, `SELECT count(DISTINCT event_id) FROM effects`) }
	waitFor(t, "member A under way, with a partition paused", 30*time.Second, func() bool {
		return done() >= 100 && len(a.Client().PauseFetchPartitions(nil)) > 0
	})
	b, err := inbox.New(e.pool, slow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, b)
	waitFor(t, "member B working on partitions taken from A", 30*time.Second, func() bool { return b.Stats().Processed >= 20 })
	stopB() // B leaves: its partitions go back to A
	left := n - done()
	if left < 100 {
		t.Fatalf("only %d events were left when B left: the test needs A to get partitions back with a backlog", left)
	}
	waitFor(t, "every event applied after B left", 60*time.Second, func() bool { return done() == n })
	if rows := count(t, e.pool, `SELECT count(*) FROM effects`); rows != n {
		t.Errorf("%d effect rows for %d events: some applied twice", rows, n)
	}
	// In commit order (n is taken at insert, and one partition's records
	// commit one after another), each partition's offsets only increase.
	if back := count(t, e.pool, `SELECT count(*) FROM (
		SELECT off < lag(off) OVER (PARTITION BY p ORDER BY n) AS back FROM applied) x WHERE back`); back > 0 {
		t.Errorf("%d records applied before an earlier record of their partition", back)
	}
	mu.Lock()
	if overlaps > 0 {
		t.Errorf("a partition's handler ran twice at the same time %d times (two workers on one partition)", overlaps)
	}
	mu.Unlock()
	t.Logf("A processed %d, B %d; %d events left when B left", a.Stats().Processed, b.Stats().Processed, left)
}
