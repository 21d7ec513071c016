package route

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// BenchmarkRouteJSON is the default path: Debezium's defaults, StringConverter,
// the jsonb payload passed through as stored.
func BenchmarkRouteJSON(b *testing.B) {
	r, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	row := orderRow(orderPayload)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(orderPayload)))
	for b.Loop() {
		if _, err := r.Route(ctx, row); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRouteJSONVariants are the JsonConverter variants users set.
func BenchmarkRouteJSONVariants(b *testing.B) {
	for _, v := range []struct {
		name string
		mod  func(*Config)
	}{
		{"json", func(c *Config) { c.ValueFormat = FormatJSON }},
		{"envelope", func(c *Config) {
			c.ValueFormat = FormatJSON
			c.AdditionalFields = []AdditionalField{{Column: "type", Placement: PlaceEnvelope, Alias: "eventType"}, {Column: "type", Placement: PlaceHeader, Alias: "eventType"}}
		}},
		{"expand", func(c *Config) { c.ValueFormat = FormatJSON; c.ExpandJSONPayload = true }},
		{"json-schema", func(c *Config) { c.ValueFormat = FormatJSONSchema; c.HeaderFormat = FormatJSONSchema }},
	} {
		b.Run(v.name, func(b *testing.B) {
			cfg := DefaultConfig()
			v.mod(&cfg)
			r, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			row := orderRow(orderPayload)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Route(ctx, row); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRouteAvro converts the JSON payload by the registered schema
// (cached after the first event) into the Confluent wire format.
func BenchmarkRouteAvro(b *testing.B) {
	reg := srfake.New()
	defer reg.Close()
	r := avroRouter(b, reg, nil)
	row := orderRow(orderPayload)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(ctx, row); err != nil {
			b.Fatal(err)
		}
	}
}
