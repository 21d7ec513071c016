package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/examples/fulfillment/fulfill"
	"github.com/pgoutbox/pgoutbox/examples/orders/order"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// lockedBuffer collects a logger's output from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// relay runs the connector binary and restarts it after each kill.
type relay struct {
	t   *testing.T
	bin string
	env map[string]string
	p   *testenv.Proc
}

func (r *relay) start(waitStreaming bool) {
	r.t.Helper()
	r.p = testenv.StartProc(r.t, r.bin, r.env)
	if !waitStreaming {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(r.p.Output(), "msg=streaming") {
		if r.p.Exited() || time.Now().After(deadline) {
			r.t.Fatalf("connector did not start streaming (exited=%v); output:\n%s", r.p.Exited(), tailOf(r.p.Output()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *relay) kill() {
	r.p.Signal(syscall.SIGKILL)
	r.p.Wait(r.t, 10*time.Second)
}

func tailOf(s string) string {
	if len(s) > 5000 {
		return s[len(s)-5000:]
	}
	return s
}

type flowCounts struct {
	orders, fulfilled, shipments, charges, chargedTwice int
}

func counts(t *testing.T, pool *pgxpool.Pool) flowCounts {
	t.Helper()
	var c flowCounts
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM orders),
		(SELECT count(*) FROM orders o WHERE EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id)
		                                  AND EXISTS (SELECT 1 FROM charges c WHERE c.order_id = o.id)),
		(SELECT count(*) FROM shipments),
		(SELECT count(*) FROM charges),
		(SELECT count(*) FROM (SELECT order_id FROM charges GROUP BY order_id HAVING count(*) > 1) d)`).
		Scan(&c.orders, &c.fulfilled, &c.shipments, &c.charges, &c.chargedTwice)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setupDB(t *testing.T, pg *testenv.Postgres, db string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.DSN(db)+"&pool_max_conns=12")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range []string{order.Schema, fulfill.Schema} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := inbox.EnsureSchema(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestOrdersSurviveRelayCrashesAndBrokerOutages is the failure the outbox
// exists to prevent, reproduced in one setup: 10,000 orders placed through
// the outbox while the relay is killed with SIGKILL again and again and the
// broker freezes for 400 ms several times and goes down once for 30 s —
// every order is fulfilled and charged exactly once; side by side under the
// same faults, the same flow with the relay at-least-once
// (OUTBOX_KAFKA_TRANSACTIONAL=false, what the connector did before its
// exactly-once position) delivers duplicates, which the inbox skips, and
// the log says how many reached each; and the naive dual write (commit,
// then publish), whose process dies between the two at every kill, loses
// orders.
func TestOrdersSurviveRelayCrashesAndBrokerOutages(t *testing.T) {
	const totalOrders = 10000
	const ratePerSec = 175
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_wal_size": "'1GB'"}})
	k := testenv.StartKafka(t)
	for _, db := range []string{"naive", "alo"} {
		if _, err := pg.Conn(t, "postgres").Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.ApplySchema("alo"); err != nil {
		t.Fatal(err)
	}
	outboxDB := setupDB(t, pg, "outbox")
	aloDB := setupDB(t, pg, "alo")
	const aloTopic = "alo.event.Order"
	naiveDB := setupDB(t, pg, "naive") // 12 connections: placers hold one only for their INSERT
	const naiveTopic = "naive.event.Order"
	{
		cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kadm.NewClient(cl).CreateTopics(ctx, 3, 1, nil, fulfill.Topic, naiveTopic, aloTopic); err != nil {
			t.Fatal(err)
		}
		cl.Close()
	}

	// The fulfillment consumers (the code of this command), one per flow.
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	fast := []kgo.Opt{kgo.MetadataMinAge(250 * time.Millisecond)}
	consumer := func(pool *pgxpool.Pool, group, topic string) *inbox.Consumer {
		c, err := inbox.New(pool, fulfill.Handle, inbox.Config{Brokers: []string{k.Brokers}, Group: group,
			Topics: []string{topic}, DLQTopic: "fulfillment.dlq", Logger: log.With("flow", group), KafkaOpts: fast})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// What the relays put in the topics, read_committed, beside what the
	// inbox saw: duplicates in the topic are the relay's, the rest the
	// consumer's own (offsets not committed before a broker outage).
	inTopic := testenv.StartConsumer(t, k.Brokers, fulfill.Topic)
	inAloTopic := testenv.StartConsumer(t, k.Brokers, aloTopic)
	outboxConsumer := consumer(outboxDB, "fulfillment", fulfill.Topic)
	aloConsumer := consumer(aloDB, "fulfillment-alo", aloTopic)
	naiveConsumer := consumer(naiveDB, "fulfillment-naive", naiveTopic)
	var cwg sync.WaitGroup
	cctx, ccancel := context.WithCancel(ctx)
	// A consumer whose Run ends before the test cancels it stops its flow:
	// the drain's failure says which one and why.
	var runMu sync.Mutex
	runEnded := map[string]string{}
	for i, c := range []*inbox.Consumer{outboxConsumer, aloConsumer, naiveConsumer} {
		name := []string{"fulfillment", "fulfillment-alo", "fulfillment-naive"}[i]
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			err := c.Run(cctx)
			if cctx.Err() == nil {
				runMu.Lock()
				runEnded[name] = fmt.Sprintf("Run returned early at %s: %v", time.Now().Format(time.TimeOnly), err)
				runMu.Unlock()
			}
		}()
	}
	defer func() { ccancel(); cwg.Wait() }()

	port, _ := testenv.FreePort()
	rl := &relay{t: t, bin: testenv.Binary(t, "connector"), env: map[string]string{
		"OUTBOX_PG_DSN": pg.DSN("outbox"), "OUTBOX_KAFKA_BROKERS": k.Brokers,
		"OUTBOX_HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", port), "OUTBOX_STATUS_INTERVAL": "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3", "OUTBOX_LEASE_TTL": "2s",
	}}
	rl.start(true)
	aport, _ := testenv.FreePort()
	alo := &relay{t: t, bin: rl.bin, env: map[string]string{
		"OUTBOX_PG_DSN": pg.DSN("alo"), "OUTBOX_KAFKA_BROKERS": k.Brokers,
		"OUTBOX_HTTP_ADDR": fmt.Sprintf("127.0.0.1:%d", aport), "OUTBOX_STATUS_INTERVAL": "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3", "OUTBOX_LEASE_TTL": "2s",
		"OUTBOX_KAFKA_TRANSACTIONAL": "false", "OUTBOX_ROUTE_TOPIC_REPLACEMENT": "alo.event.${routedByValue}",
		"OUTBOX_SLOT": "alo_slot", "OUTBOX_PUBLICATION": "alo_pub",
	}}
	alo.start(true)

	// Order placers: the outbox service (twice: one for each relay) and the
	// naive one, at the same pace.
	outboxSvc := &order.Service{DB: outboxDB}
	aloSvc := &order.Service{DB: aloDB}
	naiveSvc := &order.NaiveService{DB: naiveDB, Topic: naiveTopic, NewClient: func() (*kgo.Client, error) {
		return kgo.NewClient(kgo.SeedBrokers(k.Brokers), kgo.RecordDeliveryTimeout(5*time.Second),
			kgo.MetadataMinAge(250*time.Millisecond))
	}}
	var placed, placeErrs, aloPlaced, naivePlaced, naiveCrashed, naivePublishErrs, naiveNanos atomic.Int64
	var owg, nwg sync.WaitGroup
	naiveStop := make(chan struct{})
	// The naive flow has more placers: each blocks on its publish (for up
	// to the 5 s delivery timeout in the outage), and both flows should
	// offer orders at the same rate.
	const outboxPlacers, naivePlacers = 4, 24
	place := func(p order.Placer, budget *atomic.Int64, naive bool) {
		n := outboxPlacers
		if naive {
			n = naivePlacers
		}
		tick := time.NewTicker(time.Second * time.Duration(n) / ratePerSec)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-naiveStop:
				// The naive flow stops with the outbox flow (its placers
				// fall behind while its publishes time out in the outage).
				return
			case <-tick.C:
			}
			if budget.Add(1) > totalOrders {
				budget.Add(-1)
				return
			}
			t0 := time.Now()
			_, err := p.Place(ctx, order.Order{Customer: fmt.Sprintf("c%d", i%50), AmountCents: int64(100 + i%900)})
			if naive {
				naiveNanos.Add(int64(time.Since(t0)))
			}
			switch {
			case err == nil:
			case naive && errors.Is(err, order.ErrCrashed):
				naiveCrashed.Add(1)
			case naive && strings.Contains(err.Error(), "the order is committed"):
				naivePublishErrs.Add(1)
			case naive:
				budget.Add(-1)
			default:
				// The outbox service's transaction failed: no order, no
				// event; the client would retry.
				placeErrs.Add(1)
				budget.Add(-1)
			}
		}
	}
	for i := 0; i < outboxPlacers; i++ {
		owg.Add(2)
		go func() { defer owg.Done(); place(outboxSvc, &placed, false) }()
		go func() { defer owg.Done(); place(aloSvc, &aloPlaced, false) }()
	}
	for i := 0; i < naivePlacers; i++ {
		nwg.Add(1)
		go func() { defer nwg.Done(); place(naiveSvc, &naivePlaced, true) }()
	}

	// Faults. Every kill takes the relay down mid-publish (orders flow all
	// the time) and, in the naive flow, the service between its commit and
	// its publish.
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	start := time.Now()
	kills, freezes := 0, 0
	kill := func(restartWait bool) {
		time.Sleep(time.Duration(700+rng.Intn(800)) * time.Millisecond)
		rl.kill()
		alo.kill()
		naiveSvc.Crash()
		kills++
		t0 := time.Now()
		rl.start(restartWait)
		alo.start(restartWait)
		t.Logf("kill %d at %s; restarted relay streaming after %s; %d orders placed", kills, time.Since(start).Round(100*time.Millisecond),
			time.Since(t0).Round(10*time.Millisecond), placed.Load())
	}
	freeze := func() {
		if err := k.Freeze(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond)
		if err := k.Thaw(); err != nil {
			t.Fatal(err)
		}
		freezes++
	}
	for i := 0; i < 6; i++ {
		kill(true)
		if i%2 == 1 {
			freeze()
		}
	}
	t.Logf("phase 1 done at %s: %d kills, %d freezes, %d orders placed", time.Since(start).Round(time.Second), kills, freezes, placed.Load())
	k.Stop()
	outageStart := time.Now()
	kill(false)
	kill(false)
	time.Sleep(30*time.Second - time.Since(outageStart))
	if err := k.Restart(); err != nil {
		t.Fatalf("restart Kafka: %v", err)
	}
	outage := time.Since(outageStart)
	t.Logf("broker down for %s (30 s stopped, then its restart); %d orders placed", outage.Round(100*time.Millisecond), placed.Load())
	kill(true) // a fresh relay, without its capped backoff
	for i := 0; i < 4; i++ {
		kill(true)
		freeze()
	}
	owg.Wait()
	close(naiveStop)
	nwg.Wait()
	t.Logf("faults done at %s: %d kills with SIGKILL, %d freezes of 400 ms, one outage of %s; %d + %d orders placed",
		time.Since(start).Round(time.Second), kills, freezes, outage.Round(100*time.Millisecond), placed.Load(), naivePlaced.Load())

	// Drain: every outbox order fulfilled; the naive flow settled. Both
	// flows must keep progressing: a minute with neither fulfilling one
	// more order is a wedge (on 2 loaded cores a whole drain can take
	// longer than a couple of minutes; CI once failed a fixed 2 min).
	drainStart, progressed, lastDone := time.Now(), [2]time.Time{time.Now(), time.Now()}, [2]int{-1, -1}
	var oc, ac flowCounts
	for {
		oc = counts(t, outboxDB)
		ac = counts(t, aloDB)
		if oc.fulfilled == oc.orders && oc.orders >= totalOrders && ac.fulfilled == ac.orders && ac.orders >= totalOrders {
			t.Logf("drained in %s", time.Since(drainStart).Round(100*time.Millisecond))
			break
		}
		// Each flow not yet drained must progress on its own: one wedged
		// beside one still draining fails as soon.
		stalled := time.Duration(0)
		for i, c := range []flowCounts{oc, ac} {
			if c.fulfilled != lastDone[i] {
				progressed[i], lastDone[i] = time.Now(), c.fulfilled
			}
			if c.fulfilled < c.orders || c.orders < totalOrders {
				stalled = max(stalled, time.Since(progressed[i]))
			}
		}
		if stalled > time.Minute || time.Since(drainStart) > 6*time.Minute {
			runMu.Lock()
			ended := fmt.Sprint(runEnded)
			runMu.Unlock()
			t.Fatalf("after %s (a flow not drained has not progressed for %s): outbox flow %d of %d orders fulfilled (%d distinct ids in %s; inbox %+v), at-least-once flow %d of %d (%d distinct ids in %s; inbox %+v); consumers ended: %s\n"+
				"inbox warnings and errors:\n%s\nexactly-once relay output:\n%s\nat-least-once relay output:\n%s",
				time.Since(drainStart).Round(time.Second), stalled.Round(time.Second),
				oc.fulfilled, oc.orders, distinctIDs(inTopic), fulfill.Topic, outboxConsumer.Stats(),
				ac.fulfilled, ac.orders, distinctIDs(inAloTopic), aloTopic, aloConsumer.Stats(), ended,
				tailOf(strings.Join(append(logs.lines("level=WARN"), logs.lines("level=ERROR")...), "\n")),
				tailOf(rl.p.Output()), tailOf(alo.p.Output()))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var nc flowCounts
	for stable, last := 0, -1; stable < 10; time.Sleep(300 * time.Millisecond) {
		nc = counts(t, naiveDB)
		if nc.fulfilled == last {
			stable++
		} else {
			stable, last = 0, nc.fulfilled
		}
	}
	ccancel()
	cwg.Wait()
	rl.p.Signal(syscall.SIGTERM)
	alo.p.Signal(syscall.SIGTERM)
	rl.p.Wait(t, 60*time.Second)
	alo.p.Wait(t, 60*time.Second)

	ost, ast, ns := outboxConsumer.Stats(), aloConsumer.Stats(), naiveConsumer.Stats()
	dupLines := logs.lines(`msg="duplicate delivery skipped" flow=fulfillment `)
	aloLines := logs.lines(`msg="duplicate delivery skipped" flow=fulfillment-alo `)
	t.Logf("outbox:     %d orders, %d fulfilled, %d shipments, %d charges, %d orders charged twice; %d duplicate deliveries reached the inbox (exactly-once relay; %d log lines), %d dead-lettered; %d failed placements (rolled back, no order)",
		oc.orders, oc.fulfilled, oc.shipments, oc.charges, oc.chargedTwice, ost.Duplicates, len(dupLines), ost.DeadLettered, placeErrs.Load())
	_, relayDups := idCounts(inTopic)
	_, aloRelayDups := idCounts(inAloTopic)
	t.Logf("duplicates the relays put in the topics (read_committed): exactly-once %d, at-least-once %d", relayDups, aloRelayDups)
	if relayDups != 0 {
		t.Errorf("the exactly-once relay put %d duplicates in %s; want 0", relayDups, fulfill.Topic)
	}
	t.Logf("outbox, relay at-least-once: %d orders, %d fulfilled, %d charges, %d orders charged twice; %d duplicate deliveries reached the inbox and were skipped (%d log lines, e.g. %s)",
		ac.orders, ac.fulfilled, ac.charges, ac.chargedTwice, ast.Duplicates, len(aloLines), firstOf(aloLines))
	t.Logf("naive dual write: %d orders committed, %d fulfilled, %d LOST (%d died between commit and publish at a kill, %d publishes failed during the outage after the commit); %d charges; mean Place %s",
		nc.orders, nc.fulfilled, nc.orders-nc.fulfilled, naiveCrashed.Load(), naivePublishErrs.Load(), nc.charges,
		time.Duration(naiveNanos.Load()/max(1, naivePlaced.Load())).Round(time.Millisecond))
	_ = ns
	if oc.orders != totalOrders {
		t.Errorf("outbox flow: %d orders, want %d", oc.orders, totalOrders)
	}
	if oc.charges != oc.orders || oc.shipments != oc.orders || oc.chargedTwice != 0 {
		t.Errorf("outbox flow: %d charges and %d shipments for %d orders (%d charged twice); want exactly one each",
			oc.charges, oc.shipments, oc.orders, oc.chargedTwice)
	}
	if ac.orders != totalOrders || ac.charges != ac.orders || ac.shipments != ac.orders || ac.chargedTwice != 0 {
		t.Errorf("outbox flow with the at-least-once relay: %d charges and %d shipments for %d orders (%d charged twice); want exactly one each of %d",
			ac.charges, ac.shipments, ac.orders, ac.chargedTwice, totalOrders)
	}
	if ast.Duplicates == 0 || len(aloLines) == 0 {
		t.Errorf("no duplicate delivery seen with the at-least-once relay: the faults did not exercise the inbox")
	}
	if ost.DeadLettered != 0 {
		t.Errorf("%d orders dead-lettered", ost.DeadLettered)
	}
	if kills < 10 {
		t.Errorf("%d kills, want at least 10", kills)
	}
	if nc.orders-nc.fulfilled <= 0 {
		t.Errorf("the naive dual write lost no order under the same faults: the contrast is not shown")
	}
	if nc.chargedTwice != 0 {
		t.Errorf("naive flow: %d orders charged twice", nc.chargedTwice)
	}

	// slotwatch's audit finds the naive flow's lost orders by itself: the
	// orders table against the record keys on its topic.
	audit := exec.Command(testenv.Binary(t, "slotwatch"), "audit", "-since", start.Add(-time.Minute).UTC().Format(time.RFC3339Nano),
		"-table", "public.orders", "-aggregate-type", order.AggregateType, "-match", "key")
	audit.Env = []string{"SLOTWATCH_OUTBOX_DSN=" + pg.DSN("naive"), "OUTBOX_KAFKA_BROKERS=" + k.Brokers, "SLOTWATCH_AUDIT_GRACE=0s",
		"OUTBOX_ROUTE_TOPIC_REPLACEMENT=naive.event.${routedByValue}"}
	out, err := audit.Output()
	var missing int
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "missing ") {
			missing++
		}
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("slotwatch audit of the naive flow: %d missing; %s", missing, lines[len(lines)-1])
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("slotwatch audit of the naive flow: %v; want exit 1 (events missing)", err)
	}
	if missing != nc.orders-nc.fulfilled {
		t.Errorf("slotwatch audit found %d orders whose event never arrived; the test counts %d", missing, nc.orders-nc.fulfilled)
	}
}

// idCounts counts the distinct id headers a consumer of a topic read, and
// the records beyond the first of each id (duplicates).
func idCounts(c *testenv.Consumer) (distinct, dups int) {
	seen := map[string]bool{}
	for _, r := range c.Records() {
		id := testenv.Header(r, "id")
		if seen[id] {
			dups++
		}
		seen[id] = true
	}
	return len(seen), dups
}

func distinctIDs(c *testenv.Consumer) int {
	n, _ := idCounts(c)
	return n
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return s[0]
}
