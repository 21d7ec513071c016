// Package kafkaopt holds the Kafka connection settings every binary shares,
// all named OUTBOX_KAFKA_*, and turns them into franz-go client options.
package kafkaopt

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Config is how to reach Kafka.
type Config struct {
	// Brokers is a comma-separated bootstrap list (OUTBOX_KAFKA_BROKERS).
	Brokers string
	// ClientID is the Kafka client id (OUTBOX_KAFKA_CLIENT_ID, default "outbox-connector").
	ClientID string
}

// Bind registers the settings on b.
func (c *Config) Bind(b *config.Binder, defaultClientID string) {
	b.String(&c.Brokers, "kafka-brokers", "OUTBOX_KAFKA_BROKERS", "", "comma-separated Kafka bootstrap brokers (host:port)")
	b.String(&c.ClientID, "kafka-client-id", "OUTBOX_KAFKA_CLIENT_ID", defaultClientID, "Kafka client id")
}

// Validate checks the settings.
func (c *Config) Validate() error {
	if strings.TrimSpace(c.Brokers) == "" {
		return errors.New("OUTBOX_KAFKA_BROKERS: missing; set it to the Kafka bootstrap brokers, e.g. kafka:9092")
	}
	return nil
}

// SeedBrokers splits the broker list.
func (c *Config) SeedBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.Brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// Opts returns the client options for the connection settings.
func (c *Config) Opts(log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(c.SeedBrokers()...), kgo.ClientID(c.ClientID)}
	if log != nil {
		opts = append(opts, kgo.WithLogger(kslog.New(log.With("component", "kafka"))))
	}
	return opts
}
