package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkaopt"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/route"
)

// Defaults of the end-to-end watch.
const (
	DefaultCanaryInterval = 10 * time.Second
	DefaultCanaryTimeout  = time.Minute
	DefaultAuditInterval  = time.Minute
	// DefaultAuditWindow: each round re-reads this much of the table and
	// of the topics, so that an event found missing stays reported (and
	// alerting) until it is published, for up to this long.
	DefaultAuditWindow = 15 * time.Minute
	DefaultAuditGrace  = time.Minute
	// DefaultAuditSkew: how far before a window the topics are read.
	DefaultAuditSkew = time.Minute
	// DefaultAuditCatchUp: after rounds that failed, how far back the next
	// round reaches at most (well inside Kafka's default retention of 7
	// days; a busy outbox's 6 hours is tens of millions of events, a few
	// minutes of audit).
	DefaultAuditCatchUp = 6 * time.Hour
)

// Outbox is the end-to-end watch: a canary event through the pipeline and
// an audit of the table against the topics. It is off unless
// SLOTWATCH_OUTBOX_DSN is set, because the canary writes to the outbox's
// database (a row every SLOTWATCH_CANARY_INTERVAL) and an idle database
// would no longer be idle. The Kafka connection, the table and the routing
// are the connector's own settings (OUTBOX_KAFKA_*, OUTBOX_TABLE,
// OUTBOX_ROUTE_*, OUTBOX_DLQ_TOPIC), so that slotwatch looks where the
// connector writes.
type Outbox struct {
	// DSN is the outbox's database (SLOTWATCH_OUTBOX_DSN), with a role
	// such as sql/006_watch.sql's outbox_watch. Empty: no canary, no audit.
	DSN string
	// Table is the outbox table (OUTBOX_TABLE, default public.outbox).
	Table string
	// DLQTopic is the connector's dead-letter topic (OUTBOX_DLQ_TOPIC,
	// default outbox.dlq): an event found there is dead-lettered, not
	// missing.
	DLQTopic string
	// Kafka is OUTBOX_KAFKA_*.
	Kafka kafkaopt.Config
	// Route is OUTBOX_ROUTE_*: where each event goes.
	Route route.Config

	// CanaryInterval is how often a canary is committed
	// (SLOTWATCH_CANARY_INTERVAL, default 10s; 0 turns the canary off).
	CanaryInterval time.Duration
	// CanaryTimeout fires PipelineStalled when no canary arrived for that
	// long (SLOTWATCH_CANARY_TIMEOUT, default 1m).
	CanaryTimeout time.Duration
	// AuditInterval is how often the audit runs (SLOTWATCH_AUDIT_INTERVAL,
	// default 1m; 0 turns the continuous audit off).
	AuditInterval time.Duration
	// AuditWindow is how far back each round looks (SLOTWATCH_AUDIT_WINDOW,
	// default 15m); AuditInterval must not exceed it minus AuditGrace.
	AuditWindow time.Duration
	// AuditGrace is how old an event must be before its absence counts
	// (SLOTWATCH_AUDIT_GRACE, default 1m).
	AuditGrace time.Duration
	// AuditSkew is how far before each window's start the topics are read
	// (SLOTWATCH_AUDIT_SKEW, default 1m): the largest gap between an
	// event's created_at and its record's timestamp (clocks, or
	// OUTBOX_ROUTE_FIELD_EVENT_TIMESTAMP naming another column).
	AuditSkew time.Duration
	// AuditCatchUp bounds how far back a round after failed ones reaches
	// (SLOTWATCH_AUDIT_CATCH_UP, default 6h; 0: to the last success).
	AuditCatchUp time.Duration
}

// Bind registers the end-to-end watch's settings on b.
func (o *Outbox) Bind(b *iconfig.Binder) {
	b.Secret(&o.DSN, "outbox-dsn", "SLOTWATCH_OUTBOX_DSN", "the outbox's database, for the canary and the audit (off when unset); role outbox_watch of sql/006_watch.sql")
	b.String(&o.Table, "outbox-table", "OUTBOX_TABLE", "public.outbox", "outbox table, schema-qualified (the connector's setting)")
	b.String(&o.DLQTopic, "dlq-topic", "OUTBOX_DLQ_TOPIC", "outbox.dlq", "the connector's dead-letter topic: events there are dead-lettered, not missing")
	b.Duration(&o.CanaryInterval, "canary-interval", "SLOTWATCH_CANARY_INTERVAL", DefaultCanaryInterval, "how often a canary event is committed and read back from Kafka (0: no canary)")
	b.Duration(&o.CanaryTimeout, "canary-timeout", "SLOTWATCH_CANARY_TIMEOUT", DefaultCanaryTimeout, "no canary from Kafka for this long fires PipelineStalled")
	b.Duration(&o.AuditInterval, "audit-interval", "SLOTWATCH_AUDIT_INTERVAL", DefaultAuditInterval, "how often the table is audited against the topics (0: no continuous audit)")
	b.Duration(&o.AuditWindow, "audit-window", "SLOTWATCH_AUDIT_WINDOW", DefaultAuditWindow, "how far back each audit round looks")
	b.Duration(&o.AuditGrace, "audit-grace", "SLOTWATCH_AUDIT_GRACE", DefaultAuditGrace, "how old an event must be before its absence from Kafka counts as missing")
	b.Duration(&o.AuditSkew, "audit-skew", "SLOTWATCH_AUDIT_SKEW", DefaultAuditSkew, "how far before each window the topics are read: the largest gap between an event's created_at and its record's timestamp")
	b.Duration(&o.AuditCatchUp, "audit-catch-up", "SLOTWATCH_AUDIT_CATCH_UP", DefaultAuditCatchUp, "after failed rounds, how far back the next round reaches at most (0: to the last success); a longer gap is logged for slotwatch audit to cover")
	o.Kafka.Bind(b, "slotwatch")
	o.Route = route.DefaultConfig()
	o.Route.Bind(b)
}

// Enabled reports whether the end-to-end watch runs.
func (o *Outbox) Enabled() bool { return strings.TrimSpace(o.DSN) != "" }

// QuotedTable is OUTBOX_TABLE quoted for SQL.
func (o *Outbox) QuotedTable() (string, error) {
	q, err := outbox.QuoteTable(o.Table)
	if err != nil {
		return "", fmt.Errorf("OUTBOX_TABLE: %w", err)
	}
	return q, nil
}

// Validate checks the settings the end-to-end watch needs, when it is on.
func (o *Outbox) Validate() error {
	if !o.Enabled() {
		return nil
	}
	var errs []error
	if err := o.Kafka.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("SLOTWATCH_OUTBOX_DSN is set, so the canary and the audit read Kafka: %w", err))
	}
	if _, err := o.QuotedTable(); err != nil {
		errs = append(errs, err)
	}
	if err := o.Route.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		env string
		d   time.Duration
	}{
		{"SLOTWATCH_CANARY_INTERVAL", o.CanaryInterval},
		{"SLOTWATCH_AUDIT_INTERVAL", o.AuditInterval},
		{"SLOTWATCH_AUDIT_GRACE", o.AuditGrace},
		{"SLOTWATCH_AUDIT_SKEW", o.AuditSkew},
		{"SLOTWATCH_AUDIT_CATCH_UP", o.AuditCatchUp},
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %s", d.env, d.d))
		}
	}
	if o.CanaryInterval > 0 && o.CanaryTimeout <= o.CanaryInterval {
		errs = append(errs, fmt.Errorf("SLOTWATCH_CANARY_TIMEOUT (%s) must be longer than SLOTWATCH_CANARY_INTERVAL (%s); a few intervals is right", o.CanaryTimeout, o.CanaryInterval))
	}
	if o.AuditInterval > 0 && o.AuditWindow <= o.AuditGrace {
		errs = append(errs, fmt.Errorf("SLOTWATCH_AUDIT_WINDOW (%s) must be longer than SLOTWATCH_AUDIT_GRACE (%s): the audit judges events between the two", o.AuditWindow, o.AuditGrace))
	} else if o.AuditInterval > 0 && o.AuditInterval > o.AuditWindow-o.AuditGrace {
		// A round at t judges [t−window, t−grace); the next, at
		// t+interval, starts at t+interval−window: past t−grace, events
		// committed in between would never be judged.
		errs = append(errs, fmt.Errorf("SLOTWATCH_AUDIT_INTERVAL (%s) must not be longer than SLOTWATCH_AUDIT_WINDOW (%s) minus SLOTWATCH_AUDIT_GRACE (%s): "+
			"each round judges the events between the two, so rounds further apart leave windows no round audits; shorten the interval or lengthen the window",
			o.AuditInterval, o.AuditWindow, o.AuditGrace))
	}
	if o.AuditInterval > 0 && o.AuditCatchUp > 0 && o.AuditCatchUp < o.AuditWindow {
		errs = append(errs, fmt.Errorf("SLOTWATCH_AUDIT_CATCH_UP (%s) must be 0 (no bound) or at least SLOTWATCH_AUDIT_WINDOW (%s): it bounds how far back a round after failed ones reaches, and every round reaches the window", o.AuditCatchUp, o.AuditWindow))
	}
	if o.CanaryInterval == 0 && o.AuditInterval == 0 {
		errs = append(errs, errors.New("SLOTWATCH_OUTBOX_DSN is set but SLOTWATCH_CANARY_INTERVAL and SLOTWATCH_AUDIT_INTERVAL are both 0; unset the DSN or turn one on"))
	}
	return errors.Join(errs...)
}
