package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestFencingCost measures what Kafka transactions (fencing at the broker)
// cost against the idempotent producer: the rate at which a backlog of
// 100,000 events drains, and the commit-to-consume latency of a steady
// trickle. Run with make soak (OUTBOX_SOAK=1) or OUTBOX_FENCING_COST=1.
func TestFencingCost(t *testing.T) {
	if os.Getenv("OUTBOX_SOAK") != "1" && os.Getenv("OUTBOX_FENCING_COST") != "1" {
		t.Skip("set OUTBOX_FENCING_COST=1 or OUTBOX_SOAK=1 (make soak) to measure the cost of fencing")
	}
	// The shared broker: on a small machine a second broker's JVM costs the
	// measurement more than the other packages' load on the shared one.
	brokers := testenv.SharedKafka(t)
	bin := testenv.Binary(t, "connector")
	type result struct {
		drain         time.Duration
		p50, p99, max time.Duration
	}
	results := map[bool][]result{}
	runs := 3
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_FENCING_RUNS")); err == nil && v > 0 {
		runs = v
	}
	var order []bool
	for i := 0; i < runs; i++ {
		order = append(order, true, false)
	}
	for _, txn := range order {
		name := fmt.Sprintf("transactional=%v", txn)
		txn := txn
		t.Run(name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			port, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			env := connectorEnv(pg, brokers, "OUTBOX_KAFKA_TRANSACTIONAL", fmt.Sprint(txn), "OUTBOX_HTTP_ADDR", addr)

			// Backlog: the slot exists, the connector is stopped, 100,000
			// events wait in the WAL.
			p := testenv.StartProc(t, bin, env)
			waitOutput(t, p, "msg=streaming", 60*time.Second)
			p.Signal(syscall.SIGTERM)
			p.Wait(t, 60*time.Second)
			aggType := fmt.Sprintf("cost%d", time.Now().UnixNano()%1e9)
			w := testenv.NewWriter()
			w.Write(t, ctx, conn, aggType, 100_000, 1000, 50)
			c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
			start := time.Now()
			p = testenv.StartProc(t, bin, env)
			c.WaitFor(t, w.Events, 5*time.Minute)
			drain := time.Since(start)
			if dups := c.Verify(t, w.Events); dups != 0 {
				t.Logf("%d duplicates", dups)
			}

			// Latency: one event per transaction, 200 a second, for 10 s.
			latType := fmt.Sprintf("lat%d", time.Now().UnixNano()%1e9)
			before := histogram(t, addr)
			t.Logf("%s, drain: Kafka transaction commits %s", name, before.delta(metricsText{}, "outbox_connector_kafka_transaction_commit_seconds"))
			lat := measureLatency(t, ctx, conn, brokers, latType, 200, 10*time.Second)
			after := histogram(t, addr)
			t.Logf("%s, trickle: connector-side commit-to-ack %s; Kafka transaction commits %s", name,
				after.delta(before, "outbox_connector_commit_to_ack_seconds"), after.delta(before, "outbox_connector_kafka_transaction_commit_seconds"))
			p.Signal(syscall.SIGTERM)
			p.Wait(t, 60*time.Second)
			r := result{drain: drain, p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], max: lat[len(lat)-1]}
			results[txn] = append(results[txn], r)
			t.Logf("%s: 100,000-event backlog drained in %s (%.0f events/s); commit-to-consume latency at 200 events/s: p50 %s p99 %s max %s",
				name, drain.Round(time.Millisecond), 100_000/drain.Seconds(), r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.max.Round(time.Millisecond))
		})
	}
	median := func(rs []result, f func(result) time.Duration) time.Duration {
		ds := make([]time.Duration, len(rs))
		for i, r := range rs {
			ds[i] = f(r)
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	a, b := results[true], results[false]
	if len(a) == 0 || len(b) == 0 {
		return
	}
	da, db := median(a, func(r result) time.Duration { return r.drain }), median(b, func(r result) time.Duration { return r.drain })
	t.Logf("fencing cost, medians of %d runs each (transactional vs idempotent): backlog drain %.0f vs %.0f events/s (%.0f%%); commit-to-consume latency p50 %s vs %s, p99 %s vs %s",
		runs, 100_000/da.Seconds(), 100_000/db.Seconds(), 100*db.Seconds()/da.Seconds(),
		median(a, func(r result) time.Duration { return r.p50 }).Round(100*time.Microsecond), median(b, func(r result) time.Duration { return r.p50 }).Round(100*time.Microsecond),
		median(a, func(r result) time.Duration { return r.p99 }).Round(100*time.Microsecond), median(b, func(r result) time.Duration { return r.p99 }).Round(100*time.Microsecond))
}

// measureLatency writes rate single-event transactions a second for d and
// returns the sorted delays from each COMMIT's return to the event's
// arrival at a read_committed consumer.
func measureLatency(t *testing.T, ctx context.Context, conn *pgx.Conn, brokers, aggType string, rate int, d time.Duration) []time.Duration {
	t.Helper()
	topic := "outbox.event." + aggType
	var mu sync.Mutex
	committed := map[string]time.Time{}
	received := map[string]time.Time{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				mu.Lock()
				received[testenv.Header(r, "id")] = now
				mu.Unlock()
			})
		}
	}()
	// A first event creates the topic; the consumer finds it.
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-tick.C
		id := uuid.NewString()
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'a', 'T', '{}')`, id, aggType); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		committed[id] = time.Now()
		mu.Unlock()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(received)
		mu.Unlock()
		if n >= len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	var lat []time.Duration
	skip := rate // the first second: topic creation and consumer start
	i := 0
	ids := make([]string, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool { return committed[ids[a]].Before(committed[ids[b]]) })
	for _, id := range ids {
		i++
		if i <= skip {
			continue
		}
		r, ok := received[id]
		if !ok {
			t.Errorf("event %s never arrived", id)
			continue
		}
		lat = append(lat, r.Sub(committed[id]))
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	if len(lat) == 0 {
		t.Fatal("no latency samples")
	}
	return lat
}

// metricsText is a scrape of /metrics: "name{le=...}" -> value for the
// histogram buckets and counts.
type metricsText map[string]float64

func histogram(t *testing.T, addr string) metricsText {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := metricsText{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// delta summarises a histogram's observations between two scrapes: count
// and the buckets' cumulative shares at a few bounds.
func (m metricsText) delta(before metricsText, name string) string {
	n := m[name+"_count"] - before[name+"_count"]
	if n == 0 {
		return "no observations"
	}
	var parts []string
	for _, le := range []string{"0.005", "0.01", "0.025", "0.05", "0.1", "0.25"} {
		k := name + `_bucket{le="` + le + `"}`
		parts = append(parts, fmt.Sprintf("<=%sms %.1f%%", strings.TrimSuffix(strings.TrimSuffix(fmt.Sprint(mustFloat(le)*1000), ".0"), ".00"), 100*(m[k]-before[k])/n))
	}
	mean := (m[name+"_sum"] - before[name+"_sum"]) / n
	return fmt.Sprintf("n=%.0f mean %.1fms, %s", n, mean*1000, strings.Join(parts, " "))
}

func mustFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
