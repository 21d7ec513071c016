package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func startConnector(t testing.TB, pg *testenv.Postgres, brokers string, extra ...string) *testenv.Proc {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"OUTBOX_PG_DSN":           pg.DSN("outbox"),
		"OUTBOX_KAFKA_BROKERS":    brokers,
		"OUTBOX_HTTP_ADDR":        fmt.Sprintf("127.0.0.1:%d", port),
		"OUTBOX_STATUS_INTERVAL":  "200ms",
		"OUTBOX_TOPIC_PARTITIONS": "3",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	p := testenv.StartProc(t, testenv.Binary(t, "connector"), env)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.Output(), "msg=streaming") {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("connector did not start streaming; output:\n%s", p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// waitRecords waits until the consumer holds n records of topic.
func waitRecords(t testing.TB, c *testenv.Consumer, topic string, n int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var got []*kgo.Record
		for _, r := range c.Records() {
			if r.Topic == topic {
				got = append(got, r)
			}
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s: %d records within %s, want %d", topic, len(got), timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestModesDeliverSameRecords writes the same events in every mode, singly
// and in batches, through pgx and database/sql, with an extra column placed
// as a header: the connector delivers the same key, value and headers in
// each, and the table stays empty in delete-after-insert and message modes.
func TestModesDeliverSameRecords(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	brokers := testenv.SharedKafka(t)
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox ADD COLUMN tenant text`); err != nil {
		t.Fatal(err)
	}
	p := startConnector(t, pg, brokers, "OUTBOX_ROUTE_FIELDS_ADDITIONAL_PLACEMENT", "tenant:header")
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	db, err := sql.Open("pgx", pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	type variant struct {
		name  string
		mode  outbox.Mode
		stdlb bool // database/sql
	}
	variants := []variant{
		{"table", outbox.ModeTable, false},
		{"dai", outbox.ModeDeleteAfterInsert, false},
		{"msg", outbox.ModeMessage, false},
		{"sqltable", outbox.ModeTable, true},
		{"sqldai", outbox.ModeDeleteAfterInsert, true},
		{"sqlmsg", outbox.ModeMessage, true},
	}
	const n = 120
	events := func(aggType string, from, to int) []outbox.Event {
		var evs []outbox.Event
		for i := from; i < to; i++ {
			ev := outbox.Event{AggregateType: aggType, AggregateID: fmt.Sprintf("agg-%d", i%7), Type: "Tested",
				Payload: map[string]any{"seq": i, "zeta": "last", "alpha": []int{1, 2}, "nested": map[string]any{"b": 1.5, "a": nil}}}
			// The placed column on every event: a message carries only the
			// columns set, and the router's default for a missing
			// additional field is an error (dead letter).
			ev.Columns = map[string]any{"tenant": fmt.Sprintf("t%d", i%2)}
			if i%5 == 0 {
				// Pre-serialized JSON with its own spacing and key order.
				ev.Payload = []byte(fmt.Sprintf(`{ "zeta":"last","seq" : %d , "alpha":[1,2],"nested":{"b":1.5,"a":null}}`, i))
			}
			evs = append(evs, ev)
		}
		return evs
	}
	consumerTopics := []string{}
	for _, v := range variants {
		consumerTopics = append(consumerTopics, "outbox.event."+v.name+suffix)
	}
	c := testenv.StartConsumer(t, brokers, consumerTopics...)
	// Some writes carry a trace context (the caller's span, as an HTTP
	// middleware leaves it): their records carry it as traceparent and
	// tracestate, in every mode; the others carry none.
	const writerTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tctx := traceparentCtx(t, writerTP, "congo=t61rcWkgMzE")
	traced := map[string]bool{} // seq -> written with tctx
	for _, v := range variants {
		w, err := outbox.New(outbox.Config{Mode: v.mode})
		if err != nil {
			t.Fatal(err)
		}
		aggType := v.name + suffix
		// Singly (one transaction per event), then in batches of 1..20.
		for i := 0; i < n; {
			size := 1
			if i >= n/2 {
				size = 1 + i%20
			}
			evs := events(aggType, i, min(i+size, n))
			ctx := ctx
			if i%3 == 0 {
				ctx = tctx
				for k := i; k < i+len(evs); k++ {
					traced[fmt.Sprint(k)] = true
				}
			}
			if v.stdlb {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := w.WriteSQL(ctx, tx, evs...); err != nil {
					t.Fatalf("%s: %v", v.name, err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			} else if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				_, err := w.Write(ctx, tx, evs...)
				return err
			}); err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			i += len(evs)
		}
		// A rolled-back transaction leaves no event in any mode.
		tx, _ := conn.Begin(ctx)
		if _, err := w.Write(ctx, tx, outbox.Event{AggregateType: aggType, AggregateID: "rolled-back", Type: "Never", Payload: 1}); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
	}
	// A last marker per topic is not needed: the count is exact; wait a
	// little after reaching it to catch an unexpected extra record.
	byVariant := map[string]map[string]*kgo.Record{}
	for _, v := range variants {
		recs := waitRecords(t, c, "outbox.event."+v.name+suffix, n, time.Minute)
		byVariant[v.name] = map[string]*kgo.Record{}
		for _, r := range recs {
			var seq int
			// The value is jsonb text: "seq": <n> after "nested"'s object.
			i := strings.Index(string(r.Value), `"seq": `)
			if i < 0 {
				t.Fatalf("%s: value %s has no seq", v.name, r.Value)
			}
			fmt.Sscanf(string(r.Value[i+7:]), "%d", &seq)
			byVariant[v.name][fmt.Sprint(seq)] = r
		}
	}
	time.Sleep(time.Second)
	ref := byVariant["table"]
	for _, v := range variants {
		recs := waitRecords(t, c, "outbox.event."+v.name+suffix, n, time.Second)
		if len(recs) != n {
			t.Errorf("%s: %d records, want %d (the rolled-back event must not appear)", v.name, len(recs), n)
		}
		for seq, want := range ref {
			got := byVariant[v.name][seq]
			if got == nil {
				t.Errorf("%s: event seq %s missing", v.name, seq)
				continue
			}
			if string(got.Key) != string(want.Key) || string(got.Value) != string(want.Value) ||
				testenv.Header(got, "tenant") != testenv.Header(want, "tenant") {
				t.Errorf("%s seq %s: key %q value %s tenant %q; table mode: key %q value %s tenant %q", v.name, seq,
					got.Key, got.Value, testenv.Header(got, "tenant"), want.Key, want.Value, testenv.Header(want, "tenant"))
			}
			wantTP, wantTS := "", ""
			if traced[seq] {
				wantTP, wantTS = writerTP, "congo=t61rcWkgMzE"
			}
			if tp, ts := testenv.Header(got, "traceparent"), testenv.Header(got, "tracestate"); tp != wantTP || ts != wantTS {
				t.Errorf("%s seq %s: traceparent %q tracestate %q, want %q %q", v.name, seq, tp, ts, wantTP, wantTS)
			}
			if id := testenv.Header(got, "id"); len(id) != 36 || id[14] != '7' {
				t.Errorf("%s: id header %q is not a UUIDv7", v.name, id)
			}
		}
	}
	for _, v := range variants {
		var rows int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE aggregatetype = $1`, v.name+suffix).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		want := 0
		if v.mode == outbox.ModeTable {
			want = n
		}
		if rows != want {
			t.Errorf("%s: %d rows left in the outbox table, want %d", v.name, rows, want)
		}
	}
	t.Logf("%d events per variant (%d variants) delivered with identical keys, values and headers; example value: %s",
		n, len(variants), ref["3"].Value)
	p.Signal(syscall.SIGTERM)
	p.Wait(t, 30*time.Second)
}

// traceparentCtx is a ctx carrying the remote span context tp names, as
// OpenTelemetry's propagator extracts it from an incoming request.
func traceparentCtx(t testing.TB, tp, ts string) context.Context {
	t.Helper()
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp, "tracestate": ts})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatalf("traceparent %q: no valid span context", tp)
	}
	return ctx
}

// TestTraceColumnMissing: an outbox table made before the trace context
// column keeps taking writes, untraced and traced: a traced write goes in
// without its trace (the trace is not the event: an inbox handler's ctx
// carries the producer's trace even without an SDK, and a failing write
// would stop its partition), and the Writer remembers that the column is
// missing. With the column turned off nothing is looked up.
func TestTraceColumnMissing(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE TABLE legacy (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	tctx := traceparentCtx(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")
	ev := outbox.Event{AggregateType: "Order", AggregateID: "o-1", Type: "OrderPlaced", Payload: 1}
	write := func(cfg outbox.Config, ctx context.Context) error {
		w, err := outbox.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, ev, ev)
			return err
		})
	}
	count := func(table string) (rows, traced int) {
		q := fmt.Sprintf("SELECT count(*), 0 FROM %s", table)
		if table == "outbox" {
			q = "SELECT count(*), count(tracingspancontext) FROM outbox"
		}
		if err := conn.QueryRow(ctx, q).Scan(&rows, &traced); err != nil {
			t.Fatal(err)
		}
		return rows, traced
	}
	for _, mode := range []outbox.Mode{outbox.ModeTable, outbox.ModeDeleteAfterInsert} {
		if err := write(outbox.Config{Table: "legacy", Mode: mode}, ctx); err != nil {
			t.Fatalf("%v: untraced write into a table without the column: %v", mode, err)
		}
		w, err := outbox.New(outbox.Config{Table: "legacy", Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ { // the second write uses what the first found
			if err := pgx.BeginFunc(tctx, conn, func(tx pgx.Tx) error {
				_, err := w.Write(tctx, tx, ev)
				return err
			}); err != nil {
				t.Fatalf("%v: traced write %d into a table without the column: %v; want it written without the trace", mode, i, err)
			}
		}
		if err := write(outbox.Config{Table: "legacy", Mode: mode, TraceColumn: outbox.TraceColumnOff}, tctx); err != nil {
			t.Fatalf("%v: traced write with the column off: %v", mode, err)
		}
	}
	if rows, _ := count("legacy"); rows != 6 {
		t.Fatalf("legacy table: %d rows, want the table-mode run's 6 (2 untraced, 2 traced, 2 with the column off)", rows)
	}
	// sql/001_outbox.sql's table has it.
	if err := write(outbox.Config{}, tctx); err != nil {
		t.Fatal(err)
	}
	if rows, traced := count("outbox"); rows != 2 || traced != 2 {
		t.Fatalf("outbox: %d rows, %d with a trace context; want 2, 2", rows, traced)
	}
}

// TestCleanerDeletesExpiredInBatches: only rows older than the retention go,
// in batches.
func TestCleanerDeletesExpiredInBatches(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	old := time.Now().Add(-2 * time.Hour)
	var evs []outbox.Event
	for i := 0; i < 2500; i++ {
		evs = append(evs, outbox.Event{AggregateType: "Clean", AggregateID: "a", Type: "Old", Payload: i,
			Columns: map[string]any{"created_at": old}})
	}
	for i := 0; i < 100; i++ {
		evs = append(evs, outbox.Event{AggregateType: "Clean", AggregateID: "a", Type: "New", Payload: i})
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, evs...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.Cleaner{Retention: time.Hour, BatchSize: 300, Pause: time.Millisecond}.DeleteExpired(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE type = 'New'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	var total int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&total)
	if n != 2500 || left != 100 || total != 100 {
		t.Fatalf("deleted %d (want 2500), %d recent rows left of %d (want 100 of 100)", n, left, total)
	}
}

// TestPollModeTable: on a table prepared for the connector's poll mode
// (sql/variants/outbox_poll.sql), which reads the table and never the WAL,
// table mode writes, the WAL-only modes are refused with a clear error and
// write nothing, and the Cleaner keeps expired rows not yet published.
func TestPollModeTable(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	if err := pg.Psql("outbox", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll.sql"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	ev := outbox.Event{AggregateType: "Poll", AggregateID: "a", Type: "T", Payload: map[string]int{"n": 1}}
	for _, c := range []struct {
		mode outbox.Mode
		want string // in the error; "" for none
	}{
		{outbox.ModeTable, ""},
		{outbox.ModeDeleteAfterInsert, "not published yet and a poll-mode relay reads this table"},
		{outbox.ModeMessage, "prepared for the connector's poll mode"},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			w, err := outbox.New(outbox.Config{Mode: c.mode})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{1, 3} {
				evs := make([]outbox.Event, n)
				for i := range evs {
					evs[i] = ev
				}
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := w.Write(ctx, tx, evs...)
					return err
				})
				if c.want == "" && err != nil {
					t.Fatalf("%d events: %v", n, err)
				}
				if c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
					t.Fatalf("%d events: error %v; want one saying %q", n, err, c.want)
				}
			}
		})
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil || rows != 4 {
		t.Fatalf("%d rows (%v); want the 4 of table mode only", rows, err)
	}

	// The Cleaner: expired rows, half published.
	if _, err := conn.Exec(ctx, "UPDATE outbox SET created_at = now() - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "UPDATE outbox SET published_at = now() WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT 2)"); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.Cleaner{Retention: time.Hour, BatchSize: 1}.DeleteExpired(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	var unpublished int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if n != 2 || unpublished != 2 {
		t.Fatalf("the Cleaner deleted %d rows (want the 2 published), %d unpublished left (want 2)", n, unpublished)
	}
}

// TestPollModeMessageTable (issue 35, item 7c): a message has no table of its
// own, so a ModeMessage Writer is refused while the connector's default
// outbox table, public.outbox, is prepared for the poll mode, whatever its
// Config.Table names (the guard looked at Config.Table alone, and a Writer
// whose Table named another table emitted messages the poll-mode relay
// never reads); and while the table Config.Table names is prepared. Through
// pgx and database/sql, one event and several; before the variant is
// applied, the same Writers write.
func TestPollModeMessageTable(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	db, err := sql.Open("pgx", pg.DSN("outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// app.outbox: a second outbox, as the connector's OUTBOX_TABLE may name.
	if _, err := conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.outbox (LIKE public.outbox INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "Poll", AggregateID: "a", Type: "T", Payload: map[string]int{"n": 1}}
	write := func(t testing.TB, table string, viaSQL bool, n int) error {
		t.Helper()
		w, err := outbox.New(outbox.Config{Mode: outbox.ModeMessage, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = ev
		}
		if viaSQL {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			_, err = w.WriteSQL(ctx, tx, evs...)
			return err
		}
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, evs...)
			return err
		})
	}
	for _, step := range []struct {
		name  string
		setup string            // SQL run first
		want  map[string]string // Config.Table -> in the error; "" for none
	}{
		{"no poll mode", "", map[string]string{"": "", "events": "", "app.outbox": ""}},
		{"public.outbox prepared", "", map[string]string{
			"":           `outbox: "public"."outbox" is prepared for the connector's poll mode`,
			"events":     `outbox: "public"."outbox" (the connector's default OUTBOX_TABLE, checked whatever Config.Table names: a message has no table of its own) is prepared for the connector's poll mode`,
			"app.outbox": `outbox: "public"."outbox" (the connector's default OUTBOX_TABLE, checked whatever Config.Table names: a message has no table of its own) is prepared for the connector's poll mode`,
		}},
		{"app.outbox prepared alone", "ALTER TABLE public.outbox DROP COLUMN published_at CASCADE; ALTER TABLE app.outbox ADD COLUMN published_at timestamptz", map[string]string{
			"":           "",
			"events":     "",
			"app.outbox": `outbox: "app"."outbox" is prepared for the connector's poll mode`,
		}},
		{"both prepared", "ALTER TABLE public.outbox ADD COLUMN published_at timestamptz", map[string]string{
			"":           `outbox: "public"."outbox" is prepared for the connector's poll mode`,
			"events":     `outbox: "public"."outbox" (the connector's default OUTBOX_TABLE, checked whatever Config.Table names: a message has no table of its own) is prepared for the connector's poll mode`,
			"app.outbox": `outbox: "app"."outbox" is prepared for the connector's poll mode`,
		}},
	} {
		if step.name == "public.outbox prepared" {
			if err := pg.Psql("outbox", "-v", "ON_ERROR_STOP=1", "-f", testenv.RepoRoot()+"/sql/variants/outbox_poll.sql"); err != nil {
				t.Fatal(err)
			}
		}
		if step.setup != "" {
			if _, err := conn.Exec(ctx, step.setup); err != nil {
				t.Fatal(err)
			}
		}
		for _, table := range []string{"", "events", "app.outbox"} {
			for _, viaSQL := range []bool{false, true} {
				for _, n := range []int{1, 3} {
					name := fmt.Sprintf("%s/table=%q/sql=%v/%d", step.name, table, viaSQL, n)
					t.Run(name, func(t *testing.T) {
						err := write(t, table, viaSQL, n)
						want := step.want[table]
						if want == "" && err != nil {
							t.Fatalf("error %v; want none", err)
						}
						if want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
							t.Fatalf("error %v; want one saying %q", err, want)
						}
					})
				}
			}
		}
	}
}

// TestPollGuardPrivilegesAndOtherTables: the message-mode guard looks the
// tables up by name, so a writer's role without USAGE on schema public
// (REVOKE ALL ON SCHEMA public FROM PUBLIC, a hardened database) writes
// messages (to_regclass refused it with 42501 before); another service's
// table prepared for poll mode does not refuse them, and a writer whose
// Table names it is refused.
func TestPollGuardPrivilegesAndOtherTables(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	ctx := context.Background()
	conn := pg.Conn(t, "outbox")
	if _, err := conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.outbox (LIKE public.outbox INCLUDING ALL);
		CREATE ROLE writer LOGIN; GRANT USAGE ON SCHEMA app TO writer; REVOKE ALL ON SCHEMA public FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Config{Mode: outbox.ModeMessage, Table: "app.outbox"})
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "Poll", AggregateID: "a", Type: "T", Payload: map[string]int{"n": 1}}
	wconn, err := pgx.Connect(ctx, pg.DSNUser("outbox", "writer"))
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close(ctx)
	write := func() error {
		return pgx.BeginFunc(ctx, wconn, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, ev)
			return err
		})
	}
	if err := write(); err != nil {
		t.Fatalf("a message by a role without USAGE on public, nothing prepared for poll mode: %v", err)
	}
	// Another table prepared for poll mode, as a relay's OUTBOX_TABLE.
	if _, err := conn.Exec(ctx, `CREATE SCHEMA other; CREATE TABLE other.events (LIKE public.outbox INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE other.events ADD COLUMN published_at timestamptz;
		CREATE FUNCTION other.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'unpublished'; END $$;
		CREATE TRIGGER outbox_poll_refuse_delete BEFORE DELETE ON other.events FOR EACH ROW WHEN (OLD.published_at IS NULL) EXECUTE FUNCTION other.refuse()`); err != nil {
		t.Fatal(err)
	}
	if err := write(); err != nil {
		t.Fatalf("a message of app.outbox's writer while another service's other.events is prepared for poll mode: %v; want it written", err)
	}
	w, err = outbox.New(outbox.Config{Mode: outbox.ModeMessage, Table: "other.events"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `GRANT USAGE ON SCHEMA other TO writer`); err != nil {
		t.Fatal(err)
	}
	err = write()
	if err == nil || !strings.Contains(err.Error(), "other") {
		t.Fatalf("a message of a writer whose Table is other.events, prepared for poll mode: %v; want a refusal naming it", err)
	}
	t.Logf("refused: %v", err)
}
