// Package config is the connector's configuration: every setting a flag and
// an OUTBOX_* environment variable, with defaults and a Validate that says
// what to do.
package config

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/internal/webconfig"
	"github.com/pgoutbox/pgoutbox/route"
)

// Config holds every connector setting.
type Config struct {
	// PGDSN is the libpq connection string (OUTBOX_PG_DSN). Required.
	PGDSN string
	// Slot is the logical replication slot (OUTBOX_SLOT, default outbox_slot).
	Slot string
	// Publication is the pgoutput publication (OUTBOX_PUBLICATION, default outbox_pub).
	Publication string
	// Table is the outbox table, schema-qualified (OUTBOX_TABLE, default public.outbox).
	Table Table
	// Snapshot is initial or never (OUTBOX_SNAPSHOT, default initial): publish
	// the rows already in the table when the connector creates the slot.
	Snapshot string
	// AcceptSlotReset continues, knowingly, on a slot that moved behind the
	// connector's back (OUTBOX_ACCEPT_SLOT_RESET, default false).
	AcceptSlotReset bool
	// OnSlotLoss is what a start does when the slot is gone, invalidated
	// (wal_status lost) or ahead of the state row (OUTBOX_ON_SLOT_LOSS):
	// fail (the default), or recover: create a new slot and publish again,
	// from the outbox table in the new slot's snapshot, every event that
	// may not have been delivered (relay/recover.go).
	OnSlotLoss string
	// RecoverAllowGap lets a recovery go on although the outbox table holds
	// no row older than the gap, so nothing shows that the gap's rows are
	// all still there (connector recover -allow-gap only: no setting).
	RecoverAllowGap bool
	// RecoverMargin bounds a recovery's window by time too: rows created
	// longer than this before the recovery point are not published again
	// (OUTBOX_RECOVER_MARGIN, default 6h; relay/recover.go says why).
	RecoverMargin time.Duration
	// SlotFailover creates the slot as a failover slot, and makes an
	// existing one one, so that standbys running sync_replication_slots
	// keep a copy a promotion can continue from (OUTBOX_SLOT_FAILOVER,
	// default false, as Debezium's slot.failover; PostgreSQL 17+).
	SlotFailover bool
	// HTTPAddr serves /metrics, /healthz, /readyz, /leader (OUTBOX_HTTP_ADDR,
	// default 127.0.0.1:9189, loopback only; "off" disables the endpoint).
	HTTPAddr string
	// HTTPWebConfig is a Prometheus exporter-toolkit web configuration file
	// that turns on TLS and basic authentication for every HTTP path
	// (OUTBOX_HTTP_WEB_CONFIG, default none: plain HTTP, no authentication).
	HTTPWebConfig string
	// DLQTopic receives events that cannot be routed (OUTBOX_DLQ_TOPIC, default outbox.dlq).
	DLQTopic string
	// StatusInterval is how often the confirmed position is sent
	// (OUTBOX_STATUS_INTERVAL, default 1s).
	StatusInterval time.Duration
	// StallTimeout fails /healthz when events are in flight and nothing was
	// acked for this long (OUTBOX_STALL_TIMEOUT, default 60s).
	StallTimeout time.Duration
	// StreamSilenceTimeout ends the session, to reconnect, when the
	// replication connection heard nothing from the server for this long,
	// not even the answer to a status update that asked for one: a network
	// path gone silent (OUTBOX_STREAM_SILENCE_TIMEOUT, default 0: the
	// replication connection's wal_sender_timeout, which the connector caps
	// at LeaseTTL and at 1m; see wal.Stream.SilenceTimeout). A setting
	// below that lowers the connection's wal_sender_timeout to it.
	StreamSilenceTimeout time.Duration
	// ShutdownTimeout bounds the graceful stop (OUTBOX_SHUTDOWN_TIMEOUT, default 30s).
	ShutdownTimeout time.Duration
	// MaxInFlight bounds the records buffered for Kafka
	// (OUTBOX_MAX_IN_FLIGHT, default 10000); reading the WAL pauses beyond it.
	MaxInFlight int
	// LeaseTTL is the leader lease's time to live (OUTBOX_LEASE_TTL, default
	// 10s). The leader renews it every third of the TTL; the replication
	// connection's wal_sender_timeout is capped at it, so a frozen leader's
	// walsender gives up the slot by the time a standby takes over.
	LeaseTTL time.Duration
	// Log is OUTBOX_LOG_LEVEL and OUTBOX_LOG_FORMAT.
	Log cli.Log

	Kafka kafkaopt.Config
	// Route holds the Outbox Event Router options (OUTBOX_ROUTE_*, or a
	// Debezium properties file in OUTBOX_ROUTE_PROPERTIES); Debezium's
	// defaults.
	Route route.Config
	// Compression is the producer codec: none, gzip, snappy, lz4, zstd
	// (OUTBOX_KAFKA_COMPRESSION, default lz4).
	Compression string
	// Linger is how long the producer waits to fill a batch (OUTBOX_KAFKA_LINGER,
	// default 1ms: fewer, larger produce requests cost the broker and the
	// connector far less CPU per event, for about a millisecond of latency).
	Linger time.Duration
	// Transactional produces in Kafka transactions with one transactional id
	// per slot, so that a new leader fences the previous one at the broker
	// (OUTBOX_KAFKA_TRANSACTIONAL, default true). A record counts as acked
	// when its transaction committed. false: idempotent producer, fenced only
	// by the lease's timing.
	Transactional bool
	// TxnPipeline gives the slot a second transactional id (the first with
	// the suffix -b): the two producers take Kafka transactions in turn, so
	// that one commits while the other takes the next events
	// (OUTBOX_KAFKA_TXN_PIPELINE, default true; used only with
	// Transactional).
	TxnPipeline bool
	// OffsetsTopic is the compacted topic that holds the exactly-once
	// position of every slot, written in each Kafka transaction
	// (OUTBOX_KAFKA_OFFSETS_TOPIC, default outbox.connector.offsets; used
	// only with Transactional).
	OffsetsTopic string
	// OnOffsetsLoss is what a start does when the offsets topic is missing,
	// emptied or behind the state row (OUTBOX_ON_OFFSETS_LOSS): fail
	// (default) stops with the choices; at-least-once continues from the
	// slot's position, publishing again what the slot replays.
	OnOffsetsLoss string
	// TxnInterval is the longest a Kafka transaction stays open
	// (OUTBOX_KAFKA_TXN_INTERVAL, default 100ms); it commits sooner when the
	// stream has nothing more to hand over, or at OUTBOX_MAX_IN_FLIGHT records.
	TxnInterval time.Duration
	// MaxMessageBytes is the largest record (OUTBOX_KAFKA_MAX_MESSAGE_BYTES,
	// default 1048576, the broker's default message.max.bytes); a larger
	// event goes whole to the outbox_dead_letter table.
	MaxMessageBytes int
	// TopicCreate creates missing topics (OUTBOX_TOPIC_CREATE, default true).
	TopicCreate bool
	// TopicPartitions for created topics (OUTBOX_TOPIC_PARTITIONS, default 6).
	TopicPartitions int
	// TopicReplicationFactor for created topics (OUTBOX_TOPIC_REPLICATION_FACTOR,
	// default -1: the broker's default.replication.factor).
	TopicReplicationFactor int
	// TopicConfigs for created topics, k=v,k=v (OUTBOX_TOPIC_CONFIGS).
	TopicConfigs TopicConfigs

	// Source is the relay's kind (OUTBOX_SOURCE): wal (default) reads the
	// slot; poll reads unpublished rows from the table and marks them
	// (sql/variants/outbox_poll.sql), with no slot, publication or
	// REPLICATION attribute, and several instances sharing the work.
	Source string
	// PollInterval is how often poll mode reads the table when nothing woke
	// it (OUTBOX_POLL_INTERVAL, default 100ms).
	PollInterval time.Duration
	// PollBatch and PollBatchBytes bound one read (OUTBOX_POLL_BATCH,
	// default 1000 rows; OUTBOX_POLL_BATCH_BYTES, default 4 MiB).
	PollBatch      int
	PollBatchBytes int
	// PollBuckets is how many buckets (by hash of the aggregate id) the
	// instances share (OUTBOX_POLL_BUCKETS, default 16); every instance
	// of a table must use the same.
	PollBuckets int
	// PollChannel is the LISTEN channel that wakes poll mode at once
	// (OUTBOX_POLL_NOTIFY_CHANNEL, default outbox_poll, as the variant's
	// trigger notifies; off: poll only).
	PollChannel string

	envs []string
}

// Required starts the help of a setting that has no default and that
// Validate refuses when it is missing.
const Required = iconfig.Required

// Bind registers every setting on fs with getenv supplying defaults.
func (c *Config) Bind(fs *flag.FlagSet, getenv func(string) string) *iconfig.Binder {
	b := iconfig.NewBinder(fs, getenv)
	// A secret: -help must not print the password as the flag's default.
	b.Secret(&c.PGDSN, "pg-dsn", "OUTBOX_PG_DSN", Required+"PostgreSQL connection string (libpq URL or key=value)")
	b.String(&c.Slot, "slot", "OUTBOX_SLOT", "outbox_slot", "logical replication slot")
	b.String(&c.Publication, "publication", "OUTBOX_PUBLICATION", "outbox_pub", "publication to stream")
	c.Table = Table{Schema: "public", Name: "outbox"}
	b.Var(&c.Table, "table", "OUTBOX_TABLE", "outbox table, schema-qualified")
	b.String(&c.Snapshot, "snapshot", "OUTBOX_SNAPSHOT", "initial", "initial: publish rows already in the table when the slot is created; never: do not")
	b.Bool(&c.AcceptSlotReset, "accept-slot-reset", "OUTBOX_ACCEPT_SLOT_RESET", false, "continue on a slot that was recreated or advanced behind the connector's back (events may have been skipped)")
	b.Bool(&c.SlotFailover, "slot-failover", "OUTBOX_SLOT_FAILOVER", false, "create the slot as a failover slot (PostgreSQL 17+), synchronized to standbys with sync_replication_slots, so that a promoted standby has it")
	b.Duration(&c.RecoverMargin, "recover-margin", "OUTBOX_RECOVER_MARGIN", 6*time.Hour, "a slot recovery does not publish again rows created longer than this before its recovery point (the longest an outbox-writing transaction may stay open)")
	b.String(&c.OnSlotLoss, "on-slot-loss", "OUTBOX_ON_SLOT_LOSS", "fail", "when the slot is gone, invalidated or ahead of the state row: fail, or recover (a new slot, and every event that may not have been delivered published again from the outbox table)")
	b.String(&c.HTTPAddr, "http-addr", "OUTBOX_HTTP_ADDR", "127.0.0.1:9189", "address for /metrics, /healthz, /readyz, /leader; off disables them")
	b.String(&c.HTTPWebConfig, "http-web-config", "OUTBOX_HTTP_WEB_CONFIG", "", "web configuration file (Prometheus exporter-toolkit format) for TLS and basic auth of the HTTP endpoints")
	b.String(&c.DLQTopic, "dlq-topic", "OUTBOX_DLQ_TOPIC", "outbox.dlq", "dead-letter topic")
	b.Duration(&c.StatusInterval, "status-interval", "OUTBOX_STATUS_INTERVAL", time.Second, "how often the confirmed LSN is sent to PostgreSQL")
	b.Duration(&c.StallTimeout, "stall-timeout", "OUTBOX_STALL_TIMEOUT", time.Minute, "/healthz fails when events are in flight and nothing was acked for this long")
	b.Duration(&c.StreamSilenceTimeout, "stream-silence-timeout", "OUTBOX_STREAM_SILENCE_TIMEOUT", 0, "reconnect when the replication connection heard nothing from the server for this long, even asked for a reply (0: the connection's wal_sender_timeout, capped at the lease TTL and at 1m; a shorter setting lowers that timeout to it)")
	b.Duration(&c.ShutdownTimeout, "shutdown-timeout", "OUTBOX_SHUTDOWN_TIMEOUT", 30*time.Second, "deadline for the graceful stop")
	b.Int(&c.MaxInFlight, "max-in-flight", "OUTBOX_MAX_IN_FLIGHT", 10000, "records buffered for Kafka before WAL reading pauses")
	b.Duration(&c.LeaseTTL, "lease-ttl", "OUTBOX_LEASE_TTL", 10*time.Second, "leader lease time to live; renewed every third of it")
	c.Log.Bind(b, "OUTBOX")
	c.Kafka.Bind(b, "outbox-connector")
	b.String(&c.Compression, "kafka-compression", "OUTBOX_KAFKA_COMPRESSION", "lz4", "producer compression: none, gzip, snappy, lz4, zstd")
	b.Duration(&c.Linger, "kafka-linger", "OUTBOX_KAFKA_LINGER", time.Millisecond, "how long the producer waits to fill a batch")
	b.Bool(&c.Transactional, "kafka-transactional", "OUTBOX_KAFKA_TRANSACTIONAL", true, "produce in Kafka transactions so that a new leader fences the old one at the broker (false: idempotent producer)")
	b.Bool(&c.TxnPipeline, "kafka-txn-pipeline", "OUTBOX_KAFKA_TXN_PIPELINE", true, "two transactional producers per slot take Kafka transactions in turn, so that one commits while the other takes the next events")
	b.String(&c.OffsetsTopic, "kafka-offsets-topic", "OUTBOX_KAFKA_OFFSETS_TOPIC", "outbox.connector.offsets", "compacted topic holding the exactly-once position, written in every Kafka transaction")
	b.String(&c.OnOffsetsLoss, "on-offsets-loss", "OUTBOX_ON_OFFSETS_LOSS", "fail", "when the offsets topic is missing, emptied or behind the state row: fail, or at-least-once (continue from the slot's position)")
	b.Duration(&c.TxnInterval, "kafka-txn-interval", "OUTBOX_KAFKA_TXN_INTERVAL", 100*time.Millisecond, "longest a Kafka transaction stays open")
	b.Int(&c.MaxMessageBytes, "kafka-max-message-bytes", "OUTBOX_KAFKA_MAX_MESSAGE_BYTES", 1048576, "largest record; larger events go to the outbox_dead_letter table")
	b.Bool(&c.TopicCreate, "topic-create", "OUTBOX_TOPIC_CREATE", true, "create missing topics")
	b.Int(&c.TopicPartitions, "topic-partitions", "OUTBOX_TOPIC_PARTITIONS", 6, "partitions of created topics")
	b.Int(&c.TopicReplicationFactor, "topic-replication-factor", "OUTBOX_TOPIC_REPLICATION_FACTOR", -1, "replication factor of created topics (-1: the broker's default)")
	b.Var(&c.TopicConfigs, "topic-configs", "OUTBOX_TOPIC_CONFIGS", "configs of created topics, k=v,k=v")
	b.String(&c.Source, "source", "OUTBOX_SOURCE", "wal", "wal: read the replication slot; poll: read unpublished rows from the table (no slot; sql/variants/outbox_poll.sql)")
	b.Duration(&c.PollInterval, "poll-interval", "OUTBOX_POLL_INTERVAL", 100*time.Millisecond, "poll mode: how often the table is read when no NOTIFY woke the relay")
	b.Int(&c.PollBatch, "poll-batch", "OUTBOX_POLL_BATCH", 1000, "poll mode: most rows per read")
	b.Int(&c.PollBatchBytes, "poll-batch-bytes", "OUTBOX_POLL_BATCH_BYTES", 4<<20, "poll mode: about the most bytes per read (at least one row)")
	b.Int(&c.PollBuckets, "poll-buckets", "OUTBOX_POLL_BUCKETS", 16, "poll mode: buckets of aggregate ids the instances share (the same on every instance)")
	b.String(&c.PollChannel, "poll-notify-channel", "OUTBOX_POLL_NOTIFY_CHANNEL", "outbox_poll", "poll mode: LISTEN channel that wakes the relay (off: poll only)")
	c.Route = route.DefaultConfig()
	c.Route.Bind(b)
	c.envs = b.EnvVars()
	return b
}

// EnvVars lists every environment variable the connector reads.
func EnvVars() []string {
	var c Config
	fs := flag.NewFlagSet("connector", flag.ContinueOnError)
	c.Bind(fs, func(string) string { return "" })
	return c.envs
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Validate checks the settings and says how to fix what is wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.PGDSN == "" {
		errs = append(errs, errors.New("OUTBOX_PG_DSN: missing; set it to postgres://user@host:5432/db"))
	} else if _, err := pgconn.ParseConfig(c.PGDSN); err != nil {
		what := "malformed connection string"
		if strings.Contains(err.Error(), "failed to configure TLS") {
			// pgconn reads sslrootcert, sslcert and sslkey while parsing:
			// a missing file is not a syntax error, say which it is.
			what = "its TLS settings (sslmode, sslrootcert, sslcert, sslkey) cannot be used"
		}
		errs = append(errs, fmt.Errorf("OUTBOX_PG_DSN: %s: %w", what, Redact(err, c.PGDSN)))
	}
	// The slot and publication names reach replication commands that
	// pglogrepl builds with Sprintf: allow only plain identifiers.
	if !identRE.MatchString(c.Slot) {
		errs = append(errs, fmt.Errorf("OUTBOX_SLOT: %q is not a valid slot name; use lower-case letters, digits and _ (at most 63)", c.Slot))
	}
	if !identRE.MatchString(c.Publication) {
		errs = append(errs, fmt.Errorf("OUTBOX_PUBLICATION: %q is not a valid publication name; use lower-case letters, digits and _", c.Publication))
	}
	if !tableIdentRE.MatchString(c.Table.Schema) || !tableIdentRE.MatchString(c.Table.Name) {
		errs = append(errs, fmt.Errorf("OUTBOX_TABLE: %w", notTable(c.Table.String())))
	}
	if c.Snapshot != "initial" && c.Snapshot != "never" {
		errs = append(errs, fmt.Errorf("OUTBOX_SNAPSHOT: %q; use initial or never", c.Snapshot))
	}
	switch c.Source {
	case "wal":
	case "poll":
		if c.PollInterval < time.Millisecond || c.PollInterval > c.LeaseTTL/3 {
			errs = append(errs, fmt.Errorf("OUTBOX_POLL_INTERVAL: %s; use at least 1ms and at most a third of OUTBOX_LEASE_TTL (%s), after which the other instances take a silent one for dead", c.PollInterval, c.LeaseTTL))
		}
		if c.PollBatch < 1 || c.PollBatch > 4096 || c.PollBatchBytes < 1 {
			errs = append(errs, fmt.Errorf("OUTBOX_POLL_BATCH (%d) must be 1 to 4096 (what the producer takes without waiting) and OUTBOX_POLL_BATCH_BYTES (%d) positive", c.PollBatch, c.PollBatchBytes))
		}
		if c.PollBuckets < 1 || c.PollBuckets > 1024 {
			errs = append(errs, fmt.Errorf("OUTBOX_POLL_BUCKETS: %d; use 1 to 1024, the same on every instance", c.PollBuckets))
		}
		if c.PollChannel != "off" && !identRE.MatchString(c.PollChannel) {
			errs = append(errs, fmt.Errorf("OUTBOX_POLL_NOTIFY_CHANNEL: %q; use a plain lower-case identifier, or off", c.PollChannel))
		}
	default:
		errs = append(errs, fmt.Errorf("OUTBOX_SOURCE: %q; use wal (read the replication slot) or poll (read the table)", c.Source))
	}
	if c.RecoverMargin <= 0 {
		errs = append(errs, fmt.Errorf("OUTBOX_RECOVER_MARGIN: %s; must be positive (the longest an outbox-writing transaction may stay open, e.g. 6h)", c.RecoverMargin))
	}
	if c.OnSlotLoss != "fail" && c.OnSlotLoss != "recover" {
		errs = append(errs, fmt.Errorf("OUTBOX_ON_SLOT_LOSS: %q; use fail or recover", c.OnSlotLoss))
	}
	if c.OnOffsetsLoss != "fail" && c.OnOffsetsLoss != "at-least-once" {
		errs = append(errs, fmt.Errorf("OUTBOX_ON_OFFSETS_LOSS: %q; use fail or at-least-once", c.OnOffsetsLoss))
	}
	if c.Transactional && c.OffsetsTopic == "" {
		errs = append(errs, errors.New("OUTBOX_KAFKA_OFFSETS_TOPIC is empty; name the topic for the exactly-once positions (default outbox.connector.offsets)"))
	}
	if c.StatusInterval <= 0 || c.StatusInterval > 30*time.Second {
		errs = append(errs, fmt.Errorf("OUTBOX_STATUS_INTERVAL: %s; use a duration between 1ms and 30s (well inside wal_sender_timeout)", c.StatusInterval))
	}
	if c.StreamSilenceTimeout != 0 && c.StreamSilenceTimeout < time.Second {
		errs = append(errs, fmt.Errorf("OUTBOX_STREAM_SILENCE_TIMEOUT: %s; use 0 (the replication connection's wal_sender_timeout, at most 1m) or at least 1s", c.StreamSilenceTimeout))
	} else if c.StreamSilenceTimeout > 0 && c.StatusInterval > c.StreamSilenceTimeout/3 {
		// It caps the replication connection's wal_sender_timeout, which
		// status updates keep at bay.
		errs = append(errs, fmt.Errorf("OUTBOX_STATUS_INTERVAL: %s is over a third of OUTBOX_STREAM_SILENCE_TIMEOUT (%s); lower it or raise the timeout", c.StatusInterval, c.StreamSilenceTimeout))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("OUTBOX_MAX_IN_FLIGHT: %d; use a positive number", c.MaxInFlight))
	}
	if c.LeaseTTL < time.Second {
		errs = append(errs, fmt.Errorf("OUTBOX_LEASE_TTL: %s; use at least 1s", c.LeaseTTL))
	} else {
		// Status updates keep the walsender alive; its timeout is capped at
		// the TTL on the connector's replication connection.
		if c.StatusInterval > c.LeaseTTL/3 {
			errs = append(errs, fmt.Errorf("OUTBOX_STATUS_INTERVAL: %s is over a third of OUTBOX_LEASE_TTL (%s); lower it or raise the TTL", c.StatusInterval, c.LeaseTTL))
		}
		if c.TxnInterval < time.Millisecond || c.TxnInterval > c.LeaseTTL/3 {
			errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_TXN_INTERVAL: %s; use a duration between 1ms and a third of OUTBOX_LEASE_TTL (%s)", c.TxnInterval, c.LeaseTTL))
		}
	}
	switch c.Compression {
	case "none", "gzip", "snappy", "lz4", "zstd":
	default:
		errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_COMPRESSION: %q; use none, gzip, snappy, lz4 or zstd", c.Compression))
	}
	if c.MaxMessageBytes < 1024 {
		errs = append(errs, fmt.Errorf("OUTBOX_KAFKA_MAX_MESSAGE_BYTES: %d; use at least 1024", c.MaxMessageBytes))
	}
	if c.TopicPartitions < 1 {
		errs = append(errs, fmt.Errorf("OUTBOX_TOPIC_PARTITIONS: %d; use at least 1", c.TopicPartitions))
	}
	if c.HTTPEnabled() {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("OUTBOX_HTTP_ADDR: %q is not host:port; use e.g. 127.0.0.1:9189, or off to disable the endpoint", c.HTTPAddr))
		}
		if err := webconfig.Check("OUTBOX_HTTP_WEB_CONFIG", c.HTTPWebConfig); err != nil {
			errs = append(errs, err)
		}
	}
	if c.DLQTopic == "" {
		errs = append(errs, errors.New("OUTBOX_DLQ_TOPIC: empty; set a topic name such as outbox.dlq"))
	}
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// HTTPEnabled reports whether the HTTP endpoint is on: OUTBOX_HTTP_ADDR=off
// turns it off. (An empty environment variable means the default, like every
// setting's; an empty -http-addr flag, or an empty HTTPAddr set in code, also
// means off.)
func (c *Config) HTTPEnabled() bool {
	return c.HTTPAddr != webconfig.Off && c.HTTPAddr != ""
}

// tableIdentRE is a part of OUTBOX_TABLE: the names the outbox package
// takes (outbox.QuoteTable), of either case.
var tableIdentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// Table is the outbox table, parsed once from schema.table when the setting
// is read (a flag.Value); a bare name is in public. The names are taken as
// they are written, case kept, as the outbox package takes them
// (Sales.OutBox is the table "Sales"."OutBox"): every statement quotes them
// (pgx.Identifier), so a reserved word (order.select) is a name too.
type Table struct{ Schema, Name string }

// Set parses schema.table.
func (t *Table) Set(s string) error {
	schema, table, ok := strings.Cut(s, ".")
	if !ok {
		schema, table = "public", s
	}
	if !tableIdentRE.MatchString(schema) || !tableIdentRE.MatchString(table) {
		return notTable(s)
	}
	*t = Table{Schema: schema, Name: table}
	return nil
}

func notTable(s string) error {
	return fmt.Errorf("%q is not schema.table of plain identifiers (letters, digits, _ and $, at most 63, case kept)", s)
}

// String is schema.table.
func (t Table) String() string { return t.Schema + "." + t.Name }

// LogValue logs schema.table (a JSON log would show the struct).
func (t Table) LogValue() slog.Value { return slog.StringValue(t.String()) }

// TopicConfigs are the configs of created topics, parsed once from
// k=v,k=v when the setting is read (a flag.Value).
type TopicConfigs map[string]*string

// Set parses k=v,k=v; an empty text is no configs.
func (c *TopicConfigs) Set(s string) error {
	out := TopicConfigs{}
	if strings.TrimSpace(s) != "" {
		for _, kv := range strings.Split(s, ",") {
			k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				return fmt.Errorf("%q is not key=value", kv)
			}
			out[k] = &v
		}
	}
	*c = out
	return nil
}

// String is k=v,k=v in key order.
func (c *TopicConfigs) String() string {
	if c == nil {
		return ""
	}
	var kvs []string
	for _, k := range slices.Sorted(maps.Keys(*c)) {
		kvs = append(kvs, k+"="+*(*c)[k])
	}
	return strings.Join(kvs, ",")
}

// RedactDSN removes the password from a connection string for logs.
func RedactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	return regexp.MustCompile(`password\s*=\s*('[^']*'|\S+)`).ReplaceAllString(dsn, "password=xxxxx")
}

// RedactError is err's text without dsn (and its password).
func RedactError(err error, dsn string) string { return Redact(err, dsn).Error() }

// Redact is err with dsn (and its password) masked in its text; errors.As
// still finds what err holds (a *pgconn.PgError).
func Redact(err error, dsn string) error {
	return redact.Wrap(err, func(s string) string {
		if dsn != "" {
			s = strings.ReplaceAll(s, dsn, RedactDSN(dsn))
		}
		if cfg, perr := pgconn.ParseConfig(dsn); perr == nil && cfg.Password != "" {
			s = strings.ReplaceAll(s, cfg.Password, "xxxxx")
		}
		return s
	})
}
