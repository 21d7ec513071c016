// Package cli is what every binary does the same way when it starts and
// stops: the signal context, the refusal of unknown environment variables,
// the exit code, and the logger its log settings describe.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Run is a binary's body: its flags in args, its environment through
// getenv, its output on stdout and stderr, until ctx is done.
type Run func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// UsageError is a command line the binary cannot make sense of (an
// unknown subcommand, a stray word): the binary exits 2, as the flag
// package does, and prints Msg, which says what it takes.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// CodeError makes the binary exit with Code after printing Err: for a
// command whose exit status carries a verdict (slotwatch audit: 1 events
// are missing, 3 the audit could not finish).
type CodeError struct {
	Code int
	Err  error
}

func (e *CodeError) Error() string { return e.Err.Error() }
func (e *CodeError) Unwrap() error { return e.Err }

// Main runs a binary and exits: the process's environment is checked
// against env (config.CheckUnknownEnv: a variable of its prefixes that the
// binary does not read is refused, a typo would otherwise run on a
// default), then run gets the process's arguments and a context canceled by
// SIGINT or SIGTERM. An error is printed on stderr as "name: error" with
// exit code 1 (2 for a *UsageError); flag.ErrHelp (help was asked for and
// printed) exits 0.
func Main(name string, env config.EnvRule, run Run) {
	check := func(environ []string) error { return config.CheckUnknownEnv(environ, env) }
	os.Exit(Exit(context.Background(), name, os.Environ(), os.Stderr, check, func(ctx context.Context) error {
		return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	}))
}

// Exit is Main without the exit: it returns the exit code.
func Exit(ctx context.Context, name string, environ []string, stderr io.Writer, check func([]string) error, run func(context.Context) error) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if check != nil {
		err = check(environ)
	}
	if err == nil {
		err = run(ctx)
	}
	var usage *UsageError
	var coded *CodeError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	case errors.As(err, &coded):
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return coded.Code
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// Log is a binary's log settings, PREFIX_LOG_LEVEL and PREFIX_LOG_FORMAT.
type Log struct {
	// Level is debug, info, warn or error (default info).
	Level string
	// Format is text or json (default text).
	Format string

	prefix string
}

// Bind binds the settings to the flags -log-level and -log-format and to
// the variables prefix_LOG_LEVEL and prefix_LOG_FORMAT.
func (l *Log) Bind(b *config.Binder, prefix string) {
	l.prefix = prefix
	b.String(&l.Level, "log-level", prefix+"_LOG_LEVEL", "info", "debug, info, warn or error")
	b.String(&l.Format, "log-format", prefix+"_LOG_FORMAT", "text", "text or json")
}

// Validate says which setting is wrong and what it may be.
func (l Log) Validate() error {
	var errs []error
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("%s_LOG_LEVEL: %q; use debug, info, warn or error", l.prefix, l.Level))
	}
	switch l.Format {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("%s_LOG_FORMAT: %q; use text or json", l.prefix, l.Format))
	}
	return errors.Join(errs...)
}

// Logger is the logger the settings describe, writing to w. A level it
// does not know is info (Validate refuses it first).
func (l Log) Logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.Level))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if l.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(&componentHandler{base: h, inner: h})
}

// componentHandler keeps one "component" attribute: a logger derived for a
// part (log.With("component", "kafka") from the connector's) replaces the
// name in place instead of adding a second one, as slog's handlers would; a
// JSON line with a key twice is read differently by different tools.
// Attributes are resolved when a logger is derived, not per line.
type componentHandler struct {
	base  slog.Handler // without the attributes below
	attrs []slog.Attr
	inner slog.Handler // base with attrs
}

func (h *componentHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *componentHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h *componentHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	merged := slices.Clone(h.attrs)
	for _, a := range attrs {
		if a.Key == "component" {
			if i := slices.IndexFunc(merged, func(m slog.Attr) bool { return m.Key == "component" }); i >= 0 {
				merged[i] = a
				continue
			}
		}
		merged = append(merged, a)
	}
	return &componentHandler{base: h.base, attrs: merged, inner: h.base.WithAttrs(merged)}
}

// WithGroup leaves the replacing behind: attributes after a group are the
// group's (none of ours opens one).
func (h *componentHandler) WithGroup(name string) slog.Handler {
	return h.inner.WithGroup(name)
}
