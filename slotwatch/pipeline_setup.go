package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/route"
	"github.com/pgoutbox/pgoutbox/slotwatch/audit"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
	"github.com/pgoutbox/pgoutbox/slotwatch/pipeline"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// defaultOutboxTable is sql/001_outbox.sql's table, quoted, where
// sql/006_watch.sql's functions write and delete canaries.
const defaultOutboxTable = `"public"."outbox"`

// newPipeline builds the end-to-end watch: the canary and the continuous
// audit, both off unless SLOTWATCH_OUTBOX_DSN is set.
func newPipeline(ctx context.Context, cfg config.Config, observe func(watch.Report), reg prometheus.Registerer, log *slog.Logger) (*pipeline.Watch, error) {
	o := cfg.Outbox
	db, err := pgxpool.New(ctx, o.DSN)
	if err != nil {
		return nil, fmt.Errorf("SLOTWATCH_OUTBOX_DSN: %w", err)
	}
	topicOf, err := route.TopicOf(o.Route)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("routing (OUTBOX_ROUTE_*): %w", err)
	}
	// The canary and the audit know an event by the id in its id header:
	// refuse at start a converter whose ids they could not read, rather
	// than report every canary late and every event missing.
	if err := audit.CheckFormat("OUTBOX_ROUTE_HEADER_FORMAT: header", o.Route.HeaderFormat); err != nil {
		db.Close()
		return nil, fmt.Errorf("the end-to-end watch: %w", err)
	}
	kopts := o.Kafka.Opts(nil) // the canary and the audit log their own failures; the client's debug lines would drown slotwatch's
	// Both set below, before anything scrapes the metrics.
	var canary *pipeline.Canary
	var pw *pipeline.Watch
	m := pipeline.NewMetrics(reg, func() float64 {
		if canary == nil {
			return 0
		}
		age, _ := canary.Status(time.Now())
		return age.Seconds()
	}, func() float64 {
		if pw == nil {
			return 0
		}
		return pw.AuditAge(time.Now()).Seconds()
	})
	if o.CanaryInterval > 0 {
		topic, err := topicOf(pipeline.CanaryAggregateType)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("the canary's aggregate type %s routes to no valid topic (OUTBOX_ROUTE_*): %w", pipeline.CanaryAggregateType, err)
		}
		// public.outbox: through outbox_write_canary, since outbox_watch
		// may not insert there (sql/006_watch.sql). Another table: as a
		// service writes, with the INSERT its operator grants.
		var w *outbox.Writer
		if qt, _ := o.QuotedTable(); qt != defaultOutboxTable {
			if w, err = outbox.New(outbox.Config{Table: o.Table}); err != nil {
				db.Close()
				return nil, fmt.Errorf("OUTBOX_TABLE: %w", err)
			}
		}
		canary = pipeline.NewCanary(pipeline.CanaryOptions{
			DB: db, Writer: w, Topic: topic, Kafka: kopts, Offset: min(cfg.Interval, o.CanaryInterval) / 2,
			Interval: o.CanaryInterval, Timeout: o.CanaryTimeout, Log: log, Metrics: m,
		})
	}
	src, err := source(o, "", "", "created_at", "")
	if err != nil {
		db.Close()
		return nil, err
	}
	every := cfg.Interval
	if o.CanaryInterval > 0 && o.CanaryInterval < every {
		every = o.CanaryInterval
	}
	log.Info("end-to-end watch on", "canary_interval", o.CanaryInterval.String(), "canary_timeout", o.CanaryTimeout.String(),
		"audit_interval", o.AuditInterval.String(), "audit_window", o.AuditWindow.String(), "audit_grace", o.AuditGrace.String(), "audit_catch_up", o.AuditCatchUp.String(), "table", o.Table)
	pw = pipeline.New(pipeline.Options{
		Canary: canary,
		// As `slotwatch audit` of the outbox: ids in the id header, read
		// with the router's converters, and the dead-letter table's events
		// dead-lettered, not missing.
		Audit: audit.Options{
			Source: src, Topic: topicOf, DLQTopic: o.DLQTopic, DeadLetterTable: deadLetterTable, Grace: o.AuditGrace, Skew: o.AuditSkew,
			CatchUp: o.AuditCatchUp, Match: audit.MatchHeader, HeaderFormat: o.Route.HeaderFormat, KeyFormat: o.Route.KeyFormat,
		},
		AuditInterval: o.AuditInterval, AuditWindow: o.AuditWindow,
		DB: db, Kafka: kopts, Every: every, OnReport: observe, Log: log, Metrics: m,
		Close: db.Close,
	})
	return pw, nil
}
