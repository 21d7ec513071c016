// Command fulfillment is the example consumer: it reads OrderPlaced events
// from outbox.event.Order through package inbox and records one shipment and
// one charge per order, however often an event is delivered.
//
//	FULFILLMENT_PG_DSN=postgres://… OUTBOX_KAFKA_BROKERS=127.0.0.1:9092 fulfillment
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
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/pgoutbox/pgoutbox/examples/fulfillment/fulfill"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fulfillment:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("fulfillment", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := config.NewBinder(fs, getenv)
	var dsn, brokers, group, dlq string
	var retention time.Duration
	b.Secret(&dsn, "pg-dsn", "FULFILLMENT_PG_DSN", "PostgreSQL connection string (falls back to OUTBOX_PG_DSN)")
	b.String(&brokers, "kafka-brokers", "OUTBOX_KAFKA_BROKERS", "", "Kafka bootstrap brokers, comma-separated")
	b.String(&group, "group", "FULFILLMENT_GROUP", "fulfillment", "consumer group (and dedupe scope)")
	b.String(&dlq, "dlq-topic", "FULFILLMENT_DLQ_TOPIC", "fulfillment.dlq", "topic for events that keep failing")
	b.Duration(&retention, "inbox-retention", "FULFILLMENT_INBOX_RETENTION", inbox.DefaultRetention, "how long processed event ids are kept (longer than the duplicate window)")
	if err := b.Err(); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dsn == "" {
		dsn = getenv("OUTBOX_PG_DSN")
	}
	if dsn == "" {
		return errors.New("FULFILLMENT_PG_DSN: missing; set it to postgres://user@host:5432/db")
	}
	if brokers == "" {
		return errors.New("OUTBOX_KAFKA_BROKERS: missing; set it to host:9092[,host:9092]")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// With an OTLP endpoint configured (OTEL_EXPORTER_OTLP_ENDPOINT), the
	// spans go out to it: the global provider is what inbox uses.
	tp, err := tracing.Start(ctx, getenv, "fulfillment", log)
	if err != nil {
		return err
	}
	if tp != nil {
		otel.SetTracerProvider(tp)
		defer tracing.Shutdown(tp, 5*time.Second, log)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, fulfill.Schema); err != nil {
		return fmt.Errorf("create the fulfillment tables: %w", err)
	}
	if err := inbox.EnsureSchema(ctx, pool, ""); err != nil {
		return err
	}
	c, err := inbox.New(pool, fulfill.Handle, inbox.Config{
		Brokers: strings.Split(brokers, ","), Group: group, Topics: []string{fulfill.Topic},
		DLQTopic: dlq, Retention: retention, Logger: log,
	})
	if err != nil {
		return err
	}
	log.Info("consuming", "topic", fulfill.Topic, "group", group)
	err = c.Run(ctx)
	s := c.Stats()
	log.Info("stopped", "processed", s.Processed, "duplicates", s.Duplicates, "dead_lettered", s.DeadLettered)
	return err
}
