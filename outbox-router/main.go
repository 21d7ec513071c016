// Command outbox-router routes a Debezium PostgreSQL change-event topic
// (the outbox table's inserts, as Debezium captured them) to the outbox
// topics, with the same router the connector uses, for teams that already run
// Debezium without its Outbox Event Router. It consumes and produces in Kafka
// transactions (consume-transform-produce, read_committed), so a crash or a
// kill -9 neither loses nor duplicates records for read_committed consumers.
// Its only state is in Kafka: the group's committed offsets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/internal/probe"
	"github.com/pgoutbox/pgoutbox/outbox-router/cdc"
	"github.com/pgoutbox/pgoutbox/outbox-router/route"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox-router:", err)
		os.Exit(1)
	}
}

// config is the binary's settings.
type config struct {
	SourceTopic     string
	SessionTimeout  time.Duration
	Group           string
	TransactionalID string
	DLQTopic        string
	LogLevel        string
	Kafka           kafkaopt.Config
	Route           route.Config
	envs            []string
}

func (c *config) bind(fs *flag.FlagSet, getenv func(string) string) (*iconfig.Binder, error) {
	b := iconfig.NewBinder(fs, getenv)
	b.String(&c.SourceTopic, "source-topic", "OUTBOX_ROUTER_SOURCE_TOPIC", "", "Debezium change-event topic of the outbox table, e.g. dbserver1.public.outbox")
	b.String(&c.Group, "group", "OUTBOX_ROUTER_GROUP", "outbox-router", "consumer group (its committed offsets are the router's state)")
	b.String(&c.TransactionalID, "transactional-id", "OUTBOX_ROUTER_TRANSACTIONAL_ID", "outbox-router", "Kafka transactional id; one per router deployment")
	b.Duration(&c.SessionTimeout, "session-timeout", "OUTBOX_ROUTER_SESSION_TIMEOUT", 10*time.Second, "consumer group session timeout: how soon a killed router's partitions move to a new one")
	b.String(&c.DLQTopic, "dlq-topic", "OUTBOX_DLQ_TOPIC", "outbox.dlq", "dead-letter topic")
	b.String(&c.LogLevel, "log-level", "OUTBOX_LOG_LEVEL", "info", "debug, info, warn or error")
	c.Kafka.Bind(b, "outbox-router")
	c.Route = route.DefaultConfig()
	err := c.Route.RegisterFlags(fs, getenv)
	c.envs = append(b.EnvVars(), route.EnvVars()...)
	return b, err
}

// EnvVars lists every environment variable the binary reads.
func EnvVars() []string {
	var c config
	_, _ = c.bind(flag.NewFlagSet("x", flag.ContinueOnError), func(string) string { return "" })
	return c.envs
}

func (c *config) validate() error {
	var errs []error
	if c.SourceTopic == "" {
		errs = append(errs, errors.New("OUTBOX_ROUTER_SOURCE_TOPIC: missing; set it to Debezium's topic for the outbox table, e.g. dbserver1.public.outbox"))
	}
	if c.Group == "" || c.TransactionalID == "" {
		errs = append(errs, errors.New("OUTBOX_ROUTER_GROUP and OUTBOX_ROUTER_TRANSACTIONAL_ID must not be empty"))
	}
	errs = append(errs, c.Kafka.Validate())
	return errors.Join(errs...)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "probe" {
		if len(args) != 2 {
			return errors.New("usage: outbox-router probe URL")
		}
		return probe.Run(ctx, args[1])
	}
	fs := flag.NewFlagSet("outbox-router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	b, rerr := cfg.bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := errors.Join(rerr, b.Err(), cfg.validate()); err != nil {
		return err
	}
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv})).With("component", "outbox-router")
	router, err := route.NewContext(ctx, cfg.Route)
	if err != nil {
		return fmt.Errorf("router settings: %w", err)
	}
	opts := append(cfg.Kafka.Opts(log),
		kgo.ConsumerGroup(cfg.Group),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.ConsumeTopics(cfg.SourceTopic),
		kgo.TransactionalID(cfg.TransactionalID),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(route.Partitioner()),
		kgo.UnknownTopicRetries(-1),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return fmt.Errorf("Kafka client settings (OUTBOX_KAFKA_*): %w", err)
	}
	defer sess.Close()
	admClient, err := kgo.NewClient(cfg.Kafka.Opts(log)...)
	if err != nil {
		return err
	}
	defer admClient.Close()
	adm := kadm.NewClient(admClient)
	r := &routerLoop{sess: sess, adm: adm, router: router, cfg: cfg, log: log, known: map[string]bool{}}
	log.Info("routing", "source", cfg.SourceTopic, "group", cfg.Group, "transactional_id", cfg.TransactionalID)
	return r.run(ctx)
}

type routerLoop struct {
	sess   *kgo.GroupTransactSession
	adm    *kadm.Client
	router *route.Router
	cfg    config
	log    *slog.Logger
	known  map[string]bool
}

// run consumes, routes and produces one Kafka transaction per poll: the
// outputs and the consumed offsets commit together, or not at all.
func (r *routerLoop) run(ctx context.Context) error {
	for {
		fs := r.sess.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fs.Err0(); err != nil && !errors.Is(err, context.Canceled) {
			var fatal bool
			fs.EachError(func(_ string, _ int32, err error) {
				fatal = fatal || errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed)
			})
			if fatal {
				return fmt.Errorf("consume %s: %w", r.cfg.SourceTopic, err)
			}
			r.log.Warn("fetch error; retrying", "err", err)
		}
		if fs.NumRecords() == 0 {
			continue
		}
		if err := r.sess.Begin(); err != nil {
			return fmt.Errorf("begin Kafka transaction: %w", err)
		}
		var out []*kgo.Record
		fs.EachRecord(func(in *kgo.Record) {
			if rec := r.routeOne(ctx, in); rec != nil {
				out = append(out, rec)
			}
		})
		for _, rec := range out {
			r.ensureTopic(ctx, rec.Topic)
		}
		results := r.sess.ProduceSync(ctx, out...)
		commit := kgo.TryCommit
		if err := results.FirstErr(); err != nil {
			r.log.Warn("producing routed records failed; aborting the transaction so they are consumed again", "err", err)
			commit = kgo.TryAbort
		}
		committed, err := r.sess.End(ctx, commit)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Warn("ending the Kafka transaction failed; the batch will be consumed again", "err", err)
			continue
		}
		if committed {
			r.log.Debug("committed", "records", len(out))
		}
	}
}

// routeOne routes a change event; poison becomes a dead letter in the same
// transaction, and skipped or empty events produce nothing.
func (r *routerLoop) routeOne(ctx context.Context, in *kgo.Record) *kgo.Record {
	row, err := cdc.Decode(in.Value, r.cfg.Route.FieldPayload)
	if errors.Is(err, cdc.ErrTombstone) {
		return nil
	}
	if err != nil {
		raw := &route.Row{Columns: []route.Column{{Name: "value", Type: route.OIDText, Value: in.Value}}}
		return route.DeadLetter(raw, "", &route.Error{Class: route.ClassInvalidPayload, Msg: "not a Debezium change event", Err: err}, r.cfg.DLQTopic)
	}
	rec, err := r.router.Route(ctx, row)
	if err == nil {
		return rec
	}
	if route.ClassOf(err).Skip() {
		return nil
	}
	return r.router.DeadLetter(row, "", err, r.cfg.DLQTopic)
}

func (r *routerLoop) ensureTopic(ctx context.Context, topic string) {
	if r.known[topic] {
		return
	}
	resp, err := r.adm.CreateTopic(ctx, -1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		r.log.Warn("create topic failed; producing anyway", "topic", topic, "err", err)
		return
	}
	r.known[topic] = true
}
