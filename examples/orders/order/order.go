// Package order is the order service of the example: placing an order
// writes the order row and its OrderPlaced event in one transaction (package
// outbox), so an order exists if and only if its event will be published.
// NaiveService does the same with a dual write (commit, then publish to
// Kafka), the failure the outbox exists to prevent; it is here only so that
// tests can show the difference.
package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// Schema is the service's own table.
const Schema = `CREATE TABLE IF NOT EXISTS orders (
    id           text        PRIMARY KEY,
    customer     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
)`

// AggregateType names the topic the events go to: outbox.event.Order.
const AggregateType = "Order"

// Order is a placed order.
type Order struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// Placed is the OrderPlaced event's payload.
type Placed struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// Service places orders with the outbox.
type Service struct {
	DB     *pgxpool.Pool
	Outbox *outbox.Writer // nil: table mode on public.outbox
}

// Place inserts o and its OrderPlaced event in one transaction. An empty
// o.ID gets a new UUIDv7.
func (s *Service) Place(ctx context.Context, o Order) (Order, error) {
	if o.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return o, err
		}
		o.ID = id.String()
	}
	w := s.Outbox
	if w == nil {
		w, _ = outbox.New(outbox.Config{})
	}
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, amount_cents) VALUES ($1, $2, $3)`,
			o.ID, o.Customer, o.AmountCents); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		_, err := w.Write(ctx, tx, outbox.Event{
			AggregateType: AggregateType, AggregateID: o.ID, Type: "OrderPlaced",
			Payload: Placed{OrderID: o.ID, Customer: o.Customer, AmountCents: o.AmountCents},
		})
		return err
	})
	if err != nil {
		return o, fmt.Errorf("place order: %w", err)
	}
	return o, nil
}

// Placer is what the HTTP handler needs: Service or NaiveService.
type Placer interface {
	Place(ctx context.Context, o Order) (Order, error)
}

// Handler serves POST /orders {"customer": "...", "amount_cents": 1234}
// with 201 and the order as JSON. Each request runs in an HTTP server span
// (otelhttp; the global TracerProvider unless opts name one, a no-op until
// the program installs one), which continues a W3C traceparent the caller
// sent; its ctx reaches the outbox write, which stores the trace context
// with the event, so the connector's relay span and the consumer's handler
// span join the request's trace.
func Handler(p Placer, opts ...otelhttp.Option) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var o Order
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&o); err != nil {
			http.Error(w, "body: want {\"customer\": \"...\", \"amount_cents\": 1234}", http.StatusBadRequest)
			return
		}
		if strings.TrimSpace(o.Customer) == "" || o.AmountCents <= 0 {
			http.Error(w, "customer and a positive amount_cents are required", http.StatusBadRequest)
			return
		}
		o.ID = ""
		placed, err := p.Place(r.Context(), o)
		if err != nil {
			http.Error(w, "could not place the order", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(placed)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	opts = append([]otelhttp.Option{
		// W3C's whatever the global propagator is (a no-op by default).
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }),
		otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path != "/healthz" }),
	}, opts...)
	return otelhttp.NewHandler(mux, "orders", opts...)
}

// NaiveService is the dual write the outbox replaces: commit the order,
// then publish OrderPlaced to Kafka. A crash (or a Kafka outage longer than
// the produce timeout) between the two leaves an order whose event never
// exists. Do not copy it; it is the contrast in the tests.
type NaiveService struct {
	DB *pgxpool.Pool
	// NewClient creates the producer; Crash replaces it.
	NewClient func() (*kgo.Client, error)
	// Topic of the events (default outbox.event.Order).
	Topic string

	mu sync.Mutex
	cl *kgo.Client
}

// ErrCrashed is returned by Place for an order committed while the
// simulated process died before its event was acknowledged.
var ErrCrashed = errors.New("service crashed between commit and publish")

// Place commits the order, then publishes its event.
func (s *NaiveService) Place(ctx context.Context, o Order) (Order, error) {
	if o.ID == "" {
		o.ID = uuid.Must(uuid.NewV7()).String()
	}
	if _, err := s.DB.Exec(ctx, `INSERT INTO orders (id, customer, amount_cents) VALUES ($1, $2, $3)`,
		o.ID, o.Customer, o.AmountCents); err != nil {
		return o, fmt.Errorf("insert order: %w", err)
	}
	// --- the order is committed; its event exists only in this process ---
	cl, err := s.client()
	if err != nil {
		return o, err
	}
	payload, _ := json.Marshal(Placed{OrderID: o.ID, Customer: o.Customer, AmountCents: o.AmountCents})
	topic := s.Topic
	if topic == "" {
		topic = "outbox.event." + AggregateType
	}
	rec := &kgo.Record{Topic: topic, Key: []byte(o.ID), Value: payload,
		Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(uuid.Must(uuid.NewV7()).String())}}}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		if errors.Is(err, kgo.ErrClientClosed) {
			return o, ErrCrashed
		}
		return o, fmt.Errorf("publish OrderPlaced (the order is committed): %w", err)
	}
	return o, nil
}

func (s *NaiveService) client() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cl == nil {
		cl, err := s.NewClient()
		if err != nil {
			return nil, err
		}
		s.cl = cl
	}
	return s.cl, nil
}

// Crash simulates the process dying: the producer is closed without a
// flush, so every event committed but not yet acknowledged is gone, as it
// is when a real process is killed.
func (s *NaiveService) Crash() {
	s.mu.Lock()
	cl := s.cl
	s.cl = nil
	s.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}
