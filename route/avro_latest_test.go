package route

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// use.latest.version + latest.compatibility.strict: the latest version is
// cached at the first lookup (even one whose strict check then failed),
// while the strict check asks the registry about its current latest
// (version -1). After the operator does what the error says (registers a
// compatible version), the event is checked against the new version and
// written with the stale one: it does not conform, and is dead-lettered.
func TestAvroLatestStrictRereads(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	var compatible atomic.Bool
	target, _ := url.Parse(reg.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/compatibility/") {
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			if compatible.Load() {
				w.Write([]byte(`{"is_compatible":true}`))
			} else {
				w.Write([]byte(`{"is_compatible":false}`))
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()
	const subject = "outbox.event.Order-value"
	if _, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"id","type":"int"}]}`}); err != nil {
		t.Fatal(err)
	}
	props := "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" +
		"value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=http://x\n"
	cfg, _ := ParseProperties(strings.NewReader(props))
	cfg.ValueFormat = FormatAvro
	cfg.RegistryURLs = []string{srv.URL}
	cfg.AvroAutoRegister, cfg.AvroUseLatestVersion, cfg.AvroLatestCompatibilityStrict = false, true, true
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	row := defaultsRow()
	for i := range row.Columns {
		row.Columns[i].Info = nil
		switch row.Columns[i].Name {
		case "payload":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte(`{"name": "x"}`)
		case "aggregateid":
			row.Columns[i].Null, row.Columns[i].Value = false, []byte("1")
		}
	}
	_, err = r.Route(context.Background(), row)
	if ClassOf(err) != ClassSchemaRejected {
		t.Fatalf("first attempt: %v", err)
	}
	t.Logf("waits: %v", err)
	// The operator registers a compatible version, as the message says.
	if _, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: `{"type":"record","name":"R","fields":[{"name":"name","type":"string"}]}`}); err != nil {
		t.Fatal(err)
	}
	compatible.Store(true)
	_, err = r.Route(context.Background(), row)
	if err != nil {
		t.Fatalf("after the fix: class %q (a dead letter): %v", ClassOf(err), err)
	}
}
