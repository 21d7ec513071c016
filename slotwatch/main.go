// Command slotwatch watches PostgreSQL replication slots so that operators
// see a stuck relay coming before its slot fills the primary's disk or is
// invalidated: lag in bytes and seconds, retained WAL, wal_status, time to
// invalidation, catalog_xmin age and inactivity, as Prometheus metrics, a
// status page and alerts it evaluates and delivers itself.
//
// Every setting is a flag and a SLOTWATCH_* environment variable; run with
// -help to list them. See docs/slotwatch.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/probe"
	"github.com/pgoutbox/pgoutbox/internal/webconfig"
	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
	"github.com/pgoutbox/pgoutbox/slotwatch/metric"
	"github.com/pgoutbox/pgoutbox/slotwatch/pipeline"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
	"github.com/pgoutbox/pgoutbox/slotwatch/web"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "audit" {
		// The exit status of slotwatch audit is a verdict (1: events are
		// missing), so a refused environment exits 2, a usage error.
		check := func(environ []string) error {
			if err := iconfig.CheckUnknownEnv(environ, envRule()); err != nil {
				return &cli.UsageError{Msg: err.Error()}
			}
			return nil
		}
		os.Exit(cli.Exit(context.Background(), "slotwatch", os.Environ(), os.Stderr, check, func(ctx context.Context) error {
			return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
		}))
	}
	cli.Main("slotwatch", envRule(), run)
}

// envRule: slotwatch refuses SLOTWATCH_* variables it does not read.
func envRule() iconfig.EnvRule {
	return iconfig.EnvRule{Prefixes: []string{"SLOTWATCH_"}, Known: config.EnvVars()}
}

// shutdownTimeout bounds the HTTP server's graceful stop.
const shutdownTimeout = 5 * time.Second

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "probe" {
		// A container healthcheck in an image with no shell or curl.
		if len(args) != 2 {
			return errors.New("usage: slotwatch probe URL")
		}
		return probe.Run(ctx, args[1])
	}
	if len(args) > 0 && args[0] == "audit" {
		return auditCmd(ctx, args[1:], getenv, stdout, stderr)
	}
	cfg, err := config.Parse(args, getenv, stdout)
	if err != nil {
		return err
	}
	log := cfg.Log.Logger(stderr)
	targets, err := cfg.Targets()
	if err != nil {
		return err
	}
	forAll, err := cfg.AlertForOverride()
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	engine := alert.New(alert.Options{
		Thresholds: alert.Thresholds{
			LagWarnBytes:         cfg.LagWarnBytes,
			LagCritBytes:         cfg.LagCritBytes,
			LagWarnTime:          cfg.LagWarnTime,
			InactiveWarnTime:     cfg.InactiveWarnTime,
			InvalidationCritTime: cfg.InvalidationCritTime,
			XminAgeWarn:          cfg.XminAgeWarn,
			FailoverLagBytes:     cfg.FailoverLagBytes,
		},
		ForOverride:      forAll,
		Repeat:           cfg.AlertRepeat,
		WebhookURL:       cfg.WebhookURL,
		AlertmanagerURLs: cfg.AlertmanagerURLs(),
		Resend:           cfg.AlertmanagerResend,
		Interval:         cfg.Interval,
		GeneratorURL:     cfg.GeneratorURL(),
		Log:              log.With("component", "alert"),
	}, reg)

	watcher, err := watch.New(targets, watch.Options{
		Interval:   cfg.Interval,
		Timeout:    cfg.Timeout,
		RateWindow: cfg.RateWindow,
		History:    cfg.History,
		Log:        log.With("component", "watch"),
		OnReport:   engine.Observe,
	})
	if err != nil {
		return err
	}
	reg.MustRegister(metric.New(watcher.Reports, engine.Active))

	var pipe *pipeline.Watch
	if cfg.Outbox.Enabled() {
		if pipe, err = newPipeline(ctx, cfg, engine.Observe, reg, log.With("component", "pipeline")); err != nil {
			return err
		}
		defer pipe.Close()
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("SLOTWATCH_LISTEN: cannot listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{
		Handler: web.Handler(web.Source{
			Reports:  watcher.Reports,
			Alerts:   engine.Active,
			Interval: cfg.Interval,
		}, reg, log.With("component", "web")),
		ReadHeaderTimeout: 10 * time.Second,
	}

	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	sinks := []string{}
	if cfg.WebhookURL != "" {
		sinks = append(sinks, "webhook "+config.RedactURL(cfg.WebhookURL))
	}
	for _, u := range cfg.AlertmanagerURLs() {
		sinks = append(sinks, "alertmanager "+config.RedactURL(u))
	}
	tls, users := webconfig.Summary(cfg.WebConfig)
	log.Info("slotwatch starting", "listen", ln.Addr().String(), "tls", tls, "basic_auth_users", users, "servers", names, "interval", cfg.Interval.String(), "alert_sinks", sinks)

	// Shutdown order: the signal cancels ctx; the watcher stops collecting,
	// the HTTP server drains within shutdownTimeout, and the alert engine
	// delivers what is still queued within its flush timeout. run returns
	// after all three have.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Run(gctx) })
	g.Go(func() error { return engine.Run(gctx) })
	if pipe != nil {
		g.Go(func() error { return pipe.Run(gctx) })
	}
	g.Go(func() error {
		return webconfig.Serve(ln, srv, "SLOTWATCH_WEB_CONFIG", cfg.WebConfig, log.With("component", "web"))
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	err = g.Wait()
	log.Info("slotwatch stopped")
	return err
}
