// Package fulfill is the fulfillment consumer of the example: for every
// OrderPlaced event it records one shipment and one charge, inside the inbox
// transaction (package inbox), so that an event delivered twice charges the
// card once. The charges table deliberately has no unique constraint on the
// order: exactly-once charging is the inbox's doing, and the tests count it.
package fulfill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
)

// Schema is the service's own tables.
const Schema = `
CREATE TABLE IF NOT EXISTS shipments (
    id         bigserial   PRIMARY KEY,
    order_id   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS charges (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);`

// Topic is where the order service's events arrive.
const Topic = "outbox.event.Order"

// placed mirrors the OrderPlaced payload (examples/orders/order.Placed).
type placed struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// Handle is the inbox handler. Events of other types are ignored when the
// connector places the type column in a header
// (OUTBOX_ROUTE_FIELDS_ADDITIONAL_PLACEMENT=type:header:eventType).
func Handle(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
	if t := inbox.Header(rec, "eventType"); t != "" && t != "OrderPlaced" {
		return nil
	}
	var p placed
	if err := json.Unmarshal(rec.Value, &p); err != nil || p.OrderID == "" {
		// Retrying cannot fix a malformed event: straight to the DLQ.
		return inbox.Permanent(fmt.Errorf("OrderPlaced payload: want {\"order_id\", \"amount_cents\"}: %v", err))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, p.OrderID); err != nil {
		return fmt.Errorf("record shipment: %w", err)
	}
	// Stands for the payment provider's call; a real one takes the event id
	// as its idempotency key, since it is outside this transaction.
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount_cents) VALUES ($1, $2)`, p.OrderID, p.AmountCents); err != nil {
		return fmt.Errorf("record charge: %w", err)
	}
	return nil
}
