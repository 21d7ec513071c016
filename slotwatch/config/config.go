// Package config is slotwatch's configuration: every setting is a flag and a
// SLOTWATCH_* environment variable, with defaults that suit a production
// primary and a Validate that says what to change.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/webconfig"
)

// Defaults. Thresholds are chosen for a production primary whose relay
// normally runs milliseconds behind: anything that holds gigabytes or minutes
// of WAL is already an incident in the making.
const (
	DefaultListen           = "127.0.0.1:9188"
	DefaultInterval         = 10 * time.Second
	DefaultTimeout          = 5 * time.Second
	DefaultRateWindow       = 5 * time.Minute
	DefaultHistory          = 24 * time.Hour
	DefaultLagWarnBytes     = 1 << 30  // 1 GiB
	DefaultLagCritBytes     = 10 << 30 // 10 GiB
	DefaultLagWarnTime      = 5 * time.Minute
	DefaultInactiveWarnTime = 10 * time.Minute
	DefaultInvalidationTime = time.Hour
	// DefaultXminAgeWarn is a quarter of autovacuum_freeze_max_age's default
	// (200 million): a catalog_xmin that old blocks freezing of the catalogs
	// long before wraparound, and leaves time to act.
	DefaultXminAgeWarn = 50_000_000
	// DefaultFailoverLagBytes: a standby's copy of a failover slot further
	// behind than this makes a promotion publish that much WAL's events
	// again; PostgreSQL's slot sync naps up to 30 s between rounds.
	DefaultFailoverLagBytes = 256 << 20 // 256 MiB
	DefaultAlertRepeat      = 4 * time.Hour
	// DefaultAlertmanagerResend matches Prometheus' resend delay: Alertmanager
	// resolves an alert on its own when it is not re-sent before its endsAt.
	DefaultAlertmanagerResend = time.Minute
)

// Config holds every slotwatch setting.
type Config struct {
	// DSN is one or more PostgreSQL connection strings (SLOTWATCH_PG_DSN),
	// separated by commas, spaces or newlines; each may be prefixed with
	// "name=" to name the server in labels. Required. See Targets.
	DSN string
	// Listen is the HTTP address for /metrics, /healthz, /slots and the status
	// page (SLOTWATCH_LISTEN, default 127.0.0.1:9188).
	Listen string
	// WebConfig is a Prometheus exporter-toolkit web configuration file that
	// turns on TLS and basic authentication for every HTTP path
	// (SLOTWATCH_WEB_CONFIG, default none: plain HTTP, no authentication).
	WebConfig string
	// Interval is how often every server is queried (SLOTWATCH_INTERVAL,
	// default 10s).
	Interval time.Duration
	// Timeout bounds one collection, connecting included (SLOTWATCH_TIMEOUT,
	// default 5s).
	Timeout time.Duration
	// RateWindow is the window of the WAL rate behind
	// slotwatch_wal_bytes_per_second and the time to invalidation
	// (SLOTWATCH_RATE_WINDOW, default 5m).
	RateWindow time.Duration
	// History is how far back the LSN-to-time history reaches; lag in seconds
	// beyond it is reported as a lower bound (SLOTWATCH_HISTORY, default 24h).
	History time.Duration

	// LagWarnBytes fires SlotLagHigh (SLOTWATCH_LAG_WARN_BYTES, default 1 GiB).
	LagWarnBytes int64
	// LagCritBytes fires SlotLagCritical (SLOTWATCH_LAG_CRIT_BYTES, default 10 GiB).
	LagCritBytes int64
	// LagWarnTime fires SlotLagSecondsHigh (SLOTWATCH_LAG_WARN_TIME, default 5m).
	LagWarnTime time.Duration
	// InactiveWarnTime fires SlotInactive (SLOTWATCH_INACTIVE_WARN_TIME, default 10m).
	InactiveWarnTime time.Duration
	// InvalidationCritTime fires SlotTimeToInvalidationLow when the estimated
	// time to invalidation is below it (SLOTWATCH_INVALIDATION_CRIT_TIME, default 1h).
	InvalidationCritTime time.Duration
	// XminAgeWarn fires SlotCatalogXminAgeHigh (SLOTWATCH_XMIN_AGE_WARN,
	// default 50000000 transactions).
	XminAgeWarn int64
	// FailoverLagBytes fires SlotNotFailoverReady when a standby's copy of
	// a failover slot is further behind (SLOTWATCH_FAILOVER_LAG_BYTES,
	// default 256 MiB).
	FailoverLagBytes int64

	// AlertFor, when set, replaces every alert's own for-duration
	// (SLOTWATCH_ALERT_FOR, default unset: each alert's own).
	AlertFor string
	// AlertRepeat is how often a still-firing alert is sent again to the
	// webhook (SLOTWATCH_ALERT_REPEAT, default 4h).
	AlertRepeat time.Duration
	// WebhookURL receives Alertmanager-webhook-format JSON
	// (SLOTWATCH_ALERT_WEBHOOK_URL, default none). Treated as a secret.
	WebhookURL string
	// AlertmanagerURL is one or more Alertmanager base URLs, comma-separated;
	// alerts are posted to <url>/api/v2/alerts (SLOTWATCH_ALERTMANAGER_URL,
	// default none). Treated as a secret.
	AlertmanagerURL string
	// AlertmanagerResend is how often firing alerts are re-sent to
	// Alertmanager (SLOTWATCH_ALERTMANAGER_RESEND, default 1m).
	AlertmanagerResend time.Duration
	// ExternalURL is how people reach this slotwatch; it becomes the
	// generatorURL of alerts (SLOTWATCH_EXTERNAL_URL, default http://<listen>/).
	ExternalURL string

	// Outbox is the end-to-end watch (canary and audit), off unless
	// SLOTWATCH_OUTBOX_DSN is set.
	Outbox Outbox

	// Log is SLOTWATCH_LOG_LEVEL and SLOTWATCH_LOG_FORMAT.
	Log cli.Log

	envs []string
}

// Bind registers every setting on fs, with getenv supplying the defaults that
// flags override.
func (c *Config) Bind(fs *flag.FlagSet, getenv func(string) string) *iconfig.Binder {
	b := iconfig.NewBinder(fs, getenv)
	b.Secret(&c.DSN, "pg-dsn", "SLOTWATCH_PG_DSN", "PostgreSQL connection strings to watch, separated by commas or spaces; name=postgres://… names one")
	b.String(&c.Listen, "listen", "SLOTWATCH_LISTEN", DefaultListen, "address for /metrics, /healthz, /slots and the status page")
	b.String(&c.WebConfig, "web-config", "SLOTWATCH_WEB_CONFIG", "", "web configuration file (Prometheus exporter-toolkit format) for TLS and basic auth of the HTTP endpoints")
	b.Duration(&c.Interval, "interval", "SLOTWATCH_INTERVAL", DefaultInterval, "how often every server is queried")
	b.Duration(&c.Timeout, "timeout", "SLOTWATCH_TIMEOUT", DefaultTimeout, "deadline of one collection, connecting included")
	b.Duration(&c.RateWindow, "rate-window", "SLOTWATCH_RATE_WINDOW", DefaultRateWindow, "window of the WAL rate used for time to invalidation")
	b.Duration(&c.History, "history", "SLOTWATCH_HISTORY", DefaultHistory, "how far back the LSN-to-time history reaches (lag seconds beyond it are a lower bound)")
	b.Int64(&c.LagWarnBytes, "lag-warn-bytes", "SLOTWATCH_LAG_WARN_BYTES", DefaultLagWarnBytes, "slot lag in bytes that fires SlotLagHigh (warning)")
	b.Int64(&c.LagCritBytes, "lag-crit-bytes", "SLOTWATCH_LAG_CRIT_BYTES", DefaultLagCritBytes, "slot lag in bytes that fires SlotLagCritical (critical)")
	b.Duration(&c.LagWarnTime, "lag-warn-time", "SLOTWATCH_LAG_WARN_TIME", DefaultLagWarnTime, "slot lag in time that fires SlotLagSecondsHigh (warning)")
	b.Duration(&c.InactiveWarnTime, "inactive-warn-time", "SLOTWATCH_INACTIVE_WARN_TIME", DefaultInactiveWarnTime, "inactivity that fires SlotInactive (warning)")
	b.Duration(&c.InvalidationCritTime, "invalidation-crit-time", "SLOTWATCH_INVALIDATION_CRIT_TIME", DefaultInvalidationTime, "time to invalidation below which SlotTimeToInvalidationLow fires (critical)")
	b.Int64(&c.XminAgeWarn, "xmin-age-warn", "SLOTWATCH_XMIN_AGE_WARN", DefaultXminAgeWarn, "catalog_xmin age (transactions) that fires SlotCatalogXminAgeHigh (warning)")
	b.Int64(&c.FailoverLagBytes, "failover-lag-bytes", "SLOTWATCH_FAILOVER_LAG_BYTES", DefaultFailoverLagBytes, "how far (bytes) a standby's copy of a failover slot may be behind the primary's before SlotNotFailoverReady fires (warning)")
	b.String(&c.AlertFor, "alert-for", "SLOTWATCH_ALERT_FOR", "", "when set, how long every condition must hold before its alert fires (overrides each alert's own)")
	b.Duration(&c.AlertRepeat, "alert-repeat", "SLOTWATCH_ALERT_REPEAT", DefaultAlertRepeat, "how often a still-firing alert is sent again to the webhook")
	b.Secret(&c.WebhookURL, "alert-webhook-url", "SLOTWATCH_ALERT_WEBHOOK_URL", "URL that receives Alertmanager-webhook-format JSON")
	b.Secret(&c.AlertmanagerURL, "alertmanager-url", "SLOTWATCH_ALERTMANAGER_URL", "Alertmanager base URLs, comma-separated (alerts go to <url>/api/v2/alerts)")
	b.Duration(&c.AlertmanagerResend, "alertmanager-resend", "SLOTWATCH_ALERTMANAGER_RESEND", DefaultAlertmanagerResend, "how often firing alerts are re-sent to Alertmanager")
	b.String(&c.ExternalURL, "external-url", "SLOTWATCH_EXTERNAL_URL", "", "URL of this slotwatch, used as the alerts' generatorURL (default http://<listen>/)")
	c.Outbox.Bind(b)
	c.Log.Bind(b, "SLOTWATCH")
	c.envs = b.EnvVars()
	return b
}

// EnvVars lists every environment variable slotwatch reads, sorted. Each may
// also be given as NAME_FILE, naming a file that holds the value.
func EnvVars() []string {
	var c Config
	fs := flag.NewFlagSet("slotwatch", flag.ContinueOnError)
	c.Bind(fs, func(string) string { return "" })
	return c.envs
}

// Parse reads the environment through getenv and the flags in args (flags
// win) and validates the result. -help prints the settings to output and
// returns flag.ErrHelp.
func Parse(args []string, getenv func(string) string, output io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("slotwatch", flag.ContinueOnError)
	fs.SetOutput(output)
	b := c.Bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q: every setting is a -flag or a SLOTWATCH_* variable", fs.Args())
	}
	if err := b.Err(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate checks the settings and says how to fix what is wrong.
func (c *Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.DSN) == "" {
		errs = append(errs, errors.New("SLOTWATCH_PG_DSN: missing; set it to postgres://user@host:5432/db (several: separate them with commas or spaces)"))
	} else if _, err := c.Targets(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("SLOTWATCH_LISTEN: %q is not host:port; use e.g. %s or :9188", c.Listen, DefaultListen))
	}
	if err := webconfig.Check("SLOTWATCH_WEB_CONFIG", c.WebConfig); err != nil {
		errs = append(errs, err)
	}
	positive := []struct {
		env string
		d   time.Duration
	}{
		{"SLOTWATCH_INTERVAL", c.Interval},
		{"SLOTWATCH_TIMEOUT", c.Timeout},
		{"SLOTWATCH_RATE_WINDOW", c.RateWindow},
		{"SLOTWATCH_HISTORY", c.History},
		{"SLOTWATCH_LAG_WARN_TIME", c.LagWarnTime},
		{"SLOTWATCH_INACTIVE_WARN_TIME", c.InactiveWarnTime},
		{"SLOTWATCH_INVALIDATION_CRIT_TIME", c.InvalidationCritTime},
		{"SLOTWATCH_ALERT_REPEAT", c.AlertRepeat},
		{"SLOTWATCH_ALERTMANAGER_RESEND", c.AlertmanagerResend},
	}
	for _, p := range positive {
		if p.d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be a positive duration such as 10s, got %s", p.env, p.d))
		}
	}
	if c.History > 0 && c.RateWindow > c.History {
		errs = append(errs, fmt.Errorf("SLOTWATCH_RATE_WINDOW (%s) is longer than SLOTWATCH_HISTORY (%s); shorten the window or lengthen the history", c.RateWindow, c.History))
	}
	if c.LagWarnBytes <= 0 {
		errs = append(errs, fmt.Errorf("SLOTWATCH_LAG_WARN_BYTES: must be a positive number of bytes, got %d", c.LagWarnBytes))
	}
	if c.LagCritBytes <= 0 {
		errs = append(errs, fmt.Errorf("SLOTWATCH_LAG_CRIT_BYTES: must be a positive number of bytes, got %d", c.LagCritBytes))
	} else if c.LagCritBytes < c.LagWarnBytes {
		errs = append(errs, fmt.Errorf("SLOTWATCH_LAG_CRIT_BYTES (%d) is below SLOTWATCH_LAG_WARN_BYTES (%d); the critical threshold must be the larger", c.LagCritBytes, c.LagWarnBytes))
	}
	if c.FailoverLagBytes <= 0 {
		errs = append(errs, fmt.Errorf("SLOTWATCH_FAILOVER_LAG_BYTES: must be a positive number of bytes, got %d", c.FailoverLagBytes))
	}
	if c.XminAgeWarn <= 0 {
		errs = append(errs, fmt.Errorf("SLOTWATCH_XMIN_AGE_WARN: must be a positive number of transactions, got %d", c.XminAgeWarn))
	}
	if _, err := c.AlertForOverride(); err != nil {
		errs = append(errs, err)
	}
	if c.WebhookURL != "" {
		if err := checkHTTPURL(c.WebhookURL); err != nil {
			errs = append(errs, fmt.Errorf("SLOTWATCH_ALERT_WEBHOOK_URL: %w", err))
		}
	}
	for _, u := range c.AlertmanagerURLs() {
		if err := checkHTTPURL(u); err != nil {
			errs = append(errs, fmt.Errorf("SLOTWATCH_ALERTMANAGER_URL: %w", err))
		}
	}
	if c.ExternalURL != "" {
		if err := checkHTTPURL(c.ExternalURL); err != nil {
			errs = append(errs, fmt.Errorf("SLOTWATCH_EXTERNAL_URL: %w", err))
		}
	}
	if err := c.Outbox.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AlertForOverride is SLOTWATCH_ALERT_FOR parsed: nil when unset (every
// alert keeps its own for-duration).
func (c *Config) AlertForOverride() (*time.Duration, error) {
	if strings.TrimSpace(c.AlertFor) == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(c.AlertFor))
	if err != nil || d < 0 {
		return nil, fmt.Errorf("SLOTWATCH_ALERT_FOR: %q is not a duration; use Go syntax such as 0s, 30s or 5m, or leave it unset for each alert's own", c.AlertFor)
	}
	return &d, nil
}

// AlertmanagerURLs splits SLOTWATCH_ALERTMANAGER_URL.
func (c *Config) AlertmanagerURLs() []string {
	var out []string
	for _, f := range strings.FieldsFunc(c.AlertmanagerURL, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		out = append(out, strings.TrimRight(f, "/"))
	}
	return out
}

// GeneratorURL is ExternalURL, or the listen address as a URL (https when
// the web config turns TLS on).
func (c *Config) GeneratorURL() string {
	if c.ExternalURL != "" {
		return c.ExternalURL
	}
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return webconfig.Scheme(c.WebConfig) + "://" + net.JoinHostPort(host, port) + "/"
}

func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s is not a URL; use http(s)://host:port/path", RedactURL(raw))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s: scheme must be http or https", RedactURL(raw))
	}
	if u.Host == "" {
		return fmt.Errorf("%s: missing host", RedactURL(raw))
	}
	return nil
}
