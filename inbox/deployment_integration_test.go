package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// TestFailuresThatPassAreRetried (review finding 2): errors that pass on
// retry are never a reason to dead-letter a real event. A handler that says
// so with inbox.Transient (a payment gateway answering 503), and a handler
// deployed before its migration or grant (undefined column 42703, undefined
// table 42P01, undefined function 42883, permission denied 42501, and an
// undefined table met by a deferred trigger at COMMIT), fail more than
// MaxAttempts times and are retried, logged at error level, then applied
// exactly once when the gateway answers or the migration runs. A syntax
// error in the handler's statement (42601) stays the record's: it is
// dead-lettered after MaxAttempts. The records share one partition, so each
// one waits for the one before it.
func TestFailuresThatPassAreRetried(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
		CREATE TABLE shipments (event_id text NOT NULL);
		CREATE ROLE app;
		CREATE TABLE ledger (event_id text NOT NULL);
		CREATE TABLE orders_t (event_id text NOT NULL);
		CREATE FUNCTION audit_order() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN INSERT INTO audit (event_id) VALUES (NEW.event_id); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER orders_audit AFTER INSERT ON orders_t
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_order();`); err != nil {
		t.Fatal(err)
	}
	cfg := e.quiet()
	logs := &testenv.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	retried := 2 * cfg.MaxAttempts // failures a case must survive, not dead-lettered
	var attempts attemptCounter
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id := inbox.Header(r, "id")
		n := attempts.next(id)
		var stmt string
		switch string(r.Value) {
		case "gateway":
			if n <= retried {
				return inbox.Transient(fmt.Errorf("attempt %d: payment gateway: 503 Service Unavailable", n))
			}
		case "column":
			stmt = `INSERT INTO shipments (event_id, carrier) VALUES ($1, 'dhl')`
		case "table":
			stmt = `INSERT INTO invoices (event_id) VALUES ($1)`
		case "function":
			stmt = `SELECT tax_of($1)`
		case "privilege":
			stmt = `SET LOCAL ROLE app; INSERT INTO ledger (event_id) VALUES ('x'); RESET ROLE`
		case "commit":
			stmt = `INSERT INTO orders_t (event_id) VALUES ($1)` // the trigger fails at COMMIT
		case "syntax":
			stmt = `SELEC 1`
		}
		if stmt != "" {
			var err error
			if strings.Contains(stmt, "$1") {
				_, err = tx.Exec(ctx, stmt, id)
			} else {
				_, err = tx.Exec(ctx, stmt)
			}
			if err != nil {
				return fmt.Errorf("attempt %d: %w", n, err)
			}
		}
		return effectHandler(ctx, tx, r)
	}
	cases := []struct {
		value, migration, state string
	}{
		{"gateway", "", ""}, // passes by itself after `retried` failures
		{"column", `ALTER TABLE shipments ADD COLUMN carrier text`, "42703"},
		{"table", `CREATE TABLE invoices (event_id text NOT NULL)`, "42P01"},
		{"function", `CREATE FUNCTION tax_of(text) RETURNS int LANGUAGE sql AS 'SELECT 1'`, "42883"},
		{"privilege", `GRANT INSERT ON ledger TO app`, "42501"},
		{"commit", `CREATE TABLE audit (event_id text NOT NULL)`, "42P01"},
	}
	var recs []*kgo.Record
	for _, c := range cases {
		recs = append(recs, rec("ev-"+c.value, c.value))
	}
	recs = append(recs, rec("ev-syntax", "syntax"), rec("ev-after", "ok"))
	for _, r := range recs {
		r.Key = []byte("one-partition")
	}
	e.produce(t, recs...)
	c, err := inbox.New(e.pool, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	defer stop()
	for _, cs := range cases {
		id := "ev-" + cs.value
		dead := c.Stats().DeadLettered
		deadline := time.Now().Add(30 * time.Second)
		for attempts.get(id) <= retried && c.Stats().DeadLettered == dead && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		switch {
		case c.Stats().DeadLettered != dead:
			t.Errorf("%s (%s) was dead-lettered after %d attempts (MaxAttempts %d): it passes once the deployment catches up",
				id, cmp(cs.state, "inbox.Transient"), attempts.get(id), cfg.MaxAttempts)
		case attempts.get(id) <= retried:
			t.Fatalf("%s: %d attempts in 30s; stats %+v", id, attempts.get(id), c.Stats())
		}
		if cs.migration != "" {
			if _, err := e.pool.Exec(ctx, cs.migration); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "ev-after handled", 30*time.Second, func() bool { return effectsOf(t, e, "ev-after") == 1 })
	for _, cs := range cases {
		if n := effectsOf(t, e, "ev-"+cs.value); n != 1 {
			t.Errorf("ev-%s applied %d times, want once", cs.value, n)
		}
	}
	if n := effectsOf(t, e, "ev-syntax"); n != 0 {
		t.Errorf("ev-syntax applied %d times, want 0 (dead-lettered)", n)
	}
	if n := attempts.get("ev-syntax"); n != cfg.MaxAttempts {
		t.Errorf("the syntax error ran %d times, want MaxAttempts (%d) and then a dead letter", n, cfg.MaxAttempts)
	}
	dlq := e.dlqReader(t)
	waitFor(t, "ev-syntax in the DLQ", 10*time.Second, func() bool { return byID(dlq.read())["ev-syntax"] != nil })
	if got := byID(dlq.read()); len(got) != 1 {
		ids := []string{}
		for id := range got {
			ids = append(ids, id)
		}
		t.Errorf("DLQ holds %v, want only ev-syntax", ids)
	}
	out := logs.String()
	for _, cs := range cases[1:] {
		if !hasLine(out, "level=ERROR", "retrying", "ev-"+cs.value, cs.state) {
			t.Errorf("no error-level retry line names ev-%s and %s; the deployment's fault must be said aloud", cs.value, cs.state)
		}
	}
	if !hasLine(out, "level=WARN", "retrying", "ev-gateway", "payment gateway") {
		t.Errorf("no warn-level log line names the transient handler failure")
	}
	if v := labelledValue(t, reg, "inbox_retries_total", "fault", "deployment"); v < float64(5*retried) {
		t.Errorf(`inbox_retries_total{fault="deployment"} = %v, want at least %d`, v, 5*retried)
	}
	if v := labelledValue(t, reg, "inbox_retries_total", "fault", "dependency"); v != float64(retried) {
		t.Errorf(`inbox_retries_total{fault="dependency"} = %v, want %d`, v, retried)
	}
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// hasLine reports whether one line of out contains every one of subs.
func hasLine(out string, subs ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}

// labelledValue is the value of the counter name{label=value} (0 when the
// series is absent, which fails the callers' checks).
func labelledValue(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
