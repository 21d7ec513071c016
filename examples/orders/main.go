// Command orders is the example order service: POST /orders places an order
// and its OrderPlaced event in one transaction (package outbox). The
// connector publishes the event to outbox.event.Order; examples/fulfillment
// consumes it.
//
//	ORDERS_PG_DSN=postgres://… ORDERS_LISTEN=127.0.0.1:8080 orders
//	curl -d '{"customer":"ada","amount_cents":1299}' localhost:8080/orders
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/pgoutbox/pgoutbox/examples/orders/order"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := config.NewBinder(fs, getenv)
	var dsn, listen, mode string
	b.Secret(&dsn, "pg-dsn", "ORDERS_PG_DSN", "PostgreSQL connection string (falls back to OUTBOX_PG_DSN)")
	b.String(&listen, "listen", "ORDERS_LISTEN", "127.0.0.1:8080", "HTTP listen address")
	b.String(&mode, "outbox-mode", "ORDERS_OUTBOX_MODE", "table", "table, delete-after-insert or message")
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
		return errors.New("ORDERS_PG_DSN: missing; set it to postgres://user@host:5432/db")
	}
	m, err := outbox.ParseMode(mode)
	if err != nil {
		return fmt.Errorf("ORDERS_OUTBOX_MODE: %w", err)
	}
	w, err := outbox.New(outbox.Config{Mode: m})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "orders")
	// With an OTLP endpoint configured (OTEL_EXPORTER_OTLP_ENDPOINT), the
	// spans go out to it: the global provider is what order.Handler uses.
	tp, err := tracing.Start(ctx, getenv, "orders", log)
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
	if _, err := pool.Exec(ctx, order.Schema); err != nil {
		return fmt.Errorf("create the orders table: %w", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	srv := &http.Server{Handler: order.Handler(&order.Service{DB: pool, Outbox: w}), ReadHeaderTimeout: 5 * time.Second}
	log.Info("listening", "addr", ln.Addr().String(), "outbox_mode", m.String())
	fmt.Fprintln(stdout, ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
