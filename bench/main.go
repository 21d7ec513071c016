// Command bench measures the connector side by side with PostgreSQL's own
// decoder (pg_recvlogical) and Debezium Server on one machine in one run:
// the drain of a backlog of outbox events, commit-to-Kafka latency under
// steady load, and the CPU and memory each system spends. It starts real
// PostgreSQL (fsync on) and a real Kafka broker, cleans up everything it
// starts, and writes bench/results/*.json, PNG charts and bench/REPORT.md.
//
//	make bench            # or: go run ./bench [flags]
//	go run ./bench -help  # settings (every flag also reads a BENCH_* variable)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/localenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Settings are the bench's knobs; the defaults are what the issue asks for.
type Settings struct {
	Events         int
	TxSizes        []int
	Repeats        int
	Rates          []int
	PerTx          []int
	Warmup         time.Duration
	Measure        time.Duration
	Writers        int
	StatusInterval time.Duration
	Debezium       bool
	DebeziumJava   string
	Profile        bool
	Only           map[string]bool
	Budget         time.Duration
	OutDir         string
	Report         string
	Rerender       string

	txSizes, rates, perTx, only string
}

func (s *Settings) bind(fs *flag.FlagSet, getenv func(string) string) *iconfig.Binder {
	b := iconfig.NewBinder(fs, getenv)
	b.Int(&s.Events, "events", "BENCH_EVENTS", 200000, "events in each drain backlog")
	b.String(&s.txSizes, "tx-sizes", "BENCH_TX_SIZES", "1,100", "events per transaction of the drain backlogs")
	b.Int(&s.Repeats, "repeats", "BENCH_REPEATS", 3, "drains of each backlog by pg_recvlogical and by the connector (the median is reported)")
	b.String(&s.rates, "rates", "BENCH_RATES", "1000,5000,10000", "latency load levels, events/s")
	b.String(&s.perTx, "events-per-tx", "BENCH_EVENTS_PER_TX", "1,5,10", "events per transaction at each load level (same for every system)")
	b.Duration(&s.Warmup, "warmup", "BENCH_WARMUP", 5*time.Second, "load before each latency measurement")
	b.Duration(&s.Measure, "measure", "BENCH_MEASURE", 20*time.Second, "measured load per level")
	b.Int(&s.Writers, "writers", "BENCH_WRITERS", 16, "writer connections of the latency load")
	b.Duration(&s.StatusInterval, "connector-status-interval", "BENCH_CONNECTOR_STATUS_INTERVAL", 100*time.Millisecond,
		"the connector's OUTBOX_STATUS_INTERVAL during the bench (its default, 1s, would add up to 2s of confirmation delay to a drain of a few seconds)")
	b.Bool(&s.Debezium, "debezium", "BENCH_DEBEZIUM", true, "measure Debezium Server too (resolves debezium-server-dist from Maven Central on the first run)")
	b.String(&s.DebeziumJava, "debezium-java", "BENCH_DEBEZIUM_JAVA", "", "java binary (21+) for Debezium Server; default: the newest JDK under /usr/lib/jvm")
	b.Bool(&s.Profile, "profile", "BENCH_PROFILE", true, "profile a connector drain with pprof")
	b.String(&s.only, "only", "BENCH_ONLY", "drain,latency,poll,micro", "parts to run: drain, latency, poll (the two relay kinds side by side, and poll mode's idle load), micro (the hot paths' go test benchmarks); hold: start the environment, print it and wait, for development")
	b.Duration(&s.Budget, "budget", "BENCH_BUDGET", 28*time.Minute, "time budget; parts not started within it are skipped and reported so")
	b.String(&s.OutDir, "out", "BENCH_OUT", "bench/results", "directory for the JSON results and charts (relative to the module root)")
	b.String(&s.Report, "report", "BENCH_REPORT", "bench/REPORT.md", "the report (relative to the module root)")
	b.String(&s.Rerender, "rerender", "BENCH_RERENDER", "", "measure nothing: render the report and charts again from this run.json")
	return b
}

func (s *Settings) validate() error {
	var errs []error
	var err error
	if s.TxSizes, err = ints(s.txSizes); err != nil {
		errs = append(errs, fmt.Errorf("BENCH_TX_SIZES: %w", err))
	}
	if s.Rates, err = ints(s.rates); err != nil {
		errs = append(errs, fmt.Errorf("BENCH_RATES: %w", err))
	}
	if s.PerTx, err = ints(s.perTx); err != nil {
		errs = append(errs, fmt.Errorf("BENCH_EVENTS_PER_TX: %w", err))
	}
	if len(s.Rates) != len(s.PerTx) {
		errs = append(errs, fmt.Errorf("BENCH_EVENTS_PER_TX: %d values for %d rates; give one per rate", len(s.PerTx), len(s.Rates)))
	}
	for _, t := range s.TxSizes {
		if s.Events%t != 0 {
			errs = append(errs, fmt.Errorf("BENCH_EVENTS: %d is not a multiple of the transaction size %d", s.Events, t))
		}
	}
	if s.Repeats < 1 || s.Writers < 1 || s.Events < 1 {
		errs = append(errs, errors.New("BENCH_REPEATS, BENCH_WRITERS and BENCH_EVENTS must be positive"))
	}
	s.Only = map[string]bool{}
	for _, p := range strings.Split(s.only, ",") {
		switch p = strings.TrimSpace(p); p {
		case "drain", "latency", "poll", "micro", "hold":
			s.Only[p] = true
		case "":
		default:
			errs = append(errs, fmt.Errorf("BENCH_ONLY: unknown part %q; use drain, latency, poll, micro", p))
		}
	}
	return errors.Join(errs...)
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// bench is one run.
type bench struct {
	cfg    Settings
	log    *slog.Logger
	env    *env
	getenv func(string) string
	root   string
	out    string
	res    Results
	dbz    *debezium
	// variants are the connector configurations measured; the first is
	// the connector's defaults.
	variants []variant
	// deadline is when the time budget is spent: parts and latency levels
	// not started by then are skipped, and the report says so.
	deadline time.Time
}

// variant is one connector configuration: its defaults, or a documented
// alternative the binary offers.
type variant struct {
	Name string   `json:"name"`
	Env  []string `json:"env,omitempty"`
	Note string   `json:"note"`
	// Profile: also drain with the profiled build.
	Profile bool `json:"profiled"`
}

// sysConnectorOneTxn is the default mode with one transactional producer
// (no pipelined commits), when the binary has the setting.
const sysConnectorOneTxn = "connector (one transactional producer)"

// sysConnectorIdem is the connector with Kafka transactions off, when the
// binary has the setting.
const sysConnectorIdem = "connector (idempotent)"

// sysConnectorLinger is the idempotent producer with the other linger than
// the binary's default: 1 ms against a binary whose default is 0 (the
// batching change the first profiles pointed at, measured without editing
// the connector), 0 against one whose default is 1 ms (what the default
// saves).
const (
	sysConnectorLinger  = "connector (idempotent, linger 1ms)"
	sysConnectorLinger0 = "connector (idempotent, linger 0)"
)

// connectorVariants asks the connector binary which settings it has: when it
// produces in Kafka transactions by default, the idempotent producer is
// measured too, as the setting it offers.
func connectorVariants(ctx context.Context, bin string) []variant {
	vs := []variant{{Name: sysConnector, Note: "the connector's defaults", Profile: true}}
	out, _ := exec.CommandContext(ctx, bin, "-help").CombinedOutput()
	linger := "0"
	if bytes.Contains(out, []byte("OUTBOX_KAFKA_LINGER) (default 1ms)")) {
		linger = "1ms"
	}
	if bytes.Contains(out, []byte("OUTBOX_KAFKA_TRANSACTIONAL")) {
		vs[0].Note = "the connector's defaults: Kafka transactions (OUTBOX_KAFKA_TRANSACTIONAL=true, OUTBOX_KAFKA_TXN_INTERVAL=100ms), producer linger " + linger
		if bytes.Contains(out, []byte("OUTBOX_KAFKA_TXN_PIPELINE")) {
			vs[0].Note = "the connector's defaults: exactly-once, Kafka transactions carrying the position, two transactional producers in turn (OUTBOX_KAFKA_TXN_PIPELINE=true), producer linger " + linger
			vs = append(vs, variant{Name: sysConnectorOneTxn, Env: []string{"OUTBOX_KAFKA_TXN_PIPELINE=false"},
				Note: "OUTBOX_KAFKA_TXN_PIPELINE=false: exactly-once with one transactional producer, every commit stopping the line"})
		}
		vs = append(vs, variant{Name: sysConnectorIdem, Env: []string{"OUTBOX_KAFKA_TRANSACTIONAL=false"}, Profile: true,
			Note: "OUTBOX_KAFKA_TRANSACTIONAL=false: the idempotent producer (acks=all), no Kafka transactions, linger " + linger})
		switch {
		case linger == "1ms":
			vs = append(vs, variant{Name: sysConnectorLinger0, Env: []string{"OUTBOX_KAFKA_TRANSACTIONAL=false", "OUTBOX_KAFKA_LINGER=0"},
				Note: "OUTBOX_KAFKA_TRANSACTIONAL=false OUTBOX_KAFKA_LINGER=0: the idempotent producer sending at once"})
		case bytes.Contains(out, []byte("OUTBOX_KAFKA_LINGER")):
			vs = append(vs, variant{Name: sysConnectorLinger, Env: []string{"OUTBOX_KAFKA_TRANSACTIONAL=false", "OUTBOX_KAFKA_LINGER=1ms"},
				Note: "OUTBOX_KAFKA_TRANSACTIONAL=false OUTBOX_KAFKA_LINGER=1ms: the idempotent producer waiting up to 1 ms to fill batches"})
		}
	}
	return vs
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Settings
	binder := cfg.bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := errors.Join(binder.Err(), cfg.validate()); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "bench")
	root := localenv.RepoRoot()
	b := &bench{cfg: cfg, log: log, getenv: getenv, root: root, out: abs(root, cfg.OutDir)}
	if err := os.MkdirAll(b.out, 0o755); err != nil {
		return err
	}
	if cfg.Rerender != "" {
		return b.rerender(stdout)
	}
	b.res.StartedAt = time.Now().UTC()
	b.res.Machine = machine()
	b.res.Settings = cfg
	deadline := time.Now().Add(cfg.Budget)
	b.deadline = deadline
	defer killAll()

	// Debezium Server's distribution is large: resolve it while the rest
	// starts, and before anything is measured.
	var dbzReady chan struct{}
	if cfg.Debezium {
		b.dbz = &debezium{log: log, root: root, java: cfg.DebeziumJava}
		dbzReady = make(chan struct{})
		go func() {
			defer close(dbzReady)
			b.dbz.install(ctx)
		}()
	}

	e, err := startEnv(ctx, log, root)
	if err != nil {
		if dbzReady != nil {
			<-dbzReady
		}
		return err
	}
	defer e.close()
	b.env = e
	if e.buildNote != "" {
		b.res.Notes = append(b.res.Notes, e.buildNote)
	}
	b.res.Source = e.source(ctx)
	b.variants = connectorVariants(ctx, e.connectorBin)
	b.res.Variants = b.variants
	if dbzReady != nil {
		log.Info("waiting for Debezium Server's distribution")
		<-dbzReady
		b.res.Debezium = b.dbz.status()
		if b.dbz.err != nil {
			log.Warn("Debezium Server is not available; measuring without it", "err", b.dbz.err)
		}
	}

	if cfg.Only["hold"] {
		// For development: the environment, until interrupted.
		fmt.Fprintf(stdout, "OUTBOX_PG_DSN=%s\nOUTBOX_KAFKA_BROKERS=%s\nCONNECTOR=%s\nPPROF_CONNECTOR=%s\n", e.dsn(), e.brokers, e.connectorBin, e.pprofBin)
		<-ctx.Done()
		return nil
	}
	if cfg.Only["drain"] {
		for _, tx := range cfg.TxSizes {
			if time.Now().After(deadline) {
				b.res.Notes = append(b.res.Notes, fmt.Sprintf("drain of transactions of %d skipped: time budget (%s) spent", tx, cfg.Budget))
				continue
			}
			if err := b.drains(ctx, tx); err != nil {
				log.Error("drain", "tx_size", tx, "err", err)
				b.res.Notes = append(b.res.Notes, fmt.Sprintf("drain of transactions of %d: %v", tx, err))
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	if cfg.Only["latency"] && ctx.Err() == nil {
		if time.Now().After(deadline) {
			b.res.Notes = append(b.res.Notes, "latency skipped: time budget spent")
		} else {
			b.res.Latency = b.latencyLevels(ctx)
		}
	}
	if cfg.Only["poll"] && ctx.Err() == nil {
		if time.Now().After(deadline) {
			b.res.Notes = append(b.res.Notes, "poll part skipped: time budget spent")
		} else {
			var err error
			b.res.Poll, b.res.PollIdle, err = b.pollPart(ctx)
			if err != nil {
				log.Error("poll part", "err", err)
				b.res.Notes = append(b.res.Notes, fmt.Sprintf("poll part: %v", err))
			}
		}
	}
	if cfg.Only["micro"] && ctx.Err() == nil {
		b.log.Info("go test -bench of the hot paths")
		var notes []string
		b.res.Micro, notes = b.micro(ctx)
		b.res.Notes = append(b.res.Notes, notes...)
	}
	if b.dbz != nil {
		b.res.Debezium.Config = b.dbz.props
	}
	b.res.DrainSummary = summarize(b.res.Drains)
	b.res.Versions = b.versions(context.WithoutCancel(ctx))
	b.res.Goals = goals(&b.res)
	b.res.Machine.LoadEnd = loadAvg()
	b.res.FinishedAt = time.Now().UTC()
	if ctx.Err() != nil {
		// An interrupted run does not replace the last complete report.
		return fmt.Errorf("interrupted; %s left as it was: %w", cfg.Report, ctx.Err())
	}
	if err := b.write(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "bench: wrote %s and %s\n", filepath.Join(cfg.OutDir, "*.json"), cfg.Report)
	return ctx.Err()
}

// rerender writes the report and charts again from a run's results.
func (b *bench) rerender(stdout io.Writer) error {
	body, err := os.ReadFile(b.cfg.Rerender)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, &b.res); err != nil {
		return fmt.Errorf("%s: %w", b.cfg.Rerender, err)
	}
	b.res.DrainSummary = summarize(b.res.Drains)
	b.res.Goals = goals(&b.res)
	if err := b.write(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "bench: rendered %s from %s\n", b.cfg.Report, b.cfg.Rerender)
	return nil
}

// drains measures every system draining one backlog of transactions of tx.
func (b *bench) drains(ctx context.Context, tx int) error {
	conn, err := b.env.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var slots []string
	slot := func(name string) string {
		s := fmt.Sprintf("%s_tx%d", name, tx)
		slots = append(slots, s)
		return s
	}
	type run struct {
		slot  string
		drain func(slot string) DrainRun
	}
	// Interleaved, so that a disturbance on the shared machine does not land
	// on one system only: pg_recvlogical, then each connector variant, per
	// repeat; then the profiled drains and Debezium Server.
	var runs []run
	bl := backlog{}
	for r := range b.cfg.Repeats {
		runs = append(runs, run{slot(fmt.Sprintf("recv%d", r+1)), func(s string) DrainRun { return b.drainRecv(ctx, bl, s, r+1) }})
		for i, v := range b.variants {
			runs = append(runs, run{slot(fmt.Sprintf("conn%d_%d", i, r+1)), func(s string) DrainRun {
				return b.drainRelay(ctx, bl, v.Name, s, r+1, b.startConnector(b.env.connectorBin, v.Env...), 5*time.Minute)
			}})
		}
	}
	if b.cfg.Profile {
		for i, v := range b.variants {
			if !v.Profile {
				continue
			}
			runs = append(runs, run{slot(fmt.Sprintf("prof%d", i)), func(s string) DrainRun {
				pr := b.profileDrain(ctx, bl, v, s)
				b.res.Profiles = append(b.res.Profiles, pr)
				return pr.Drain
			}})
		}
	}
	if b.dbz != nil && b.dbz.err == nil {
		runs = append(runs, run{slot("dbz"), func(s string) DrainRun {
			r := b.drainRelay(ctx, bl, sysDebezium, s, 1, b.dbz.start(b), 10*time.Minute)
			b.res.Debezium.Ran = b.res.Debezium.Ran || r.Error == ""
			if r.Error != "" && b.res.Debezium.Error == "" {
				b.res.Debezium.Error = r.Error
			}
			return r
		}})
	}
	defer func() {
		for _, s := range slots {
			b.env.dropSlot(context.Background(), s)
		}
	}()
	for _, r := range runs {
		if err := b.env.createSlot(ctx, conn, r.slot); err != nil {
			return err
		}
	}
	aggType := fmt.Sprintf("drain_tx%d", tx)
	if err := b.env.createTopic(ctx, "outbox.event."+aggType); err != nil {
		return err
	}
	b.log.Info("writing the backlog", "events", b.cfg.Events, "tx_size", tx)
	bl, err = b.writeBacklog(ctx, conn, tx, b.cfg.Events, aggType)
	if err != nil {
		return err
	}
	b.log.Info("backlog written", "seconds", fmt.Sprintf("%.1f", bl.WriteSeconds), "wal_bytes", bl.EndLSN-bl.StartLSN)
	for _, r := range runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := r.drain(r.slot)
		b.res.Drains = append(b.res.Drains, d)
		b.log.Info("drained", "system", d.System, "tx_size", d.TxSize, "repeat", d.Repeat,
			"events_per_sec", fmt.Sprintf("%.0f", d.EventsPerSec), "seconds", fmt.Sprintf("%.2f", d.Seconds),
			"cpu_s", fmt.Sprintf("%.2f", d.CPUSeconds), "peak_rss_mib", d.PeakRSSBytes>>20, "err", d.Error)
		// Dropping the slot at once lets PostgreSQL recycle the WAL
		// only the later readers still need.
		b.env.dropSlot(ctx, r.slot)
	}
	return nil
}

func abs(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}
