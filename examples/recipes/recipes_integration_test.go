package recipes

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestRecipes runs the README's two recipes, as README shows them, against
// a real PostgreSQL with sql/ applied and the connector: each event arrives
// in outbox.event.order, keyed by its order, with its id header and its
// payload.
func TestRecipes(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"write_event.sql", "write_event.py"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(readme, b) {
			t.Errorf("README.md does not show examples/recipes/%s as it is", f)
		}
	}

	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	python := testenv.PythonClients(t)
	if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-c",
		"CREATE TABLE orders (id text PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartConsumer(t, brokers, "outbox.event.order")
	p := testenv.StartProc(t, testenv.Binary(t, "connector"), map[string]string{
		"OUTBOX_PG_DSN": pg.DSN("outbox"), "OUTBOX_KAFKA_BROKERS": brokers, "OUTBOX_HTTP_ADDR": "off",
	})

	if err := pg.Psql("outbox", "-q", "-v", "ON_ERROR_STOP=1", "-f", "write_event.sql"); err != nil {
		t.Fatalf("psql -f write_event.sql: %v", err)
	}
	conn := pg.Conn(t, "outbox")
	var sqlID string
	if err := conn.QueryRow(t.Context(), "SELECT id::text FROM outbox WHERE aggregateid = 'o-1001'").Scan(&sqlID); err != nil {
		t.Fatalf("the SQL recipe's event: %v", err)
	}
	cmd := exec.Command(python, "write_event.py", "o-1002", "grace", "1299")
	cmd.Env = append(os.Environ(), "OUTBOX_PG_DSN="+pg.DSN("outbox"))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("python write_event.py: %v\n%s", err, stderr)
	}
	pyID := strings.TrimSpace(string(out))

	want := map[string]struct {
		key     string
		payload map[string]any
	}{
		sqlID: {"o-1001", map[string]any{"orderId": "o-1001", "customer": "ada", "totalCents": 2599.0}},
		pyID:  {"o-1002", map[string]any{"orderId": "o-1002", "customer": "grace", "totalCents": 1299.0}},
	}
	c.WaitFor(t, []testenv.Event{{ID: sqlID}, {ID: pyID}}, 60*time.Second)
	seen := map[string]*kgo.Record{}
	for _, r := range c.Records() {
		seen[testenv.Header(r, "id")] = r
	}
	for id, w := range want {
		r := seen[id]
		var payload map[string]any
		if err := json.Unmarshal(r.Value, &payload); err != nil {
			t.Errorf("event %s: value %q is not JSON: %v", id, r.Value, err)
		}
		if string(r.Key) != w.key || !reflect.DeepEqual(payload, w.payload) {
			t.Errorf("event %s: key %q, payload %v; want %q, %v", id, r.Key, payload, w.key, w.payload)
		}
	}
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("connector: exit %d:\n%s", code, p.Output())
	}
}
