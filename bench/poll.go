package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/bench/chart"
)

// The poll part measures the connector's two kinds of relay side by side
// (OUTBOX_SOURCE=wal and poll, with and without the NOTIFY hint) under the
// same load: commit->consumer latency, and the CPU the PostgreSQL server
// spends per 10,000 events (every server process: the writers' backends,
// which cost the same for each, plus what the relay makes the server do:
// the walsender's decoding, or the poll's reads and marks); then poll
// mode's load on an idle database with 1, 3 and 10 instances.

const (
	sysPollWAL       = "WAL (defaults: exactly-once)"
	sysPollWALIdem   = "WAL (idempotent)"
	sysPollNotify    = "poll (NOTIFY)"
	sysPollNoNotify  = "poll (no NOTIFY)"
	pollIdleSettle   = 3 * time.Second
	pollIdleMeasured = 15 * time.Second
)

// PollRun is one system at one load level of the poll part.
type PollRun struct {
	LatencyRun
	// ServerCPUSeconds is the CPU time of every PostgreSQL server process
	// from the load's start to the last record consumed.
	ServerCPUSeconds float64 `json:"server_cpu_seconds"`
	// Events is what the writers committed in that time (warm-up too).
	Events int `json:"events"`
	// ServerCPUPer10k is ServerCPUSeconds per 10,000 events.
	ServerCPUPer10k float64 `json:"server_cpu_seconds_per_10k_events"`
}

// PollIdle is poll mode's cost on a database with no events.
type PollIdle struct {
	Instances int     `json:"instances"`
	Seconds   float64 `json:"measured_seconds"`
	// QueriesPerSec is the statements every instance ran, per second
	// (outbox_connector_poll_queries_total).
	QueriesPerSec float64 `json:"queries_per_sec"`
	// ServerCPU and RelayCPU are CPU seconds per second (cores busy).
	ServerCPU float64 `json:"server_cpu_cores"`
	RelayCPU  float64 `json:"relays_cpu_cores"`
	Error     string  `json:"error,omitempty"`
}

// pollPart runs the poll part. The outbox table is emptied and prepared
// for poll mode first (sql/variants/outbox_poll.sql), for every system
// alike: the WAL mode's inserts then take a sequence value too.
func (b *bench) pollPart(ctx context.Context) ([]PollRun, []PollIdle, error) {
	conn, err := b.env.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "TRUNCATE public.outbox"); err != nil {
		return nil, nil, err
	}
	if err := b.env.pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", filepath.Join(b.root, "sql/variants/outbox_poll.sql")); err != nil {
		return nil, nil, fmt.Errorf("apply sql/variants/outbox_poll.sql: %w", err)
	}
	w, err := openWriters(ctx, b.env, b.cfg.Writers)
	if err != nil {
		return nil, nil, err
	}
	defer w.close()
	type system struct {
		name   string
		poll   bool
		notify bool
		env    []string
	}
	systems := []system{
		{name: sysPollWAL},
		{name: sysPollWALIdem, env: []string{"OUTBOX_KAFKA_TRANSACTIONAL=false"}},
		{name: sysPollNotify, poll: true, notify: true, env: []string{"OUTBOX_SOURCE=poll"}},
		{name: sysPollNoNotify, poll: true, env: []string{"OUTBOX_SOURCE=poll", "OUTBOX_POLL_NOTIFY_CHANNEL=off"}},
	}
	var runs []PollRun
	for i, rate := range b.cfg.Rates {
		if rate > 5000 {
			continue
		}
		perTx := b.cfg.PerTx[i]
		for si, s := range systems {
			if ctx.Err() != nil {
				return runs, nil, ctx.Err()
			}
			if !b.deadline.IsZero() && time.Now().After(b.deadline) {
				b.res.Notes = append(b.res.Notes, fmt.Sprintf("poll part at %d events/s (%s) and after skipped: time budget spent", rate, s.name))
				return runs, nil, nil
			}
			if err := b.setNotifyTrigger(ctx, conn, s.notify); err != nil {
				return runs, nil, err
			}
			r := b.pollLevel(ctx, conn, s.name, fmt.Sprintf("poll%d_%d", si, rate), s.poll, s.env, rate, perTx, w)
			b.log.Info("poll part", "system", s.name, "rate", rate, "p50_ms", r.CommitToConsumer.P50, "p99_ms", r.CommitToConsumer.P99,
				"server_cpu_s_per_10k", fmt.Sprintf("%.2f", r.ServerCPUPer10k), "err", r.Error)
			runs = append(runs, r)
		}
	}
	if err := b.setNotifyTrigger(ctx, conn, true); err != nil {
		return runs, nil, err
	}
	var idle []PollIdle
	for _, n := range []int{1, 3, 10} {
		if ctx.Err() != nil {
			break
		}
		idle = append(idle, b.pollIdle(ctx, n))
		b.log.Info("poll part, idle", "instances", n, "queries_per_sec", fmt.Sprintf("%.1f", idle[len(idle)-1].QueriesPerSec),
			"server_cores", fmt.Sprintf("%.4f", idle[len(idle)-1].ServerCPU))
	}
	return runs, idle, nil
}

// setNotifyTrigger creates or drops the variant's NOTIFY trigger: the
// writers pay for it, so only the system that uses it has it.
func (b *bench) setNotifyTrigger(ctx context.Context, conn *pgx.Conn, on bool) error {
	q := "DROP TRIGGER IF EXISTS outbox_poll_notify ON public.outbox"
	if on {
		q = `DROP TRIGGER IF EXISTS outbox_poll_notify ON public.outbox;
CREATE TRIGGER outbox_poll_notify AFTER INSERT ON public.outbox FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_poll_notify()`
	}
	_, err := conn.Exec(ctx, q)
	return err
}

// pollLevel runs one system at one load level.
func (b *bench) pollLevel(ctx context.Context, conn *pgx.Conn, system, name string, poll bool, extra []string, rate, perTx int, w *writers) PollRun {
	r := PollRun{LatencyRun: LatencyRun{System: system, Rate: rate, EventsPerTx: perTx}}
	fail := func(err error) PollRun {
		r.Error = err.Error()
		return r
	}
	// What earlier systems wrote is published by them, not by this one.
	if _, err := conn.Exec(ctx, "UPDATE public.outbox SET published_at = now() WHERE published_at IS NULL"); err != nil {
		return fail(err)
	}
	if _, err := conn.Exec(ctx, "VACUUM public.outbox"); err != nil {
		return fail(err)
	}
	slot := "lat_" + name
	if !poll {
		if err := b.env.createSlot(ctx, conn, slot); err != nil {
			return fail(err)
		}
		defer b.env.dropSlot(context.Background(), slot)
	}
	aggType := "lat_" + name
	if err := b.env.createTopic(ctx, "outbox.event."+aggType); err != nil {
		return fail(err)
	}
	p, err := b.startConnector(b.env.connectorBin, extra...)(slot)
	if err != nil {
		return fail(err)
	}
	defer p.stop(30 * time.Second)
	if poll {
		err = b.waitPolling(ctx, p, 3*time.Minute)
	} else {
		err = b.waitStreaming(ctx, conn, p, slot, 3*time.Minute)
	}
	if err != nil {
		return fail(err)
	}
	cpu0, err := serverCPU(ctx, conn)
	if err != nil {
		return fail(err)
	}
	r.LatencyRun = b.latencyRun(ctx, system, p, aggType, rate, perTx, w)
	cpu1, err := serverCPU(ctx, conn)
	if err != nil {
		return fail(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM public.outbox WHERE aggregatetype = $1", aggType).Scan(&r.Events); err != nil {
		return fail(err)
	}
	r.ServerCPUSeconds = (cpu1 - cpu0).Seconds()
	if r.Events > 0 {
		r.ServerCPUPer10k = r.ServerCPUSeconds / float64(r.Events) * 1e4
	}
	return r
}

// waitPolling waits until a poll-mode connector owns buckets, then a
// little longer for its producer.
func (b *bench) waitPolling(ctx context.Context, p *sysProc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return fmt.Errorf("%s exited during start: %s", p.name, p.logTail(3000))
		}
		if m, err := scrapeMetrics(ctx, p.httpPort); err == nil && sumSeries(m, "outbox_connector_poll_buckets_owned") > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s owned no bucket within %s: %s", p.name, timeout, p.logTail(3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	return nil
}

// pollIdle measures n poll-mode instances on a database with no events.
func (b *bench) pollIdle(ctx context.Context, n int) PollIdle {
	r := PollIdle{Instances: n, Seconds: pollIdleMeasured.Seconds()}
	conn, err := b.env.connect(ctx)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer conn.Close(context.Background())
	var procs []*sysProc
	defer func() {
		for _, p := range procs {
			p.stop(30 * time.Second)
		}
	}()
	for range n {
		p, err := b.startConnector(b.env.connectorBin, "OUTBOX_SOURCE=poll")("unused")
		if err != nil {
			r.Error = err.Error()
			return r
		}
		procs = append(procs, p)
	}
	// Every bucket owned, the shares within one of each other: the
	// buckets have settled.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		owned, lo, hi := 0.0, math.Inf(1), 0.0
		for _, p := range procs {
			m, err := scrapeMetrics(ctx, p.httpPort)
			if err != nil {
				lo = math.Inf(-1)
				continue
			}
			v := sumSeries(m, "outbox_connector_poll_buckets_owned")
			owned, lo, hi = owned+v, math.Min(lo, v), math.Max(hi, v)
		}
		if owned == 16 && hi-lo <= 1 {
			break
		}
		if time.Now().After(deadline) {
			r.Error = fmt.Sprintf("the %d instances own %.0f of 16 buckets after 2 minutes", n, owned)
			return r
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(pollIdleSettle)
	read := func() (queries float64, relay time.Duration, server time.Duration, err error) {
		for _, p := range procs {
			m, err := scrapeMetrics(ctx, p.httpPort)
			if err != nil {
				return 0, 0, 0, err
			}
			queries += sumSeries(m, "outbox_connector_poll_queries_total")
			c, _ := procCPU(p.pid)
			relay += c
		}
		server, err = serverCPU(ctx, conn)
		return queries, relay, server, err
	}
	q0, rc0, sc0, err := read()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	time.Sleep(pollIdleMeasured)
	q1, rc1, sc1, err := read()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	secs := pollIdleMeasured.Seconds()
	r.QueriesPerSec = (q1 - q0) / secs
	r.RelayCPU = (rc1 - rc0).Seconds() / secs
	r.ServerCPU = (sc1 - sc0).Seconds() / secs
	return r
}

// serverCPU is the CPU time so far of the postmaster and every process it
// started (backends, walsenders, the checkpointer, autovacuum...): those
// alive now, which are the long-lived ones a measurement spans.
func serverCPU(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return 0, err
	}
	pidFile, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0]))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	total, err := procCPU(pm)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || procParent(pid) != pm {
			continue
		}
		if c, err := procCPU(pid); err == nil {
			total += c
		}
	}
	return total, nil
}

// pollSystems are the poll part's systems in report order.
var pollSystems = []string{sysPollWAL, sysPollWALIdem, sysPollNotify, sysPollNoNotify}

func findPoll(res *Results, sys string, rate int) *PollRun {
	for i := range res.Poll {
		if r := &res.Poll[i]; r.System == sys && r.Rate == rate {
			return r
		}
	}
	return nil
}

func pollRates(res *Results) []int {
	var out []int
	for _, r := range res.Poll {
		if len(out) == 0 || out[len(out)-1] != r.Rate {
			out = append(out, r.Rate)
		}
	}
	return out
}

// pollCharts draws the poll part's latency and server CPU.
func (b *bench) pollCharts(save func(string, *chart.Bars) error) error {
	res := &b.res
	if len(res.Poll) == 0 {
		return nil
	}
	nan := math.NaN()
	lat := &chart.Bars{Title: "The two relays: commit to consumer (read_committed), ms, log scale", YLabel: "milliseconds", LogY: true, Format: fmtMS, Width: 1200, Height: 560}
	cpu := &chart.Bars{Title: "The two relays: PostgreSQL server CPU seconds per 10,000 events (writers included)", YLabel: "CPU seconds",
		Format: func(v float64) string { return fmt.Sprintf("%.2f", v) }}
	rates := pollRates(res)
	for _, rate := range rates {
		lat.Groups = append(lat.Groups, fmt.Sprintf("%d/s p50", rate), fmt.Sprintf("%d/s p99", rate))
		cpu.Groups = append(cpu.Groups, fmt.Sprintf("%d events/s", rate))
	}
	for _, sys := range pollSystems {
		ls, cs := chart.Series{Name: sys}, chart.Series{Name: sys}
		for _, rate := range rates {
			r := findPoll(res, sys, rate)
			if r == nil || r.Error != "" {
				ls.Values = append(ls.Values, nan, nan)
				cs.Values = append(cs.Values, nan)
				continue
			}
			ls.Values = append(ls.Values, positive(r.CommitToConsumer.P50), positive(r.CommitToConsumer.P99))
			cs.Values = append(cs.Values, r.ServerCPUPer10k)
		}
		lat.Series = append(lat.Series, ls)
		cpu.Series = append(cpu.Series, cs)
	}
	if err := save("poll_latency", lat); err != nil {
		return err
	}
	return save("poll_server_cpu", cpu)
}

func positive(v float64) float64 {
	if v <= 0 {
		return math.NaN()
	}
	return v
}

// pollMarkdown is the report's section on the two relays.
func (b *bench) pollMarkdown(w *strings.Builder, charts map[string]string) {
	res := &b.res
	if len(res.Poll) == 0 && len(res.PollIdle) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## The two relays: WAL and poll\n\n")
	p("The connector reading the slot (`OUTBOX_SOURCE=wal`) and reading the table (`OUTBOX_SOURCE=poll`, `OUTBOX_POLL_INTERVAL` 100 ms, with the NOTIFY trigger of `sql/variants/outbox_poll.sql` and without it), one process each in turn at each load level, the same writers (%d connections, %s warm-up, %s measured). The outbox table is emptied and prepared for poll mode first, for every system alike (its inserts take a sequence value); the NOTIFY trigger exists only while the poll mode that listens runs, since every writer pays for it. Server CPU is every PostgreSQL process's (postmaster and children) from the load's start to the last record consumed, per 10,000 events committed meanwhile: the writers' backends cost the same for every system, the rest is what the relay makes the server do (the walsender's decoding, or the poll's reads and marks).\n\n",
		res.Settings.Writers, res.Settings.Warmup, res.Settings.Measure)
	p("| system | events/s | events/tx | commit→consumer p50 | p99 | p99.9 | server CPU s per 10k events | relay CPU s per 100k events | received | error |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, rate := range pollRates(res) {
		for _, sys := range pollSystems {
			r := findPoll(res, sys, rate)
			if r == nil {
				continue
			}
			p("| %s | %d | %d | %s | %s | %s | %s | %s | %d of %d | %s |\n", sys, r.Rate, r.EventsPerTx,
				fmtMS(r.CommitToConsumer.P50), fmtMS(r.CommitToConsumer.P99), fmtMS(r.CommitToConsumer.P999),
				dash(r.ServerCPUPer10k), dash(r.CPUPer100k), r.Received, r.Sent, orDash(oneLine(r.Error, 200)))
		}
	}
	for _, k := range []string{"poll_latency", "poll_server_cpu"} {
		if c, ok := charts[k]; ok {
			p("\n![%s](%s)\n", k, c)
		}
	}
	if len(res.PollIdle) > 0 {
		p("\nPoll mode on an idle database (no events; the NOTIFY trigger in place, which costs nothing without inserts): every instance reads its buckets each `OUTBOX_POLL_INTERVAL` (100 ms) and looks for the other readers once a second; measured for %s after the buckets settled.\n\n", pollIdleMeasured)
		p("| instances | statements/s (all instances) | PostgreSQL server CPU (cores) | relays' CPU (cores, all instances) | error |\n| ---: | ---: | ---: | ---: | --- |\n")
		for _, r := range res.PollIdle {
			p("| %d | %.1f | %.4f | %.4f | %s |\n", r.Instances, r.QueriesPerSec, r.ServerCPU, r.RelayCPU, orDash(oneLine(r.Error, 200)))
		}
	}
	p("\n")
}
