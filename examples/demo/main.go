// Command demo runs the whole pipeline on one machine for `make demo`: a
// throwaway PostgreSQL, an in-process Kafka (franz-go's kfake) unless
// OUTBOX_KAFKA_BROKERS names a real one, the connector, a writer placing
// orders (order row and OrderPlaced outbox row in one transaction) and a
// consumer. It prints a one-line summary every second for DEMO_DURATION
// (default 30s) or until Ctrl-C, then stops everything it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/localenv"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/route"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout, stderr io.Writer) error {
	duration := 30 * time.Second
	if v := os.Getenv("DEMO_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("DEMO_DURATION: %q is not a duration such as 30s", v)
		}
		duration = d
	}
	rate := 200
	if v := os.Getenv("DEMO_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("DEMO_RATE: %q is not a positive number of orders per second", v)
		}
		rate = n
	}

	fmt.Fprintln(stdout, "demo: starting a throwaway PostgreSQL (initdb, wal_level=logical) ...")
	pg, err := localenv.NewPostgres(localenv.PGOptions{Fsync: true})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w (scripts/install.sh installs it)", err)
	}
	defer pg.Destroy()
	fmt.Fprintf(stdout, "demo: PostgreSQL %s on 127.0.0.1:%d\n", pg.Version, pg.Port)

	brokers := os.Getenv("OUTBOX_KAFKA_BROKERS")
	if brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return fmt.Errorf("start in-process Kafka: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()[0]
		fmt.Fprintf(stdout, "demo: in-process Kafka (kfake) on %s; set OUTBOX_KAFKA_BROKERS to use a real broker\n", brokers)
	} else {
		fmt.Fprintf(stdout, "demo: Kafka at %s\n", brokers)
	}

	setup, err := pgx.Connect(ctx, pg.DSN("outbox"))
	if err != nil {
		return err
	}
	if _, err := setup.Exec(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, customer text NOT NULL, amount_cents bigint NOT NULL, placed_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	setup.Close(ctx)

	// The connector, in-process, with its defaults.
	var cfg config.Config
	fs := flag.NewFlagSet("connector", flag.ContinueOnError)
	cfg.Bind(fs, func(string) string { return "" })
	cfg.PGDSN, cfg.Kafka.Brokers, cfg.HTTPAddr = pg.DSN("outbox"), brokers, ""
	cfg.StatusInterval = 500 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		return err
	}
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		return err
	}
	logw := &lineBuffer{}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rl := relay.New(cfg, router, log, metrics.New())

	runCtx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	relayCtx, stopRelay := context.WithCancel(context.Background())
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	for !rl.Streaming() {
		select {
		case err := <-relayDone:
			return fmt.Errorf("connector: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	fmt.Fprintf(stdout, "demo: connector streaming slot %s; placing %d orders/s for %s (Ctrl-C stops)\n", cfg.Slot, rate, duration)

	var written, consumed atomic.Int64
	lat := &latencies{}
	var wg sync.WaitGroup
	wg.Add(2)
	var writeErr, consumeErr error
	go func() { defer wg.Done(); writeErr = placeOrders(runCtx, pg.DSN("outbox"), rate, &written) }()
	consumerCtx, stopConsumer := context.WithCancel(context.Background())
	defer stopConsumer()
	go func() { defer wg.Done(); consumeErr = consume(consumerCtx, brokers, &consumed, lat) }()

	mon, err := pgx.Connect(ctx, pg.DSN("outbox"))
	if err != nil {
		return err
	}
	defer mon.Close(context.Background())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	summary := func() {
		var lag int64
		_ = mon.QueryRow(context.Background(), `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
			FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&lag)
		p50, p99 := lat.percentiles()
		fmt.Fprintf(stdout, "written %6d | published %6d | consumed %6d | commit-to-consume p50 %6.1f ms p99 %6.1f ms | slot lag %7d bytes\n",
			written.Load(), publishedCount(rl), consumed.Load(), p50, p99, lag)
	}
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case err := <-relayDone:
			stopConsumer()
			wg.Wait()
			return fmt.Errorf("connector stopped: %w", err)
		case <-tick.C:
			summary()
		}
	}
	// Let the consumer catch up with what was written, then stop in order:
	// writer (done), connector (graceful), consumer.
	deadline := time.Now().Add(15 * time.Second)
	for consumed.Load() < written.Load() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	summary()
	stopRelay()
	relayErr := <-relayDone
	stopConsumer()
	wg.Wait()
	if relayErr != nil {
		return fmt.Errorf("connector: %w", relayErr)
	}
	if writeErr != nil && !errors.Is(writeErr, context.Canceled) && !errors.Is(writeErr, context.DeadlineExceeded) {
		return fmt.Errorf("writer: %w", writeErr)
	}
	if consumeErr != nil && !errors.Is(consumeErr, context.Canceled) {
		return fmt.Errorf("consumer: %w", consumeErr)
	}
	if w, c := written.Load(), consumed.Load(); c < w {
		fmt.Fprintf(stdout, "demo: %d orders written, %d consumed (the rest was still in flight at the deadline)\n", w, c)
	} else {
		fmt.Fprintf(stdout, "demo: %d orders written, every one consumed from Kafka; stopped everything\n", w)
	}
	if s := logw.String(); s != "" {
		fmt.Fprint(stderr, "demo: connector warnings:\n"+s)
	}
	return nil
}

func publishedCount(r *relay.Relay) int64 { return r.Published() }

// placeOrders inserts an order and its OrderPlaced event in one transaction,
// rate times a second.
func placeOrders(ctx context.Context, dsn string, rate int, written *atomic.Int64) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	every := time.Second / time.Duration(rate)
	next := time.Now()
	for ctx.Err() == nil {
		id := uuid.New()
		customer := fmt.Sprintf("customer-%d", rand.Intn(100))
		amount := 100 + rand.Intn(10000)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (id, customer, amount_cents) VALUES ($1, $2, $3)`, id, customer, amount)
		b.Queue(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			VALUES (gen_random_uuid(), 'order', $1::text, 'OrderPlaced', jsonb_build_object('order_id', $1::text, 'customer', $2::text, 'amount_cents', $3::bigint, 'placed_at_ns', $4::bigint))`,
			id.String(), customer, amount, time.Now().UnixNano())
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			_ = tx.Rollback(context.Background())
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		written.Add(1)
		next = next.Add(every)
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}
	return ctx.Err()
}

func consume(ctx context.Context, brokers string, consumed *atomic.Int64, lat *latencies) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(250*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := time.Now()
		fs.EachRecord(func(r *kgo.Record) {
			consumed.Add(1)
			if ns := placedAt(r.Value); ns > 0 {
				lat.add(float64(now.UnixNano()-ns) / 1e6)
			}
		})
	}
}

// placedAt finds "placed_at_ns": N in the payload without a JSON decoder.
func placedAt(v []byte) int64 {
	const key = `"placed_at_ns": `
	for i := 0; i+len(key) <= len(v); i++ {
		if string(v[i:i+len(key)]) == key {
			j := i + len(key)
			k := j
			for k < len(v) && v[k] >= '0' && v[k] <= '9' {
				k++
			}
			n, _ := strconv.ParseInt(string(v[j:k]), 10, 64)
			return n
		}
	}
	return 0
}

type latencies struct {
	mu sync.Mutex
	ms []float64
}

func (l *latencies) add(ms float64) {
	l.mu.Lock()
	l.ms = append(l.ms, ms)
	if len(l.ms) > 20000 {
		l.ms = l.ms[len(l.ms)-10000:]
	}
	l.mu.Unlock()
}

func (l *latencies) percentiles() (p50, p99 float64) {
	l.mu.Lock()
	s := slices.Clone(l.ms)
	l.mu.Unlock()
	if len(s) == 0 {
		return 0, 0
	}
	slices.Sort(s)
	return s[len(s)*50/100], s[min(len(s)-1, len(s)*99/100)]
}

type lineBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.b) < 64<<10 {
		l.b = append(l.b, p...)
	}
	return len(p), nil
}

func (l *lineBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
