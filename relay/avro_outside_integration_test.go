package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestAvroOutsideDecoder: the connector's Avro records, with Confluent's
// AvroConverter defaults (schemas registered as AvroConverter derives
// them), read by an outside consumer: confluent-kafka for Python
// (librdkafka, read_committed) with its AvroDeserializer against the real
// registry's Confluent API. Every value equals the inserted payload: the
// payload text in Debezium's io.debezium.data.Json string, or, with
// table.expand.json.payload, the payload's values in the record derived
// from it (integers exact, never doubles).
func TestAvroOutsideDecoder(t *testing.T) {
	python := testenv.PythonClients(t)
	brokers := testenv.SharedKafka(t)
	url := testenv.StartRegistry(t)
	for _, tc := range []struct {
		name     string
		expand   bool
		payloads []string
	}{
		{"payload text", false, []string{
			`{"id": 1, "lineItems": [{"item": "Debezium in Action", "quantity": 2, "totalPrice": 39.98}], "customer": {"name": "Jane", "vip": true}}`,
			`{"text": "ünïcödé ✓ 😀 𝄞", "control": "tab\there\nnewline \u0001", "quote": "\"\\"}`,
			`{"big": 9007199254740993, "neg": -9223372036854775808, "exp": 1.0e21, "tiny": 1e-7, "zero": 0}`,
			`{}`, `[]`, `[1, "two", null, {"three": 3}]`, `42`, `"a JSON string"`, `true`, `null`,
			``, // a NULL payload: a null value
		}},
		{"expanded payload", true, []string{
			`{"id": 1, "name": "Jane", "price": 39.98, "vip": true}`,
			`{"order": {"id": 7, "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}]}, "tags": ["x", "y"]}`,
			`{"big": 9007199254740993, "small": -5, "ratio": 0.25, "text": "ünïcödé 😀 𝄞"}`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.StartPostgres(t, testenv.PGOptions{})
			ctx := context.Background()
			conn := pg.Conn(t, "outbox")
			aggType := uniqueType("py")
			topic := "outbox.event." + aggType
			cfg := testConfig(t, pg.DSN("outbox"), brokers)
			cfg.Route.ValueFormat = route.FormatAvro
			cfg.Route.RegistryURLs = []string{url}
			cfg.Route.ExpandJSONPayload = tc.expand
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			run := startRelayWith(t, cfg)
			run.waitStreaming(t)

			want := map[string]*string{} // by event id: the stored payload's text, nil for NULL
			for i, p := range tc.payloads {
				id := uuid.NewString()
				var payload any = p
				if p == "" {
					payload = nil
				}
				var stored *string
				if err := conn.QueryRow(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					VALUES ($1, $2, $3, 'Tested', $4) RETURNING payload::text`, id, aggType, fmt.Sprint("agg-", i%3), payload).Scan(&stored); err != nil {
					t.Fatalf("insert %s: %v", p, err)
				}
				want[id] = stored
			}

			cmd := exec.Command(python, filepath.Join("testdata", "avro_consume.py"), brokers, url, topic, fmt.Sprint(len(want)))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("confluent-kafka's AvroDeserializer: %v\n%s", err, stderr.String())
			}
			if err := run.stop(t); err != nil {
				t.Fatalf("relay stopped with %v", err)
			}
			got := 0
			sc := bufio.NewScanner(bytes.NewReader(out))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var rec struct {
					ID    string          `json:"id"`
					Key   string          `json:"key"`
					Value json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
					t.Fatalf("%s: %v", sc.Bytes(), err)
				}
				stored, ok := want[rec.ID]
				if !ok {
					t.Fatalf("an event not written: %s", sc.Bytes())
				}
				got++
				switch {
				case stored == nil:
					if string(rec.Value) != "null" {
						t.Errorf("event %s: a NULL payload decoded as %s; want null", rec.ID, rec.Value)
					}
				case tc.expand:
					if !sameJSONExact(t, rec.Value, []byte(*stored)) {
						t.Errorf("event %s: decoded %s\nwant the payload's values %s", rec.ID, rec.Value, *stored)
					}
				default:
					var text string
					if err := json.Unmarshal(rec.Value, &text); err != nil || text != *stored {
						t.Errorf("event %s: decoded %s (%v); want the payload text %q", rec.ID, rec.Value, err, *stored)
					}
				}
			}
			if got != len(want) {
				t.Fatalf("read %d records, want %d", got, len(want))
			}
			t.Logf("%d records decoded by confluent-kafka's AvroDeserializer, each equal to its payload", got)
		})
	}
}

// sameJSONExact reports whether two JSON texts hold the same values, their
// numbers compared exactly (an integer beyond 2^53 included).
func sameJSONExact(t testing.TB, a, b []byte) bool {
	t.Helper()
	parse := func(s []byte) any {
		d := json.NewDecoder(bytes.NewReader(s))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return v
	}
	var same func(x, y any) bool
	same = func(x, y any) bool {
		switch x := x.(type) {
		case json.Number:
			y, ok := y.(json.Number)
			if !ok {
				return false
			}
			fx, _, err1 := big.ParseFloat(x.String(), 10, 200, big.ToNearestEven)
			fy, _, err2 := big.ParseFloat(y.String(), 10, 200, big.ToNearestEven)
			return err1 == nil && err2 == nil && fx.Cmp(fy) == 0
		case map[string]any:
			y, ok := y.(map[string]any)
			if !ok || len(x) != len(y) {
				return false
			}
			for k, v := range x {
				if !same(v, y[k]) {
					return false
				}
			}
			return true
		case []any:
			y, ok := y.([]any)
			if !ok || len(x) != len(y) {
				return false
			}
			for i := range x {
				if !same(x[i], y[i]) {
					return false
				}
			}
			return true
		default: // a string, a bool, nil
			return x == y
		}
	}
	return same(parse(a), parse(b))
}
