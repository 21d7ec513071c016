// Command connector relays committed outbox rows from PostgreSQL's WAL
// (logical replication, pgoutput) to Kafka, confirming each position to
// PostgreSQL only after Kafka acknowledged everything before it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/connector/backfill"
	"github.com/pgoutbox/pgoutbox/connector/redrive"
	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/probe"
	"github.com/pgoutbox/pgoutbox/internal/rowsecurity"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/internal/webconfig"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/route"
)

func main() { cli.Main("connector", envRule(), run) }

// envRule: the connector refuses OUTBOX_* variables it does not read.
// OUTBOX_ROUTER_* are outbox-router's, which checks them.
func envRule() iconfig.EnvRule {
	return iconfig.EnvRule{Prefixes: []string{"OUTBOX_"}, Others: []string{"OUTBOX_ROUTER_"}, Known: config.EnvVars()}
}

// command is one of the connector's subcommands; -help lists them.
type command struct{ name, args, summary string }

// commands are the connector's subcommands, run first: a command line
// that starts with a flag, or with nothing, is run's.
var commands = []command{
	{"run", "[flags]", "relay committed outbox rows to Kafka, as leader or standby behind the lease (the default)"},
	{"recover", "[-allow-gap] [flags]", "run with OUTBOX_ON_SLOT_LOSS=recover: a lost slot is replaced and the events it may not have delivered are published again from the outbox table"},
	{"backfill", "-from TIME [-to TIME] [flags]", "publish again the outbox rows of a time range, resumably"},
	{"redrive", "[-from table|topic] [flags]", "publish again the dead letters with the current settings"},
	{"switch-to-poll", "[flags]", "mark published the outbox rows the WAL relay's state proves delivered, so that poll mode (OUTBOX_SOURCE=poll) does not publish the whole table again (after sql/variants/outbox_poll.sql; README, switching relays)"},
	{"probe", "URL", "exit 0 when URL answers 200, else 1 (a container health check, e.g. http://127.0.0.1:9189/readyz)"},
}

// commandList is the list -help and a refusal print.
func commandList() string {
	var b strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	return b.String()
}

// usage is the help of the command name on fs: the commands, then the
// flags (every setting is a flag and an environment variable).
// envInUsage finds the variable a setting's help names.
var envInUsage = regexp.MustCompile(`\(env (\w+)\)`)

func usage(fs *flag.FlagSet, name string, w io.Writer) func() {
	return func() {
		var cmd command
		for _, c := range commands {
			if c.name == name {
				cmd = c
			}
		}
		fmt.Fprintf(w, "Usage: connector %s %s\n\n%s.\n\n", cmd.name, cmd.args, cmd.summary)
		fmt.Fprintf(w, "Commands (connector with no command runs run):\n%s\n", commandList())
		var required []string
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Usage, config.Required) {
				r := "-" + f.Name
				if m := envInUsage.FindStringSubmatch(f.Usage); m != nil {
					r += " (" + m[1] + ")"
				}
				required = append(required, r)
			}
		})
		fmt.Fprintf(w, "Settings of connector %s: each flag is also read from the environment variable named "+
			"(NAME_FILE reads NAME's value from a file). Required: %s; the others have defaults.\n", name, strings.Join(required, ", "))
		fs.PrintDefaults()
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	name := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if !slices.ContainsFunc(commands, func(c command) bool { return c.name == name }) {
		return cli.Usagef("unknown command %q; the commands are:\n%s(connector -help says more)", name, commandList())
	}
	if name == "probe" {
		if len(args) != 1 || strings.HasPrefix(args[0], "-") {
			return cli.Usagef("probe takes one URL: connector probe URL")
		}
		return probe.Run(ctx, args[0])
	}
	redriveFrom := ""
	if name == "redrive" {
		redriveFrom = "table"
	}
	recovering := name == "recover"
	backfilling := name == "backfill"
	var bf backfillFlags
	fs := flag.NewFlagSet("connector "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = usage(fs, name, stderr)
	var cfg config.Config
	b := cfg.Bind(fs, getenv)
	group := "outbox-redrive"
	if redriveFrom != "" {
		fs.StringVar(&redriveFrom, "from", "table", "redrive: where the dead letters are: table (outbox_dead_letter) or topic (OUTBOX_DLQ_TOPIC)")
		fs.StringVar(&group, "group", group, "redrive -from topic: consumer group whose offsets remember what was redriven")
	}
	if backfilling {
		bf.bind(fs)
	}
	allowGap := false
	if recovering {
		fs.BoolVar(&allowGap, "allow-gap", false, "recover: go on although the outbox table holds no row older than the window, so nothing shows that its rows are all still there")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &cli.UsageError{Msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected %q after the flags of %s; the commands are:\n%s(a command comes first: connector COMMAND [flags])", fs.Arg(0), name, commandList())
	}
	if recovering {
		cfg.OnSlotLoss, cfg.RecoverAllowGap = "recover", allowGap
	}
	if err := errors.Join(b.Err(), cfg.Validate()); err != nil {
		return err
	}
	if recovering && cfg.Source == "poll" {
		return errors.New("connector recover: OUTBOX_SOURCE=poll has no slot to recover (poll mode reads the outbox table itself)")
	}
	memLimit := publish.SetMemoryLimit(getenv, cfg.MaxMessageBytes)
	base := cfg.Log.Logger(stderr)
	log := base.With("component", "connector")
	if redriveFrom != "" {
		return redriveCmd(ctx, cfg, redriveFrom, group, log, stdout)
	}
	if backfilling {
		return backfillCmd(ctx, cfg, bf, log, stdout)
	}
	if name == "switch-to-poll" {
		_, _, err := relay.MarkDelivered(ctx, cfg, cfg.Route.FieldEventID, stdout)
		return err
	}
	if err := preflight(ctx, cfg, log); err != nil {
		return err
	}
	m := metrics.New()
	router, err := route.NewContext(ctx, cfg.Route)
	if err != nil {
		return fmt.Errorf("router settings: %w", err)
	}
	r := relay.New(cfg, router, log, m)
	// The relay hop's spans, only with an OTLP endpoint configured
	// (OTEL_EXPORTER_OTLP_ENDPOINT); flushed at the end, after the relay
	// stopped.
	tp, err := tracing.Start(ctx, getenv, "outbox-connector", base.With("component", "tracing"))
	if err != nil {
		return err
	}
	if tp != nil {
		defer tracing.Shutdown(tp, 5*time.Second, log)
		r.SetTracer(tp.Tracer("github.com/pgoutbox/pgoutbox/relay"))
	}

	var srv *http.Server
	served := make(chan struct{})
	if cfg.HTTPEnabled() {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("OUTBOX_HTTP_ADDR: listen on %s: %w", cfg.HTTPAddr, err)
		}
		srv = &http.Server{Handler: handler(r, m), ReadHeaderTimeout: 5 * time.Second}
		hlog := base.With("component", "http")
		go func() {
			defer close(served)
			if err := webconfig.Serve(ln, srv, "OUTBOX_HTTP_WEB_CONFIG", cfg.HTTPWebConfig, hlog); err != nil {
				// The relay goes on: /readyz probes failing is how a
				// platform notices, and publishing must not stop for it.
				hlog.Error("HTTP endpoint stopped", "err", err)
			}
		}()
		tls, users := webconfig.Summary(cfg.HTTPWebConfig)
		log.Info("serving /metrics, /healthz, /readyz, /leader", "addr", ln.Addr().String(), "tls", tls, "basic_auth_users", users)
	}
	log.Info("starting", "pg", config.RedactDSN(cfg.PGDSN), "kafka", cfg.Kafka.Brokers, "slot", cfg.Slot, "publication", cfg.Publication, "table", cfg.Table,
		"memory_limit", memoryLimitText(memLimit))
	// Run competes for the slot's lease, leads while it holds it, and at
	// SIGTERM stops gracefully and releases the lease.
	err = r.Run(ctx)
	if srv != nil {
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		c()
		<-served
	}
	if err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

func handler(r *relay.Relay, m *metrics.Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if stalled, why := r.Stalled(); stalled {
			http.Error(w, "stalled: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Ready on a healthy leader and on a healthy standby alike: a standby
	// that never became ready would block rolling updates.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := r.Ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		if r.Leading() {
			fmt.Fprintln(w, "ready (leader)")
			return
		}
		fmt.Fprintln(w, "ready (standby)")
	})
	mux.HandleFunc("/leader", func(w http.ResponseWriter, _ *http.Request) {
		if !r.Leading() {
			http.Error(w, "not leading (standby)", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "leader (token %d)\n", r.Token())
	})
	return mux
}

// publisher is the router and the (idempotent) producer client of the
// commands that publish outside the connector's session: redrive and
// backfill.
func publisher(ctx context.Context, cfg config.Config, log *slog.Logger) (*route.Router, *kgo.Client, error) {
	router, err := route.NewContext(ctx, cfg.Route)
	if err != nil {
		return nil, nil, fmt.Errorf("router settings: %w", err)
	}
	opts := append(cfg.Kafka.Opts(log), publish.ClientOpts(cfg.MaxInFlight, cfg.MaxMessageBytes, cfg.Compression, cfg.Linger)...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("Kafka client settings (OUTBOX_KAFKA_*): %w", err)
	}
	return router, cl, nil
}

// redriveCmd re-publishes dead letters with the current settings.
func redriveCmd(ctx context.Context, cfg config.Config, from, group string, log *slog.Logger, stdout io.Writer) error {
	router, cl, err := publisher(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	rd := &redrive.Redriver{Router: router, Client: cl, MaxMessageBytes: cfg.MaxMessageBytes, Log: log.With("component", "redrive")}
	var res redrive.Result
	switch from {
	case "table":
		pool, err := pgxpool.New(ctx, cfg.PGDSN)
		if err != nil {
			return fmt.Errorf("OUTBOX_PG_DSN: %w", config.Redact(err, cfg.PGDSN))
		}
		defer pool.Close()
		res, err = rd.FromTable(ctx, pool)
		if err != nil {
			return err
		}
	case "topic":
		res, err = rd.FromTopic(ctx, cfg.Kafka.Opts(log), cfg.DLQTopic, group)
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("-from %q: use table or topic", from)
	}
	fmt.Fprintf(stdout, "redrive from %s: %d published, %d still failing\n", from, res.Published, res.Failed)
	if res.Failed > 0 {
		return fmt.Errorf("%d dead letters still cannot be published; they are kept (see the log for why)", res.Failed)
	}
	return nil
}

// memoryLimitText says which soft memory limit the Go runtime has.
func memoryLimitText(set int64) string {
	if set == 0 {
		return "GOMEMLIMIT"
	}
	return fmt.Sprintf("%dMiB", set>>20)
}

// backfillFlags are connector backfill's own flags.
type backfillFlags struct {
	from, to, aggType, where, name, timeColumn string
	batch                                      int
	retryFor                                   time.Duration
	retryFailed                                bool
}

func (f *backfillFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.from, "from", "", "backfill: the first time of the range (RFC 3339, e.g. 2026-12-04T10:00:00Z), included; required")
	fs.StringVar(&f.to, "to", "", "backfill: the end of the range (RFC 3339), excluded; default now")
	fs.StringVar(&f.aggType, "aggregate-type", "", "backfill: only rows of this aggregate type (the router's route-by column)")
	fs.StringVar(&f.where, "where", "", "backfill: an SQL condition on the outbox table's columns, ANDed (the operator's own SQL, run as the connector's role)")
	fs.StringVar(&f.name, "name", "", "backfill: the run's name in public.outbox_backfill (default: from the selection, so the same command resumes)")
	fs.StringVar(&f.timeColumn, "time-column", "created_at", "backfill: the column the range applies to")
	fs.IntVar(&f.batch, "batch", 1000, "backfill: rows read, published and recorded at a time")
	fs.DurationVar(&f.retryFor, "retry-for", 5*time.Minute, "backfill: how long a row whose routing failed for a passing reason (the schema registry) is retried, with backoff, before the run stops unfinished (the same command resumes before that row)")
	fs.BoolVar(&f.retryFailed, "retry-failed", false, "backfill: first publish again the run's rows recorded failed (public.outbox_backfill_failed), with the current settings; give the flags the run was started with")
}

// backfillCmd publishes again the outbox rows the flags choose.
func backfillCmd(ctx context.Context, cfg config.Config, f backfillFlags, log *slog.Logger, stdout io.Writer) error {
	if cfg.Source == "poll" {
		return errors.New("connector backfill: with OUTBOX_SOURCE=poll, mark the rows unpublished instead (UPDATE ... SET published_at = NULL): poll mode publishes them again")
	}
	if f.from == "" {
		return errors.New("connector backfill: -from is required (RFC 3339, e.g. -from 2026-12-04T10:00:00Z)")
	}
	from, err := time.Parse(time.RFC3339Nano, f.from)
	if err != nil {
		return fmt.Errorf("connector backfill -from %q: want RFC 3339, e.g. 2026-12-04T10:00:00Z: %w", f.from, err)
	}
	// No -to: the first run fixes it at its start, and the same command
	// resumes that run.
	var to time.Time
	if f.to != "" {
		if to, err = time.Parse(time.RFC3339Nano, f.to); err != nil {
			return fmt.Errorf("connector backfill -to %q: want RFC 3339, e.g. 2026-12-04T11:00:00Z: %w", f.to, err)
		}
	}
	if !to.IsZero() && !to.After(from) {
		return fmt.Errorf("connector backfill: -to %s is not after -from %s", to.Format(time.RFC3339), from.Format(time.RFC3339))
	}
	if f.batch < 1 || f.batch > 100000 {
		return fmt.Errorf("connector backfill -batch %d: want 1 to 100000", f.batch)
	}
	if f.retryFor <= 0 {
		return fmt.Errorf("connector backfill -retry-for %s: want a positive duration, e.g. 5m", f.retryFor)
	}
	router, cl, err := publisher(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	pcfg, err := pgxpool.ParseConfig(cfg.PGDSN)
	if err != nil {
		return fmt.Errorf("OUTBOX_PG_DSN: %w", config.Redact(err, cfg.PGDSN))
	}
	// The backfill refuses a table whose policies apply to its role
	// (rowsecurity.Check); row_security off makes a policy that starts
	// to apply during the run fail its reads rather than filter them.
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, rowsecurity.Off)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("OUTBOX_PG_DSN: %w", config.Redact(err, cfg.PGDSN))
	}
	defer pool.Close()
	rc := router.Config()
	sel := backfill.Selection{
		Schema: cfg.Table.Schema, Table: cfg.Table.Name, TimeColumn: f.timeColumn, IDColumn: rc.FieldEventID,
		From: from, To: to, TypeColumn: rc.RouteByField, AggregateType: f.aggType, Where: f.where,
	}
	if f.aggType != "" && rc.RouteByField == "" {
		return errors.New("connector backfill -aggregate-type: the router routes by no column (route.by.field is empty)")
	}
	b := &backfill.Backfiller{
		Pool: pool, Router: router, Client: cl, MaxMessageBytes: cfg.MaxMessageBytes, Batch: f.batch, RetryFor: f.retryFor, RetryFailed: f.retryFailed,
		Progress: stdout, Log: log.With("component", "backfill"),
		TopicCreate: cfg.TopicCreate, TopicPartitions: int32(cfg.TopicPartitions), TopicReplication: int16(cfg.TopicReplicationFactor), TopicConfigs: cfg.TopicConfigs,
	}
	res, err := b.Run(ctx, f.name, sel)
	if err != nil {
		return fmt.Errorf("backfill %s: %w", res.Name, err)
	}
	if res.Failed > 0 {
		return fmt.Errorf("backfill %s has rows not published (%d); their ids and why are in %s (%s); once fixed, run the same command with -retry-failed",
			res.Name, res.Failed, backfill.FailedTable, backfill.FailedQuery(res.Name))
	}
	return nil
}
