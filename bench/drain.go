package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/localenv"
)

// backlog is a set of outbox events already in the WAL when a drain starts.
type backlog struct {
	TxSize       int
	Events       int
	AggType      string
	Topic        string
	StartLSN     uint64
	EndLSN       uint64
	WriteSeconds float64
}

// writeBacklogSQL commits events in transactions of txSize, server-side. The
// session writes with synchronous_commit=off so that 200,000 one-event
// transactions take seconds, not minutes: the WAL the drains read is the same
// (each commit record is there either way); only the writer does not wait for
// each flush. The drains start once all of it is flushed.
const writeBacklogSQL = `
DO $$
DECLARE i int;
BEGIN
  FOR i IN 0..%d LOOP
    INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
    SELECT gen_random_uuid(), '%s', 'order-' || ((i::bigint * %d + g) %% 1000), 'OrderCreated',
           bench_payload(i::bigint * %d + g, 0)
    FROM generate_series(0, %d) AS g;
    COMMIT;
  END LOOP;
END $$`

func (b *bench) writeBacklog(ctx context.Context, conn *pgx.Conn, txSize, events int, aggType string) (backlog, error) {
	bl := backlog{TxSize: txSize, Events: events, AggType: aggType, Topic: "outbox.event." + aggType}
	txs := events / txSize
	if txs*txSize != events {
		return bl, fmt.Errorf("%d events do not divide into transactions of %d", events, txSize)
	}
	var start string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&start); err != nil {
		return bl, err
	}
	bl.StartLSN = parseLSN(start)
	t0 := time.Now()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return bl, err
	}
	// The simple protocol: a DO block that commits must not run inside the
	// implicit transaction of an extended-protocol batch.
	sql := fmt.Sprintf(writeBacklogSQL, txs-1, aggType, txSize, txSize, txSize-1)
	if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		return bl, fmt.Errorf("write backlog: %w", err)
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end); err != nil {
		return bl, err
	}
	bl.EndLSN = parseLSN(end)
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		return bl, err
	}
	// Wait for the WAL writer to flush what the session did not wait for:
	// walsenders send only flushed WAL.
	for {
		var flushed bool
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", end).Scan(&flushed); err != nil {
			return bl, err
		}
		if flushed {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	bl.WriteSeconds = time.Since(t0).Seconds()
	// Let the checkpointer and autovacuum settle a little so they do not land
	// on the first drain only.
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return bl, err
	}
	return bl, nil
}

func parseLSN(s string) uint64 {
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0
	}
	return uint64(l)
}

func fmtLSN(l uint64) string { return pglogrepl.LSN(l).String() }

func (bl backlog) run(system, slot string, repeat int) DrainRun {
	return DrainRun{System: system, TxSize: bl.TxSize, Events: bl.Events, Repeat: repeat, Slot: slot,
		StartLSN: fmtLSN(bl.StartLSN), EndLSN: fmtLSN(bl.EndLSN), WALBytes: int64(bl.EndLSN - bl.StartLSN)}
}

// drainRecv drains the backlog with pg_recvlogical: PostgreSQL's pgoutput
// decoder and walsender alone, the output thrown away, the ceiling.
func (b *bench) drainRecv(ctx context.Context, bl backlog, slot string, repeat int) DrainRun {
	r := bl.run(sysRecv, slot, repeat)
	bin := filepath.Join(b.env.pg.BinDir, "pg_recvlogical")
	cmd := exec.CommandContext(ctx, bin, "-d", b.env.dsn(), "--slot", slot, "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=outbox_pub",
		"-f", "/dev/null", "--endpos", fmtLSN(bl.EndLSN))
	broker := &cpuMeter{pid: b.env.kafkaPid}
	broker0 := broker.read()
	ws := &cpuMeter{}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		r.Error = err.Error()
		return r
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	conn, err := b.env.connect(ctx)
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		r.Error = err.Error()
		return r
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var werr error
wait:
	for {
		select {
		case werr = <-done:
			break wait
		case <-tick.C:
			if ws.pid == 0 {
				ws.pid = b.walsenderPID(ctx, conn, slot)
			}
			ws.read()
		}
	}
	el := time.Since(t0)
	if werr != nil {
		r.Error = fmt.Sprintf("pg_recvlogical: %v", werr)
		return r
	}
	st := cmd.ProcessState
	r.Seconds = el.Seconds()
	r.EventsPerSec = float64(bl.Events) / r.Seconds
	r.CPUSeconds = (st.UserTime() + st.SystemTime()).Seconds()
	r.CPUPer100k = r.CPUSeconds / float64(bl.Events) * 1e5
	r.WalsenderCPUSeconds = ws.last.Seconds()
	r.BrokerCPUSeconds = (broker.read() - broker0).Seconds()
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		r.PeakRSSBytes = ru.Maxrss * 1024
	}
	return r
}

func (b *bench) walsenderPID(ctx context.Context, conn *pgx.Conn, slot string) int {
	var pid *int
	if err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil || pid == nil {
		return 0
	}
	return *pid
}

// relayStart starts a relay process reading slot.
type relayStart func(slot string) (*sysProc, error)

// drainRelay drains the backlog with a relay (the connector, its profiled
// build, Debezium Server): started at the slot's position, done when every
// event is in Kafka and the slot's confirmed_flush_lsn reached the end.
func (b *bench) drainRelay(ctx context.Context, bl backlog, system, slot string, repeat int, start relayStart, timeout time.Duration) DrainRun {
	r := bl.run(system, slot, repeat)
	conn, err := b.env.connect(ctx)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer conn.Close(context.Background())
	base, err := b.env.endOffsets(ctx, bl.Topic)
	if err != nil {
		r.Error = fmt.Sprintf("read end offsets of %s: %v", bl.Topic, err)
		return r
	}
	want := base + int64(bl.Events)
	broker := &cpuMeter{pid: b.env.kafkaPid}
	broker0 := broker.read()
	p, err := start(slot)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer p.stop(30 * time.Second)
	ws := &cpuMeter{}
	var firstAt, kafkaAt, confAt time.Duration
	var cpuFirst time.Duration
	// A relay that confirms lazily (Debezium confirms on its offset flush)
	// is given this long after the last event reached Kafka.
	const confirmGrace = 10 * time.Second
	var lastConf string
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-ctx.Done():
			r.Error = ctx.Err().Error()
			return r
		case <-p.done:
			r.Error = fmt.Sprintf("%s exited before the drain completed (%v): %s", system, p.err, p.logTail(3000))
			return r
		case <-tick.C:
		}
		el := time.Since(p.started)
		if kafkaAt == 0 {
			n, err := b.env.endOffsets(ctx, bl.Topic)
			if err == nil {
				if n > base && firstAt == 0 {
					firstAt = el
					cpuFirst, _ = procCPU(p.pid)
				}
				if n >= want {
					kafkaAt = el
				}
			}
		}
		if confAt == 0 {
			var conf *string
			var pid *int
			if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&conf, &pid); err == nil {
				if conf != nil {
					lastConf = *conf
					if parseLSN(*conf) >= bl.EndLSN {
						confAt = el
					}
				}
				if pid != nil && ws.pid != *pid {
					ws = &cpuMeter{pid: *pid}
				}
			}
		}
		ws.read()
		if kafkaAt > 0 && (confAt > 0 || el-kafkaAt > confirmGrace) {
			break
		}
		if time.Now().After(deadline) {
			r.Error = fmt.Sprintf("%s did not drain %d events within %s (in Kafka after %.1fs: %v; confirmed: %v)", system, bl.Events, timeout, kafkaAt.Seconds(), kafkaAt > 0, confAt > 0)
			return r
		}
	}
	cpu, _ := procCPU(p.pid)
	_, hwm, _ := procMem(p.pid)
	if p.httpPort != 0 {
		if m, err := scrapeMetrics(ctx, p.httpPort); err == nil {
			r.KafkaTxns = sumSeries(m, "outbox_connector_kafka_transactions_total")
			r.KafkaTxnCommitSeconds = sumSeries(m, "outbox_connector_kafka_transaction_commit_seconds_sum")
		}
	}
	r.KafkaSeconds = kafkaAt.Seconds()
	r.FirstEventSeconds = firstAt.Seconds()
	r.Confirmed = confAt > 0
	if r.Confirmed {
		r.ConfirmedSeconds = confAt.Seconds()
		r.Seconds = math.Max(r.KafkaSeconds, r.ConfirmedSeconds)
	} else {
		r.Seconds = r.KafkaSeconds
	}
	r.EventsPerSec = float64(bl.Events) / r.Seconds
	if kafkaAt > firstAt {
		r.SteadyEventsPerSec = float64(bl.Events) / (kafkaAt - firstAt).Seconds()
	}
	r.ConfirmedLSN = lastConf
	if cpuFirst > 0 && kafkaAt > firstAt {
		r.SteadyCPUPer100k = (cpu - cpuFirst).Seconds() / float64(bl.Events) * 1e5
	}
	r.CPUSeconds = cpu.Seconds()
	r.CPUPer100k = r.CPUSeconds / float64(bl.Events) * 1e5
	r.WalsenderCPUSeconds = ws.last.Seconds()
	r.BrokerCPUSeconds = (broker.read() - broker0).Seconds()
	r.PeakRSSBytes = hwm
	return r
}

// connectorEnv is the environment of a connector process reading slot.
func (b *bench) connectorEnv(slot string, httpPort int) []string {
	return []string{
		"PATH=" + b.getenv("PATH"), "HOME=" + b.getenv("HOME"),
		"OUTBOX_PG_DSN=" + b.env.dsn(),
		"OUTBOX_KAFKA_BROKERS=" + b.env.brokers,
		"OUTBOX_SLOT=" + slot,
		"OUTBOX_SNAPSHOT=never",
		"OUTBOX_HTTP_ADDR=127.0.0.1:" + strconv.Itoa(httpPort),
		"OUTBOX_STATUS_INTERVAL=" + b.cfg.StatusInterval.String(),
		"OUTBOX_LOG_LEVEL=info",
	}
}

func (b *bench) startConnector(bin string, extra ...string) relayStart {
	return func(slot string) (*sysProc, error) {
		port, err := localenv.FreePort()
		if err != nil {
			return nil, err
		}
		env := append(b.connectorEnv(slot, port), extra...)
		p, err := startProc("connector", b.env.tmp, b.env.tmp, bin, nil, env)
		if err != nil {
			return nil, err
		}
		p.httpPort = port
		return p, nil
	}
}

var errNoRuns = errors.New("no successful run")

// summarize takes the median of each system's runs per transaction size.
func summarize(runs []DrainRun) []DrainSummary {
	type key struct {
		sys string
		tx  int
	}
	var order []key
	groups := map[key][]DrainRun{}
	for _, r := range runs {
		k := key{r.System, r.TxSize}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []DrainSummary
	for _, k := range order {
		s := DrainSummary{System: k.sys, TxSize: k.tx, MinPerSec: math.Inf(1)}
		var rates, cpus, scpus, wcpus, bcpus, utils, steady []float64
		for _, r := range groups[k] {
			if r.Error != "" {
				s.Error = r.Error
				continue
			}
			s.Runs++
			rates = append(rates, r.EventsPerSec)
			cpus = append(cpus, r.CPUPer100k)
			scpus = append(scpus, r.SteadyCPUPer100k)
			steady = append(steady, r.SteadyEventsPerSec)
			utils = append(utils, r.CPUSeconds/r.Seconds)
			wcpus = append(wcpus, r.WalsenderCPUSeconds/float64(r.Events)*1e5)
			bcpus = append(bcpus, r.BrokerCPUSeconds/float64(r.Events)*1e5)
			s.MinPerSec = math.Min(s.MinPerSec, r.EventsPerSec)
			s.MaxPerSec = math.Max(s.MaxPerSec, r.EventsPerSec)
			s.PeakRSSBytes = max(s.PeakRSSBytes, r.PeakRSSBytes)
		}
		if s.Runs == 0 {
			s.MinPerSec = 0
			if s.Error == "" {
				s.Error = errNoRuns.Error()
			}
		} else {
			s.Error = ""
			s.EventsPerSec = median(rates)
			s.CPUPer100k = median(cpus)
			s.SteadyCPU = median(scpus)
			s.SteadyPerSec = median(steady)
			s.CPUUtil = median(utils)
			s.WalsenderCPU = median(wcpus)
			s.BrokerCPU = median(bcpus)
		}
		out = append(out, s)
	}
	return out
}
