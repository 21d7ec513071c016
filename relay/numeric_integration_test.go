package relay

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestNumericDeclaration: the router learns each column's type modifier
// from the snapshot's RowDescription and from pgoutput's Relation message,
// so a numeric column placed in a header gets Debezium's schema on both
// paths: VariableScaleDecimal for numeric, Decimal with its precision for
// numeric(10,2) (the bytes Debezium Server wrote in route's golden cases 47
// and 48).
func TestNumericDeclaration(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, "ALTER TABLE public.outbox ADD COLUMN amount numeric, ADD COLUMN price numeric(10,2)"); err != nil {
		t.Fatal(err)
	}
	aggType := uniqueType("num")
	insert := func(id string) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, amount, price)
			VALUES ($1, $2, '1', 'OrderCreated', '{}', 12.50, -1.5)`, id, aggType); err != nil {
			t.Fatal(err)
		}
	}
	insert("4d47e190-0402-4048-bc2c-89dd54343cd1") // before the first start: the snapshot reads it

	rcfg := route.DefaultConfig()
	rcfg.HeaderFormat = route.FormatJSONSchema
	rcfg.AdditionalFields = []route.AdditionalField{
		{Column: "amount", Placement: route.PlaceHeader, Alias: "amount"},
		{Column: "price", Placement: route.PlaceHeader, Alias: "price"},
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event."+aggType)
	run := startRelayRouting(t, testConfig(t, pg.DSN("outbox"), brokers), rcfg)
	run.waitStreaming(t)
	insert("4d47e190-0402-4048-bc2c-89dd54343cd2") // streamed

	deadline := time.Now().Add(60 * time.Second)
	for c.Count() < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	recs := c.Records()
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	const (
		amount = `{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"},"payload":{"scale":1,"value":"fQ=="}}`
		price  = `{"schema":{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}},"payload":"/2o="}`
	)
	for _, r := range recs {
		id := testenv.Header(r, "id")
		if got := testenv.Header(r, "amount"); got != amount {
			t.Errorf("%s: amount header\n got %s\nwant %s", id, got, amount)
		}
		if got := testenv.Header(r, "price"); got != price {
			t.Errorf("%s: price header\n got %s\nwant %s", id, got, price)
		}
	}
}
