// Command outbox-router routes a Debezium PostgreSQL change-event topic
// (the outbox table's inserts, as Debezium captured them) to the outbox
// topics, with the same router the connector uses, for teams that already run
// Debezium without its Outbox Event Router. It consumes and produces in Kafka
// transactions (consume-transform-produce, read_committed), so a crash or a
// kill -9 neither loses nor duplicates records for read_committed consumers.
// Its only state is in Kafka: the group's committed offsets.
//
// Change events may be JSON (Kafka Connect's JsonConverter, with or without
// schemas) or Avro (Confluent's AvroConverter, or Apicurio's converter in its
// Confluent-compatible mode), told apart by their first byte unless
// OUTBOX_ROUTER_INPUT_FORMAT says which; Avro writer schemas are read from
// the registry named by OUTBOX_ROUTE_REGISTRY_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/internal/probe"
	"github.com/pgoutbox/pgoutbox/outbox-router/cdc"
	"github.com/pgoutbox/pgoutbox/route"
)

func main() { cli.Main("outbox-router", envRule(), run) }

// envRule: the router refuses OUTBOX_* variables it does not read; a
// connector setting (the router reads none of them: no database, no slot)
// would seem to apply and be ignored.
func envRule() iconfig.EnvRule {
	return iconfig.EnvRule{Prefixes: []string{"OUTBOX_"}, Known: EnvVars()}
}

// config is the binary's settings.
type config struct {
	SourceTopic     string
	InputFormat     string
	SessionTimeout  time.Duration
	Group           string
	TransactionalID string
	DLQTopic        string
	Log             cli.Log
	Kafka           kafkaopt.Config
	Route           route.Config
	envs            []string
}

func (c *config) bind(fs *flag.FlagSet, getenv func(string) string) (*iconfig.Binder, error) {
	b := iconfig.NewBinder(fs, getenv)
	b.String(&c.SourceTopic, "source-topic", "OUTBOX_ROUTER_SOURCE_TOPIC", "", "Debezium change-event topic of the outbox table, e.g. dbserver1.public.outbox")
	b.String(&c.InputFormat, "input-format", "OUTBOX_ROUTER_INPUT_FORMAT", string(cdc.FormatAuto), "change-event encoding: auto (by the first byte: 0 is Avro in the Confluent wire format, else JSON), json (JsonConverter) or avro (AvroConverter; schemas from OUTBOX_ROUTE_REGISTRY_URL)")
	b.String(&c.Group, "group", "OUTBOX_ROUTER_GROUP", "outbox-router", "consumer group (its committed offsets are the router's state)")
	b.String(&c.TransactionalID, "transactional-id", "OUTBOX_ROUTER_TRANSACTIONAL_ID", "outbox-router", "Kafka transactional id; one per router deployment")
	b.Duration(&c.SessionTimeout, "session-timeout", "OUTBOX_ROUTER_SESSION_TIMEOUT", 10*time.Second, "consumer group session timeout: how soon a killed router's partitions move to a new one")
	b.String(&c.DLQTopic, "dlq-topic", "OUTBOX_DLQ_TOPIC", "outbox.dlq", "dead-letter topic")
	c.Log.Bind(b, "OUTBOX")
	c.Kafka.Bind(b, "outbox-router")
	c.Route = route.DefaultConfig()
	c.Route.Bind(b)
	c.envs = b.EnvVars()
	return b, nil
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
	format, err := cdc.ParseFormat(c.InputFormat)
	if err != nil {
		errs = append(errs, fmt.Errorf("OUTBOX_ROUTER_INPUT_FORMAT: %w", err))
	}
	if format == cdc.FormatAvro && len(c.Route.RegistryURLs) == 0 {
		errs = append(errs, errors.New("OUTBOX_ROUTER_INPUT_FORMAT=avro: no schema registry; set OUTBOX_ROUTE_REGISTRY_URL to the registry Debezium's AvroConverter writes to, e.g. http://registry:8081"))
	}
	errs = append(errs, c.Log.Validate(), c.Kafka.Validate())
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
	base := cfg.Log.Logger(stderr)
	log := base.With("component", "outbox-router")
	router, err := route.NewContext(ctx, cfg.Route)
	if err != nil {
		return fmt.Errorf("router settings: %w", err)
	}
	// Kafka settings that can never work (a certificate that does not
	// verify, a refused mechanism or password) end the run with the setting
	// named; a broker that does not answer yet is retried by the session.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	checkErr := cfg.Kafka.Check(cctx)
	cancel()
	var bad *kafkaopt.ConfigError
	if errors.As(checkErr, &bad) {
		return checkErr
	} else if checkErr != nil && ctx.Err() == nil {
		log.Warn("Kafka does not answer yet; starting anyway, the router retries", "err", checkErr)
	}
	opts := append(cfg.Kafka.Opts(base),
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
	admClient, err := kgo.NewClient(cfg.Kafka.Opts(base)...)
	if err != nil {
		return err
	}
	defer admClient.Close()
	adm := kadm.NewClient(admClient)
	format, _ := cdc.ParseFormat(cfg.InputFormat)
	dec := &cdc.Decoder{Format: format, PayloadField: cfg.Route.FieldPayload}
	if len(cfg.Route.RegistryURLs) > 0 {
		reg, err := registryClient(&cfg.Route)
		if err != nil {
			return err
		}
		dec.Avro = cdc.NewAvroDecoder(reg)
	}
	r := &routerLoop{sess: sess, adm: adm, router: router, dec: dec, cfg: cfg, log: log, known: map[string]bool{}}
	log.Info("routing", "source", cfg.SourceTopic, "input_format", format, "group", cfg.Group, "transactional_id", cfg.TransactionalID)
	return r.run(ctx)
}

// registryTimeout bounds one schema registry request.
const registryTimeout = 10 * time.Second

// registryClient reads the writer schemas of Avro change events from the
// registry the router's Avro output uses (OUTBOX_ROUTE_REGISTRY_*): with
// Debezium's AvroConverter both live in the one registry.
func registryClient(cfg *route.Config) (*sr.Client, error) {
	opts := []sr.ClientOpt{sr.URLs(cfg.RegistryURLs...), sr.HTTPClient(&http.Client{Timeout: registryTimeout}), sr.UserAgent("pgoutbox-outbox-router")}
	if cfg.RegistryUser != "" || cfg.RegistryPassword != "" {
		opts = append(opts, sr.BasicAuth(cfg.RegistryUser, cfg.RegistryPassword))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema registry client (OUTBOX_ROUTE_REGISTRY_URL): %w", err)
	}
	return cl, nil
}

type routerLoop struct {
	sess   *kgo.GroupTransactSession
	adm    *kadm.Client
	router *route.Router
	dec    *cdc.Decoder
	cfg    config
	log    *slog.Logger
	known  map[string]bool
}

// run consumes, routes and produces one Kafka transaction per poll: the
// outputs and the consumed offsets commit together, or not at all.
func (r *routerLoop) run(ctx context.Context) error {
	var backoff time.Duration
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
		out, err := r.routeBatch(ctx, fs)
		if err != nil {
			// Nothing of this batch may commit: aborting rewinds the
			// session to the committed offsets, so that the same records
			// are consumed again once the registry answers. The abort
			// outlives a shutdown signal, so that a stop while the
			// registry is away leaves no open transaction behind.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
			if _, endErr := r.sess.End(actx, kgo.TryAbort); endErr != nil {
				r.log.Warn("aborting the Kafka transaction failed", "err", endErr)
			}
			cancel()
			if ctx.Err() != nil {
				return nil
			}
			if !route.IsRetryable(err) {
				return err
			}
			backoff = min(max(2*backoff, 250*time.Millisecond), maxRegistryBackoff)
			r.log.Warn("schema registry unavailable; the batch will be consumed again", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
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

// maxRegistryBackoff caps the wait between attempts while the schema
// registry does not answer; abortTimeout bounds aborting a transaction.
const (
	maxRegistryBackoff = 10 * time.Second
	abortTimeout       = 10 * time.Second
)

// routeBatch routes every record of a poll. An error means the batch must
// not commit: a registry that did not answer (route.IsRetryable), or a
// reason to stop.
func (r *routerLoop) routeBatch(ctx context.Context, fs kgo.Fetches) ([]*kgo.Record, error) {
	out := make([]*kgo.Record, 0, fs.NumRecords())
	for it := fs.RecordIter(); !it.Done(); {
		rec, err := r.routeOne(ctx, it.Next())
		if err != nil {
			return nil, err
		}
		if rec != nil {
			out = append(out, rec)
		}
	}
	return out, nil
}

// routeOne routes a change event; poison becomes a dead letter in the same
// transaction, and skipped or empty events produce nothing. It fails only
// when the record may route later (the registry did not answer) or when the
// router must stop (table.op.invalid.behavior=fatal, Avro with no registry).
func (r *routerLoop) routeOne(ctx context.Context, in *kgo.Record) (*kgo.Record, error) {
	row, err := r.dec.Decode(ctx, in.Value)
	switch {
	case errors.Is(err, cdc.ErrTombstone):
		return nil, nil
	case errors.Is(err, cdc.ErrNoRegistry):
		return nil, fmt.Errorf("%s partition %d offset %d: %w; set OUTBOX_ROUTE_REGISTRY_URL to the registry Debezium's AvroConverter writes to (or OUTBOX_ROUTER_INPUT_FORMAT=json to dead-letter such records)",
			in.Topic, in.Partition, in.Offset, err)
	case route.IsRetryable(err):
		return nil, err
	case err != nil:
		cause := err
		if route.ClassOf(err) == "" {
			cause = &route.Error{Class: route.ClassInvalidPayload, Msg: "not a Debezium change event", Err: err}
		}
		return route.DeadLetter(rawRow(in.Value), "", cause, r.cfg.DLQTopic), nil
	}
	rec, err := r.router.Route(ctx, row)
	if err == nil {
		return rec, nil
	}
	switch c := route.ClassOf(err); {
	case c.Skip():
		return nil, nil
	case c.Retryable():
		return nil, err
	case c.Fatal():
		return nil, fmt.Errorf("%s partition %d offset %d: %w", in.Topic, in.Partition, in.Offset, err)
	}
	var re *route.Error
	intended := ""
	if errors.As(err, &re) {
		intended = re.Intended
	}
	return r.router.DeadLetter(row, intended, err, r.cfg.DLQTopic), nil
}

// rawRow keeps an undecodable record value whole for the dead-letter topic:
// as text when it is UTF-8 (JSON); as bytea, which the dead letter writes in
// \x hex, when it is binary or in the Confluent wire format (Avro), so that
// no byte is lost to JSON escaping and every Avro dead letter looks alike.
func rawRow(value []byte) *route.Row {
	c := route.Column{Name: "value", Type: route.OIDText, Value: value}
	if (len(value) > 0 && value[0] == 0) || !utf8.Valid(value) {
		c.Type = route.OIDBytea
		c.Value = fmt.Appendf(nil, "\\x%x", value)
	}
	return &route.Row{Columns: []route.Column{c}}
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
