// Package pipeline is slotwatch's end-to-end watch of the outbox pipeline:
// a canary event committed through the outbox and read back from Kafka,
// which proves events flow now, and a continuous audit of the table against
// the topics, which finds every event that did not. The connector's own
// metrics cannot prove delivery: a wedged relay, a wrong publication, a
// skipped window or a deleted topic all look healthy from inside it.
package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/slotwatch/audit"
)

// CanaryAggregateType is the canary's aggregate type: its events go to
// their own topic (outbox.event.__canary with the default routing), which
// no consumer of real topics reads.
const CanaryAggregateType = "__canary"

// canaryRetention: canary rows older than this are deleted from the table.
const canaryRetention = time.Hour

// CanaryOptions configures the canary.
type CanaryOptions struct {
	// DB writes the canaries (role outbox_watch).
	DB *pgxpool.Pool
	// Writer writes them as the services do, into an outbox table other
	// than public.outbox (OUTBOX_TABLE), where the operator grants the
	// role INSERT. Nil: through public.outbox_write_canary
	// (sql/006_watch.sql), the only way outbox_watch may write to
	// public.outbox, so that its password cannot publish anything but
	// canaries.
	Writer *outbox.Writer
	// Topic is where the canary's aggregate type routes.
	Topic string
	// Kafka are the client options of the connection (OUTBOX_KAFKA_*).
	Kafka []kgo.Opt
	// Offset delays the first canary: half slotwatch's collection
	// interval (or the canary's, if shorter), so that canaries commit
	// between its collections.
	Offset time.Duration
	// Interval and Timeout are SLOTWATCH_CANARY_INTERVAL and _TIMEOUT.
	Interval, Timeout time.Duration
	Log               *slog.Logger
	Metrics           *Metrics
}

// Canary commits an event every Interval and reads it back from Kafka
// (read_committed): the time from the commit returning to the record
// arriving is the latency the pipeline gives events now.
type Canary struct {
	o        CanaryOptions
	instance string // the canaries' aggregate id: this process's only

	mu      sync.Mutex
	started time.Time
	// newest is the commit time (as noted in sent) of the newest canary
	// received: what the age counts from. Not the arrival time: a replay
	// of old canaries, or canaries arriving behind a long backlog, arrive
	// now but prove nothing about an event committed now.
	newest  time.Time
	lastErr string
	// sent holds the canaries committed and not yet received: id → when
	// its commit returned. Only these count when read back, so a replay
	// of a received canary, another process's and a late one pruned from
	// here are all ignored. Pruned at 2×Timeout, so it stays bounded.
	sent map[string]time.Time
}

// NewCanary returns a canary; Run starts it.
func NewCanary(o CanaryOptions) *Canary {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &Canary{o: o, instance: fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b)), sent: map[string]time.Time{}}
}

// Status is the canary's part of the pipeline report: age is now minus
// the commit time of the newest canary received (minus the start, before
// the first), so it grows while no canary committed since goes through,
// whatever else arrives.
func (c *Canary) Status(now time.Time) (age time.Duration, lastErr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	since := c.newest
	if since.IsZero() {
		since = c.started
	}
	if since.IsZero() {
		return 0, c.lastErr
	}
	return now.Sub(since), c.lastErr
}

// Run writes and reads canaries until ctx ends.
func (c *Canary) Run(ctx context.Context) error {
	start := time.Now()
	c.mu.Lock()
	c.started = start
	c.mu.Unlock()
	c.o.Metrics.canaryTimeout.Set(c.o.Timeout.Seconds())

	// Consume from a little before the start, so that the first canaries
	// are read even when the topic is created by their own publication;
	// canaries of other processes or of earlier runs are skipped by id
	// (receive).
	opts := append([]kgo.Opt{
		kgo.ConsumeTopics(c.o.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(start.Add(-time.Minute).UnixMilli())),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.MetadataMinAge(time.Second),
		kgo.MetadataMaxAge(10 * time.Second),
		kgo.FetchMaxWait(time.Second),
	}, c.o.Kafka...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("canary: Kafka client: %w", err)
	}
	defer cl.Close()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.read(ctx, cl)
	}()
	// The first canary waits for Offset: slotwatch collects from every
	// server on its own ticker, started at the same moment, and a canary
	// committed while those queries run measured them too (on two busy
	// cores, 1 to 2 ms of a 5 ms latency, each canary, as both tickers
	// kept their phase).
	select {
	case <-ctx.Done():
	case <-time.After(c.o.Offset):
	}
	c.write(ctx)
	wg.Wait()
	return nil
}

func (c *Canary) write(ctx context.Context) {
	t := time.NewTicker(c.o.Interval)
	defer t.Stop()
	lastClean := time.Time{}
	for seq := int64(1); ; seq++ {
		wctx, cancel := context.WithTimeout(ctx, c.o.Interval)
		err := c.writeOne(wctx, seq)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		if err != nil {
			c.lastErr = "write: " + err.Error()
			c.o.Metrics.canaryErrors.WithLabelValues("write").Inc()
			c.o.Log.Warn("canary: cannot commit a canary event; PipelineStalled fires if this lasts", "err", err)
		} else if strings.HasPrefix(c.lastErr, "write:") {
			c.lastErr = ""
		}
		// Forget canaries that never arrived, once they are long overdue.
		for id, at := range c.sent {
			if time.Since(at) > 2*c.o.Timeout {
				delete(c.sent, id)
			}
		}
		c.mu.Unlock()
		if time.Since(lastClean) > time.Minute {
			lastClean = time.Now()
			if _, err := c.o.DB.Exec(ctx, `SELECT outbox_delete_canaries($1)`, canaryRetention); err != nil && ctx.Err() == nil {
				c.o.Log.Warn("canary: cannot delete old canary rows (grant EXECUTE on outbox_delete_canaries, sql/006_watch.sql)", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeOne commits one canary in its own transaction, as a service would.
func (c *Canary) writeOne(ctx context.Context, seq int64) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	// Noted before the commit, so that a canary read back before the
	// commit's reply reaches us is still timed (from slightly earlier);
	// the commit's return time replaces it when the record has not come.
	key := id.String()
	c.mu.Lock()
	c.sent[key] = time.Now()
	c.mu.Unlock()
	payload := map[string]any{"instance": c.instance, "seq": seq}
	if c.o.Writer == nil {
		err = c.writeByFunction(ctx, id, payload)
	} else {
		err = pgx.BeginFunc(ctx, c.o.DB, func(tx pgx.Tx) error {
			_, err := c.o.Writer.Write(ctx, tx, outbox.Event{
				ID: id, AggregateType: CanaryAggregateType, AggregateID: c.instance, Type: canaryType, Payload: payload,
			})
			return err
		})
	}
	c.mu.Lock()
	if err != nil {
		// Rolled back, or its fate unknown (the commit's reply lost): a
		// canary that committed anyway is still counted when it arrives.
		c.mu.Unlock()
		return err
	}
	if _, waiting := c.sent[key]; waiting {
		c.sent[key] = time.Now()
	}
	c.mu.Unlock()
	c.o.Metrics.canarySent.Inc()
	return nil
}

// canaryType is the canaries' event type (outbox_write_canary's too).
const canaryType = "Canary"

// writeByFunction commits one canary through public.outbox_write_canary:
// one statement, its own transaction, as a service's commit.
func (c *Canary) writeByFunction(ctx context.Context, id uuid.UUID, payload map[string]any) error {
	body, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	_, err = c.o.DB.Exec(ctx, `SELECT public.outbox_write_canary($1, $2, $3::jsonb)`, id, c.instance, string(body))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function
		return fmt.Errorf("public.outbox_write_canary does not exist: apply sql/006_watch.sql (outbox_watch writes canaries only through it): %w", err)
	}
	return err
}

func (c *Canary) read(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		fs.EachError(func(t string, p int32, err error) {
			c.mu.Lock()
			c.lastErr = fmt.Sprintf("read %s[%d]: %v", t, p, err)
			c.mu.Unlock()
			c.o.Metrics.canaryErrors.WithLabelValues("read").Inc()
			c.o.Log.Warn("canary: cannot read the canary topic", "topic", t, "partition", p, "err", err)
		})
		fs.EachRecord(func(r *kgo.Record) { c.receive(r, now) })
	}
}

// receive takes one record of the canary topic, read at now. A record is
// a canary of this process when the event id in its id header (decoded
// whichever of the router's converters wrote it) is one still pending in
// sent: the key is not looked at, as OUTBOX_ROUTE_FIELD_EVENT_KEY and the
// key converter decide what it holds.
func (c *Canary) receive(r *kgo.Record, now time.Time) {
	id, ok := "", false
	for _, h := range r.Headers {
		if h.Key == "id" {
			id, ok = audit.DecodeID(h.Value)
		}
	}
	if !ok {
		return
	}
	c.mu.Lock()
	at, mine := c.sent[id]
	if !mine {
		c.mu.Unlock()
		return
	}
	delete(c.sent, id)
	if at.After(c.newest) {
		c.newest = at
	}
	if strings.HasPrefix(c.lastErr, "read ") {
		c.lastErr = ""
	}
	c.mu.Unlock()
	c.o.Metrics.canaryReceived.Inc()
	lat := now.Sub(at)
	c.o.Metrics.canaryLatency.Observe(lat.Seconds())
	c.o.Log.Debug("canary: read back", "id", id, "latency_seconds", lat.Seconds(), "committed_at", at.UTC().Format(time.RFC3339Nano))
}
