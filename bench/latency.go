package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// insertEventsSQL writes one transaction of $4 events (one statement, so one
// transaction, in one round trip) whose payloads carry $3: the writer's
// clock just before the statement, and with it the COMMIT, was sent.
const insertEventsSQL = `
INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), $1, 'order-' || (($2::bigint + g) % 1000), 'OrderCreated', bench_payload($2::bigint + g, $3::bigint)
FROM generate_series(0, $4::int - 1) AS g`

// writers is a fixed set of connections that write the latency load.
type writers struct {
	conns []*pgx.Conn
	seq   atomic.Int64
}

func openWriters(ctx context.Context, e *env, n int) (*writers, error) {
	w := &writers{}
	for i := 0; i < n; i++ {
		c, err := e.connect(ctx)
		if err != nil {
			w.close()
			return nil, err
		}
		w.conns = append(w.conns, c)
	}
	return w, nil
}

func (w *writers) close() {
	for _, c := range w.conns {
		c.Close(context.Background())
	}
}

type loadResult struct {
	sent        int // events committed in the measured window
	sentAll     int // events committed in all
	late        int // transactions that started more than 5ms after their slot
	commitDur   []float64
	windowStart time.Time
	windowEnd   time.Time
	err         error
}

// load commits rate events/s in transactions of perTx for warmup+measure,
// open loop: a dispatcher hands out time slots, the writers take them.
func (w *writers) load(ctx context.Context, aggType string, rate, perTx int, start time.Time, warmup, measure time.Duration) loadResult {
	interval := time.Duration(float64(time.Second) * float64(perTx) / float64(rate))
	res := loadResult{windowStart: start.Add(warmup), windowEnd: start.Add(warmup + measure)}
	type slot struct{ due time.Time }
	jobs := make(chan slot, len(w.conns))
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	var late, sent, sentAll atomic.Int64
	for _, c := range w.conns {
		wg.Add(1)
		go func(c *pgx.Conn) {
			defer wg.Done()
			var durs []float64
			for s := range jobs {
				t0 := time.Now()
				if t0.Sub(s.due) > 5*time.Millisecond {
					late.Add(1)
				}
				seq := w.seq.Add(int64(perTx)) - int64(perTx)
				_, err := c.Exec(ctx, insertEventsSQL, aggType, seq, t0.UnixNano(), perTx)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				sentAll.Add(int64(perTx))
				if !t0.Before(res.windowStart) && t0.Before(res.windowEnd) {
					sent.Add(int64(perTx))
					durs = append(durs, float64(time.Since(t0))/1e6)
				}
			}
			mu.Lock()
			res.commitDur = append(res.commitDur, durs...)
			mu.Unlock()
		}(c)
	}
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		if !due.Before(res.windowEnd) || ctx.Err() != nil {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		jobs <- slot{due: due}
	}
	close(jobs)
	wg.Wait()
	res.sent, res.sentAll, res.late = int(sent.Load()), int(sentAll.Load()), int(late.Load())
	res.err = firstErr
	return res
}

// consumer reads a topic from its start and keeps the latency of every
// record committed inside the measured window.
type consumer struct {
	cl       *kgo.Client
	mu       sync.Mutex
	from, to int64 // window, Unix ns of the commit clock
	ack      []float64
	recv     []float64
	inWindow int
	total    int
	done     chan struct{}
}

func startConsumer(ctx context.Context, brokers, topic string) (*consumer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second),
		// What an application relying on a transactional producer sees.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return nil, err
	}
	c := &consumer{cl: cl, from: math.MaxInt64, to: math.MaxInt64, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			fs := cl.PollFetches(ctx)
			now := time.Now().UnixNano()
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				c.total++
				t, ok := benchT(r.Value)
				if !ok || t < c.from || t >= c.to {
					return
				}
				c.inWindow++
				c.ack = append(c.ack, float64(r.Timestamp.UnixMilli()*1e6-t)/1e6)
				c.recv = append(c.recv, float64(now-t)/1e6)
			})
			c.mu.Unlock()
		}
	}()
	return c, nil
}

func (c *consumer) setWindow(from, to time.Time) {
	c.mu.Lock()
	c.from, c.to = from.UnixNano(), to.UnixNano()
	c.mu.Unlock()
}

func (c *consumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inWindow
}

// fill records in r what the consumer saw in the measured window, and the
// writers' commit durations.
func (c *consumer) fill(r *LatencyRun, lr loadResult) {
	c.mu.Lock()
	r.Received = c.inWindow
	r.CommitToAck = percentiles(c.ack)
	r.CommitToConsumer = percentiles(c.recv)
	c.mu.Unlock()
	r.CommitDuration = percentiles(lr.commitDur)
}

func (c *consumer) close() {
	c.cl.Close()
	<-c.done
}

// benchT finds the bench_t field in a record value, whether the value is the
// payload itself or a JSON string holding it (escaped quotes), and parses its
// digits.
func benchT(v []byte) (int64, bool) {
	i := bytes.Index(v, []byte("bench_t"))
	if i < 0 {
		return 0, false
	}
	j := i + len("bench_t")
	for j < len(v) && (v[j] < '0' || v[j] > '9') {
		j++
	}
	k := j
	for k < len(v) && v[k] >= '0' && v[k] <= '9' {
		k++
	}
	if j == k {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v[j:k]), 10, 64)
	return n, err == nil
}

// latencyLevels runs every load level against every system. Level by level,
// each system in turn with a process of its own, so that a change in the
// shared machine's load lands on all systems of a level alike.
func (b *bench) latencyLevels(ctx context.Context) []LatencyRun {
	var out []LatencyRun
	w, err := openWriters(ctx, b.env, b.cfg.Writers)
	if err != nil {
		for i, rate := range b.cfg.Rates {
			out = append(out, LatencyRun{System: sysFloor, Rate: rate, EventsPerTx: b.cfg.PerTx[i], Error: err.Error()})
		}
		return out
	}
	defer w.close()
	for i, rate := range b.cfg.Rates {
		perTx := b.cfg.PerTx[i]
		if ctx.Err() != nil {
			break
		}
		if !b.deadline.IsZero() && time.Now().After(b.deadline) {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("latency at %d events/s and above skipped: time budget (%s) spent", rate, b.cfg.Budget))
			break
		}
		out = append(out, b.floorLevel(ctx, rate, perTx, w))
		for vi, v := range b.variants {
			out = append(out, b.latencyLevel(ctx, v.Name, fmt.Sprintf("conn%d_%d", vi, rate), b.startConnector(b.env.connectorBin, v.Env...), rate, perTx, w))
		}
		if b.dbz != nil && b.dbz.err == nil {
			r := b.latencyLevel(ctx, sysDebezium, fmt.Sprintf("dbz_%d", rate), b.dbz.start(b), rate, perTx, w)
			b.res.Debezium.Ran = b.res.Debezium.Ran || r.Error == ""
			out = append(out, r)
		}
	}
	// Reported system by system.
	order := map[string]int{sysFloor: 0}
	for i, sys := range systems(&Results{Variants: b.variants}) {
		order[sys] = i + 1
	}
	sort.SliceStable(out, func(i, j int) bool { return order[out[i].System] < order[out[j].System] })
	return out
}

// latencyLevel runs one load level against one system: its own slot,
// topic and process.
func (b *bench) latencyLevel(ctx context.Context, system, name string, start relayStart, rate, perTx int, w *writers) LatencyRun {
	b.log.Info("latency", "system", system, "rate", rate, "events_per_tx", perTx)
	fail := func(err error) LatencyRun {
		return LatencyRun{System: system, Rate: rate, EventsPerTx: perTx, Error: err.Error()}
	}
	conn, err := b.env.connect(ctx)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	slot := "lat_" + name
	if err := b.env.createSlot(ctx, conn, slot); err != nil {
		return fail(err)
	}
	defer b.env.dropSlot(context.Background(), slot)
	// The topic first: a relay must find it (the broker does not create it).
	aggType := "lat_" + name
	if err := b.env.createTopic(ctx, "outbox.event."+aggType); err != nil {
		return fail(err)
	}
	p, err := start(slot)
	if err != nil {
		return fail(err)
	}
	defer p.stop(30 * time.Second)
	if err := b.waitStreaming(ctx, conn, p, slot, 3*time.Minute); err != nil {
		return fail(err)
	}
	r := b.latencyRun(ctx, system, p, aggType, rate, perTx, w)
	if p.exited() && r.Error == "" {
		r.Error = fmt.Sprintf("%s exited: %s", system, p.logTail(2000))
	}
	return r
}

func (b *bench) latencyRun(ctx context.Context, system string, p *sysProc, aggType string, rate, perTx int, w *writers) LatencyRun {
	r := LatencyRun{System: system, Rate: rate, EventsPerTx: perTx, TxPerSec: float64(rate) / float64(perTx), Seconds: b.cfg.Measure.Seconds()}
	topic := "outbox.event." + aggType
	c, err := startConsumer(ctx, b.env.brokers, topic)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer c.close()
	// The window, the CPU reading and the connector's histogram start
	// together, after the warm-up.
	var cpu0 atomic.Int64
	var hist0 atomic.Pointer[map[float64]float64]
	start := time.Now().Add(50 * time.Millisecond)
	from := start.Add(b.cfg.Warmup)
	cpuTimer := time.AfterFunc(time.Until(from), func() {
		d, _ := procCPU(p.pid)
		cpu0.Store(int64(d))
		if p.httpPort != 0 {
			if h, err := scrapeHistogram(ctx, p.httpPort, "outbox_connector_commit_to_ack_seconds"); err == nil {
				hist0.Store(&h)
			}
		}
	})
	c.setWindow(from, from.Add(b.cfg.Measure))
	lr := w.load(ctx, aggType, rate, perTx, start, b.cfg.Warmup, b.cfg.Measure)
	cpuTimer.Stop()
	cpu1, _ := procCPU(p.pid)
	if lr.err != nil {
		r.Error = "writer: " + lr.err.Error()
	}
	r.Sent, r.LateStarts = lr.sent, lr.late
	r.AchievedRate = float64(lr.sent) / b.cfg.Measure.Seconds()
	// Wait for the stragglers.
	deadline := time.Now().Add(60 * time.Second)
	for c.count() < lr.sent && time.Now().Before(deadline) && !p.exited() {
		time.Sleep(50 * time.Millisecond)
	}
	c.fill(&r, lr)
	r.CPUSeconds = (cpu1 - time.Duration(cpu0.Load())).Seconds()
	if lr.sent > 0 {
		r.CPUPer100k = r.CPUSeconds / float64(lr.sent) * 1e5
	}
	_, r.PeakRSSBytes, _ = procMem(p.pid)
	if r.Received < r.Sent && r.Error == "" {
		r.Error = fmt.Sprintf("%d of %d events did not reach the consumer within 60s of the load's end", r.Sent-r.Received, r.Sent)
	}
	if h0 := hist0.Load(); p.httpPort != 0 && h0 != nil {
		if hist1, err := scrapeHistogram(ctx, p.httpPort, "outbox_connector_commit_to_ack_seconds"); err == nil {
			pc := histogramPercentiles(*h0, hist1)
			r.ConnectorHistogram = &pc
		}
	}
	return r
}

// waitStreaming waits until the relay holds the slot, then a little longer
// for its producer to be ready.
func (b *bench) waitStreaming(ctx context.Context, conn *pgx.Conn, p *sysProc, slot string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return fmt.Errorf("%s exited during start: %s", p.name, p.logTail(3000))
		}
		if b.walsenderPID(ctx, conn, slot) != 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not start streaming slot %s within %s: %s", p.name, slot, timeout, p.logTail(3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	return nil
}

// scrapeMetrics reads /metrics: series (name and labels) -> value.
func scrapeMetrics(ctx context.Context, port int) (map[string]float64, error) {
	body, err := getMetrics(ctx, port)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// sumSeries adds the values of every series of the metric name.
func sumSeries(m map[string]float64, name string) float64 {
	var sum float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

// scrapeHistogram reads a Prometheus histogram's cumulative buckets (le ->
// count) from /metrics.
func scrapeHistogram(ctx context.Context, port int, name string) (map[float64]float64, error) {
	body, err := getMetrics(ctx, port)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return parseHistogram(body, name)
}

// getMetrics fetches the connector's /metrics on the loopback port.
func getMetrics(ctx context.Context, port int) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

func parseHistogram(r io.Reader, name string) (map[float64]float64, error) {
	out := map[float64]float64{}
	sc := bufio.NewScanner(r)
	prefix := name + `_bucket{le="`
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		q := strings.IndexByte(rest, '"')
		if q < 0 {
			continue
		}
		le, err := strconv.ParseFloat(rest[:q], 64)
		if err != nil {
			continue
		}
		f := strings.Fields(rest[q:])
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		out[le] = v
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s buckets", name)
	}
	return out, sc.Err()
}

// histogramPercentiles interpolates quantiles of the observations between two
// scrapes, as PromQL's histogram_quantile does (linearly inside a bucket).
func histogramPercentiles(before, after map[float64]float64) Percentiles {
	les := make([]float64, 0, len(after))
	for le := range after {
		les = append(les, le)
	}
	sort.Float64s(les)
	counts := make([]float64, len(les))
	for i, le := range les {
		counts[i] = after[le] - before[le]
	}
	total := counts[len(counts)-1]
	q := func(p float64) float64 {
		if total == 0 {
			return 0
		}
		rank := p * total
		prevLe, prevCount := 0.0, 0.0
		for i, le := range les {
			if counts[i] >= rank {
				if math.IsInf(le, 1) {
					return prevLe * 1000
				}
				frac := 0.0
				if counts[i] > prevCount {
					frac = (rank - prevCount) / (counts[i] - prevCount)
				}
				return (prevLe + (le-prevLe)*frac) * 1000
			}
			prevLe, prevCount = le, counts[i]
		}
		return prevLe * 1000
	}
	pc := Percentiles{Count: int(total), P50: q(0.5), P90: q(0.9), P99: q(0.99), P999: q(0.999)}
	for i, le := range les {
		if le == 0.01 && total > 0 {
			share := counts[i] / total
			pc.Within10ms = &share
		}
	}
	return pc
}
