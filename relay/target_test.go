package relay

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/pgoutbox/pgoutbox/relay/lease"
)

// TestTarget: the reconnect counter's label comes from where the session
// met the error, not from its text (a PostgreSQL error may name Kafka: a
// table, a topic column, a message).
func TestTarget(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"producer", &kafkaError{fmt.Errorf("flush the Kafka transaction: %w", kerr.RequestTimedOut)}, "kafka"},
		{"fenced producer", fmt.Errorf("session: %w", &kafkaError{fmt.Errorf("%w: produce to Kafka: %w", lease.ErrFenced, kerr.InvalidProducerEpoch)}), "kafka"},
		{"postgres inside the producer", &kafkaError{fmt.Errorf("record a dead letter: %w", &pgconn.PgError{Code: "57P01"})}, "postgres"},
		{"postgres naming kafka", fmt.Errorf("read the slot: %w", &pgconn.PgError{Code: "42P01", Message: `relation "kafka_outbox" does not exist`}), "postgres"},
		{"state write", errors.New("write the state row: conn closed while writing the Kafka position"), "postgres"},
	} {
		if got := target(c.err); got != c.want {
			t.Errorf("%s: target(%q) = %s, want %s", c.name, c.err, got, c.want)
		}
	}
	// The mark hides nothing from the run loop.
	err := &kafkaError{fmt.Errorf("x: %w", lease.ErrFenced)}
	if !errors.Is(err, lease.ErrLost) || err.Error() != "x: "+lease.ErrFenced.Error() {
		t.Errorf("kafkaError changed the error: %v", err)
	}
}
