package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// Target is one PostgreSQL server (and database) to watch. Its Name, never
// its connection string, is what labels, logs and pages show.
type Target struct {
	// Name labels the server (label "server"): the name given as
	// name=postgres://…, else host:port/database.
	Name string
	// Database is the database the DSN connects to.
	Database string

	dsn      string
	password string
}

// NewTarget builds a target from a connection string; an empty name becomes
// host:port/database.
func NewTarget(name, dsn string) (Target, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		what := "malformed connection string"
		if strings.Contains(err.Error(), "failed to configure TLS") {
			// pgconn reads sslrootcert, sslcert and sslkey while parsing:
			// a missing file is not a syntax error, say which it is.
			what = "TLS settings (sslmode, sslrootcert, sslcert, sslkey) that cannot be used in"
		}
		return Target{}, fmt.Errorf("%s %s: %s", what, RedactDSN(dsn), mask(err.Error(), dsn, ""))
	}
	t := Target{Name: name, Database: cfg.Database, dsn: dsn, password: cfg.Password}
	if t.Name == "" {
		t.Name = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + "/" + cfg.Database
	}
	return t, nil
}

// DSN is the connection string, password included: hand it to the driver only.
func (t Target) DSN() string { return t.dsn }

// String is the target's name: printing a Target never prints its password.
func (t Target) String() string { return t.Name }

// LogValue keeps the connection string out of logs.
func (t Target) LogValue() slog.Value { return slog.StringValue(t.Name) }

// RedactError is err's text with the connection string and password masked.
func (t Target) RedactError(err error) string {
	if err == nil {
		return ""
	}
	return t.Redact(err).Error()
}

// Redact is err with the connection string and password masked in its
// text; errors.As still finds what err holds.
func (t Target) Redact(err error) error {
	return redact.Wrap(err, func(s string) string { return mask(s, t.dsn, t.password) })
}

// PipelineServer is the server label of the end-to-end watch's report and
// alerts (watch.PipelineServer): no database target may take the name,
// or its alerts and the pipeline's would share a label and resolve each
// other.
const PipelineServer = "pipeline"

var (
	namedURLRE = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9_.:-]*)=(postgres(?:ql)?://.*)$`)
	urlRE      = regexp.MustCompile(`^postgres(?:ql)?://`)
)

// Targets splits SLOTWATCH_PG_DSN into targets. URLs (postgres://…) are
// separated by commas or white space; a comma-separated piece that does not
// start a URL belongs to the one before (a multi-host URL such as
// postgres://h1:5432,h2:5432/db). A value without any URL is one key=value
// connection string. Names must be unique, and none may be PipelineServer.
func (c *Config) Targets() ([]Target, error) {
	type item struct{ name, dsn string }
	var items []item
	s := strings.TrimSpace(c.DSN)
	if !strings.Contains(s, "://") {
		items = append(items, item{dsn: s})
	} else {
		for _, field := range strings.Fields(s) {
			for _, piece := range strings.Split(field, ",") {
				if piece == "" {
					continue
				}
				if m := namedURLRE.FindStringSubmatch(piece); m != nil {
					items = append(items, item{name: m[1], dsn: m[2]})
					continue
				}
				if urlRE.MatchString(piece) {
					items = append(items, item{dsn: piece})
					continue
				}
				if len(items) == 0 {
					return nil, errors.New("SLOTWATCH_PG_DSN: the list must start with a postgres:// URL (or be a single key=value connection string)")
				}
				items[len(items)-1].dsn += "," + piece
			}
		}
	}
	var out []Target
	seen := map[string]bool{}
	var errs []error
	for i, it := range items {
		t, err := NewTarget(it.name, it.dsn)
		if err != nil {
			errs = append(errs, fmt.Errorf("SLOTWATCH_PG_DSN: entry %d: %w", i+1, err))
			continue
		}
		if t.Name == PipelineServer {
			errs = append(errs, fmt.Errorf("SLOTWATCH_PG_DSN: entry %d: the name %q is reserved for the end-to-end watch's alerts; name the server otherwise (name=postgres://…)", i+1, t.Name))
			continue
		}
		if seen[t.Name] {
			errs = append(errs, fmt.Errorf("SLOTWATCH_PG_DSN: two entries are both named %q; name them with name=postgres://…", t.Name))
			continue
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("SLOTWATCH_PG_DSN: no connection string found; set it to postgres://user@host:5432/db"))
	}
	return out, errors.Join(errs...)
}

var (
	kvPasswordRE  = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	urlUserinfoRE = regexp.MustCompile(`(://[^:/@\s]*):[^@\s]*@`)
)

// RedactDSN masks the password of a URL or key=value connection string.
func RedactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	if strings.Contains(dsn, "://") {
		// Not even a URL (a bad port, say): mask user:password@ and
		// password= by pattern.
		dsn = urlUserinfoRE.ReplaceAllString(dsn, "${1}:xxxxx@")
	}
	return kvPasswordRE.ReplaceAllString(dsn, "password=xxxxx")
}

// RedactURL masks the user info and query of a URL (webhook URLs carry
// tokens in either), keeping scheme, host and path for the operator.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(malformed URL)"
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		u.RawQuery = "xxxxx"
	}
	return u.String()
}

func mask(s, dsn, password string) string {
	if dsn != "" {
		s = strings.ReplaceAll(s, dsn, RedactDSN(dsn))
	}
	if password != "" {
		s = strings.ReplaceAll(s, password, "xxxxx")
		if esc := url.QueryEscape(password); esc != password {
			s = strings.ReplaceAll(s, esc, "xxxxx")
		}
		if esc := url.PathEscape(password); esc != password {
			s = strings.ReplaceAll(s, esc, "xxxxx")
		}
	}
	return s
}
