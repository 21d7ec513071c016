package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/route"
	"github.com/pgoutbox/pgoutbox/slotwatch/audit"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
)

// auditMemoryLimit is the audit's soft memory limit (GOMEMLIMIT overrides).
const auditMemoryLimit = 32 << 20

// errMissing makes `slotwatch audit` exit 1 after its report.
var errMissing = errors.New("events are missing")

// exitAuditFailed is the exit status of an audit that could not finish:
// not 1, which says events are missing, nor 2, a usage error.
const exitAuditFailed = 3

// usage makes a configuration error exit 2, as a usage error: the exit
// status of slotwatch audit is a verdict, and 1 says events are missing.
func usage(err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	var u *cli.UsageError
	if errors.As(err, &u) {
		return err
	}
	return &cli.UsageError{Msg: err.Error()}
}

// deadLetterTable is where the connector keeps events too large for any
// topic (sql/003_dead_letter.sql): they are dead-lettered, not missing.
const deadLetterTable = "public.outbox_dead_letter"

// auditCmd is `slotwatch audit -since TIME [-until TIME]`: one audit of a
// window, one line per missing event, a summary, exit 1 when any is
// missing, 3 when the audit could not finish.
func auditCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("slotwatch audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := iconfig.NewBinder(fs, getenv)
	var o config.Outbox
	o.Bind(b)
	var since, until, table, idCol, timeCol, aggType, match string
	var chunk int
	fs.StringVar(&since, "since", "", "start of the window (RFC 3339, e.g. 2026-12-04T10:00:00Z); required")
	fs.StringVar(&until, "until", "", "end of the window (RFC 3339; default now − the grace period)")
	fs.StringVar(&table, "table", "", "table to audit (default OUTBOX_TABLE); a service's own table for a dual write")
	fs.StringVar(&idCol, "id-column", "", "column matched against Kafka (default the router's table.field.event.id, id)")
	fs.StringVar(&timeCol, "time-column", "created_at", "timestamptz column that bounds the window")
	fs.StringVar(&aggType, "aggregate-type", "", "every row's aggregate type, for a table without one (default: the router's route.by.field column)")
	fs.StringVar(&match, "match", string(audit.MatchHeader), "where records carry the id: header (the router's id header) or key")
	fs.IntVar(&chunk, "sort-chunk", audit.DefaultChunkSize, "ids per chunk of the external sort: memory grows with it, open spill files with the window divided by it")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: slotwatch audit -since TIME [-until TIME] [flags]\n\nReports every event committed in the window that is not in Kafka: one line \"missing <id> …\" each, then a summary; exit 1 when any is missing, 2 on a usage or configuration error, 3 when the audit could not finish.\nIt reads SLOTWATCH_OUTBOX_DSN, OUTBOX_KAFKA_*, OUTBOX_TABLE, OUTBOX_DLQ_TOPIC and OUTBOX_ROUTE_* as slotwatch does.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usage(err)
	}
	if fs.NArg() > 0 {
		return usage(fmt.Errorf("audit: unexpected arguments %q", fs.Args()))
	}
	if err := b.Err(); err != nil {
		return usage(err)
	}
	if !o.Enabled() {
		return usage(errors.New("audit: SLOTWATCH_OUTBOX_DSN: missing; set it to the outbox's database (role outbox_watch, sql/006_watch.sql)"))
	}
	if err := o.Validate(); err != nil {
		return usage(err)
	}
	if since == "" {
		return usage(errors.New("audit: -since is required (RFC 3339, e.g. 2026-12-04T10:00:00Z)"))
	}
	opts := audit.Options{Grace: o.AuditGrace, Skew: o.AuditSkew, ChunkSize: chunk, DLQTopic: o.DLQTopic, Match: audit.Match(match),
		HeaderFormat: o.Route.HeaderFormat, KeyFormat: o.Route.KeyFormat}
	var err error
	if opts.Since, err = time.Parse(time.RFC3339Nano, since); err != nil {
		return usage(fmt.Errorf("audit: -since %q is not an RFC 3339 time such as 2026-12-04T10:00:00Z", since))
	}
	if until != "" {
		if opts.Until, err = time.Parse(time.RFC3339Nano, until); err != nil {
			return usage(fmt.Errorf("audit: -until %q is not an RFC 3339 time such as 2026-12-04T11:00:00Z", until))
		}
		if !opts.Until.After(opts.Since) {
			return usage(errors.New("audit: -until must be after -since"))
		}
	}
	if opts.Match != audit.MatchHeader && opts.Match != audit.MatchKey {
		return usage(fmt.Errorf("audit: -match %q: use header or key", match))
	}
	// The converter of what is matched, as audit.Run checks it, but
	// refused here as a configuration error (exit 2), not a failed audit.
	what, format := "OUTBOX_ROUTE_HEADER_FORMAT: header", o.Route.HeaderFormat
	if opts.Match == audit.MatchKey {
		what, format = "OUTBOX_ROUTE_KEY_FORMAT: key", o.Route.KeyFormat
	}
	if err := audit.CheckFormat(what, format); err != nil {
		return usage(fmt.Errorf("audit: %w", err))
	}
	src, err := source(o, table, idCol, timeCol, aggType)
	if err != nil {
		return usage(err)
	}
	opts.Source = src
	if opts.Match == audit.MatchKey {
		// A key does not tell an aggregate's events apart, the id header
		// does: key mode is for a table the relay does not publish.
		if src.EventIDColumn != "" {
			return usage(errors.New("audit: -match key is for a service's own table (-table): the outbox's records carry the event id in their id header, which tells an aggregate's events apart; audit the outbox with -match header"))
		}
		if aggType == "" {
			return usage(errors.New("audit: -match key needs -aggregate-type: the aggregate type of every row of -table, whose topic is read"))
		}
	}
	if src.EventIDColumn != "" {
		opts.DeadLetterTable = deadLetterTable
	} else {
		// A service's own table: the connector dead-letters none of its
		// events.
		opts.DLQTopic = ""
	}
	if opts.Topic, err = route.TopicOf(o.Route); err != nil {
		return usage(fmt.Errorf("audit: routing (OUTBOX_ROUTE_*): %w", err))
	}
	opts.OnMissing = func(m audit.Missing) { fmt.Fprintln(stdout, m.String()) }
	opts.OnDuplicate = func(id string, n int) { fmt.Fprintf(stdout, "duplicate %s copies=%d\n", id, n) }

	// Parsed first: a malformed DSN is a configuration error (exit 2);
	// pgxpool.New fails on nothing else, as it connects lazily.
	pcfg, err := pgxpool.ParseConfig(o.DSN)
	if err != nil {
		return usage(fmt.Errorf("audit: SLOTWATCH_OUTBOX_DSN: %w", err))
	}
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return &cli.CodeError{Code: exitAuditFailed, Err: fmt.Errorf("audit: SLOTWATCH_OUTBOX_DSN: %w", err)}
	}
	defer db.Close()
	cl, err := kgo.NewClient(append(o.Kafka.Opts(nil), audit.ClientOpts()...)...)
	if err != nil {
		return &cli.CodeError{Code: exitAuditFailed, Err: fmt.Errorf("audit: Kafka client: %w", err)}
	}
	defer cl.Close()
	if os.Getenv("GOMEMLIMIT") == "" {
		// The audit's live memory is small and bounded (a few sort chunks
		// and one fetch), but it allocates a record per event read; a soft
		// limit makes the collector return that garbage before the heap
		// doubles, so the resident set stays near the live size.
		debug.SetMemoryLimit(auditMemoryLimit)
	}
	res, err := audit.Run(ctx, db, cl, opts)
	if ue := (*audit.UnreadableError)(nil); errors.As(err, &ue) {
		return &cli.CodeError{Code: exitAuditFailed, Err: fmt.Errorf("audit: %w (the missing lines above are no verdict: fix the topics or the converters and run it again)", err)}
	}
	if err != nil {
		return &cli.CodeError{Code: exitAuditFailed, Err: fmt.Errorf("audit: %w (the audit did not finish: the lines above, if any, are true but not the whole report; fix the cause and run it again)", err)}
	}
	fmt.Fprintln(stdout, res.Summary())
	if res.Missing > 0 {
		return fmt.Errorf("%w: %d of %d", errMissing, res.Missing, res.Audited)
	}
	return nil
}

// source is the table side of an audit: the outbox with the router's
// column names, or the table and columns the flags name.
func source(o config.Outbox, table, idCol, timeCol, aggType string) (audit.Source, error) {
	if table == "" {
		table = o.Table
	}
	qt, err := (&config.Outbox{Table: table}).QuotedTable()
	if err != nil {
		return audit.Source{}, err
	}
	if idCol == "" {
		idCol = o.Route.FieldEventID
	}
	ident := func(c string) string { return pgx.Identifier{c}.Sanitize() }
	s := audit.Source{Table: qt, IDColumn: ident(idCol), TimeColumn: ident(timeCol)}
	if oq, err := o.QuotedTable(); err == nil && oq == qt {
		// The outbox: its events are dead-lettered by event id, whatever
		// is matched.
		s.EventIDColumn = ident(o.Route.FieldEventID)
	}
	if aggType != "" {
		s.AggregateType = aggType
		s.KeyColumn = ident(idCol)
	} else {
		s.RouteColumn = ident(o.Route.RouteByField)
		s.KeyColumn = ident(o.Route.FieldEventKey)
	}
	return s, nil
}
