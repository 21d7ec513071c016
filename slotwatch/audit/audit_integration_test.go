package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/route"
)

// fixture is one throwaway PostgreSQL with sql/ applied and one in-process
// Kafka; each case writes its own aggregate type, so cases share both.
type fixture struct {
	pg *testenv.Postgres
	db *pgx.Conn
	// auditDB, when set, is the server the audit reads (a standby).
	auditDB *testenv.Postgres
	brokers string
	kafka   *kfake.Cluster
	// params are the audit's session settings (RuntimeParams).
	params map[string]string
	// afterSnapshot, when set, runs once the audit's snapshot is taken.
	afterSnapshot func()
}

// hookDB runs after once the first row of the audit's transaction is read:
// its snapshot's (SELECT now()).
type hookDB struct {
	*pgx.Conn
	after func()
}

func (d hookDB) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	tx, err := d.Conn.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return &hookTx{Tx: tx, after: d.after}, nil
}

type hookTx struct {
	pgx.Tx
	after func()
}

func (t *hookTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return hookRow{Row: t.Tx.QueryRow(ctx, sql, args...), tx: t}
}

type hookRow struct {
	pgx.Row
	tx *hookTx
}

func (r hookRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if r.tx.after != nil {
		after := r.tx.after
		r.tx.after = nil
		after()
	}
	return err
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pg := testenv.StartPostgres(t, testenv.PGOptions{})
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &fixture{pg: pg, db: pg.Conn(t, "outbox"), brokers: c.ListenAddrs()[0], kafka: c}
}

// event is one outbox row the case writes, and how Kafka holds it.
type event struct {
	id, agg string
	// copies on the routed topic, on the DLQ topic; in the dead-letter table.
	routed, dlq int
	table       bool
	// age is how long before now the row was created (default two
	// minutes: inside the window the cases audit, past its grace).
	age time.Duration
	// format writes the id header with this converter instead of the
	// audit's (records of a converter used before).
	format route.Format
}

func (f *fixture) write(t *testing.T, aggType string, evs []event, o Options) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic, _ := o.Topic(aggType)
	for _, e := range evs {
		created := now.Add(-2 * time.Minute)
		if e.age != 0 {
			created = now.Add(-e.age)
		}
		hf := o.HeaderFormat
		if e.format != "" {
			hf = e.format
		}
		if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, $2, $3, 'T', '{}', $4)`,
			e.id, aggType, e.agg, created); err != nil {
			t.Fatal(err)
		}
		if e.table {
			if _, err := f.db.Exec(ctx, `INSERT INTO outbox_dead_letter (id, row_data, error, error_class) VALUES ($1, '{}', 'too large', 'too-large')`, e.id); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < e.routed; i++ {
			r := &kgo.Record{Topic: topic, Key: encode(e.agg, o.KeyFormat), Headers: []kgo.RecordHeader{{Key: "id", Value: encode(e.id, hf)}}}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < e.dlq; i++ {
			// As route.DeadLetter writes it: keyed by event id, the row's
			// columns as JSON text.
			val := fmt.Sprintf(`{"id":%q,"aggregatetype":%q,"aggregateid":%q}`, e.id, aggType, e.agg)
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: o.DLQTopic, Key: []byte(e.id), Value: []byte(val)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// encode writes s as the router's converter f does.
func encode(s string, f route.Format) []byte {
	b, _ := json.Marshal(s)
	switch f {
	case route.FormatJSON:
		return b
	case route.FormatJSONSchema:
		return []byte(`{"schema":{"type":"string","optional":false},"payload":` + string(b) + `}`)
	}
	return []byte(s)
}

func (f *fixture) audit(t *testing.T, aggType string, o Options) (Result, []string, []string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := f.db.Config().ConnString()
	if f.auditDB != nil {
		dsn = f.auditDB.DSN("outbox")
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range f.params {
		cfg.RuntimeParams[k] = v
	}
	pool, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close(context.Background())
	cl, err := kgo.NewClient(append(ClientOpts(), kgo.SeedBrokers(f.brokers))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var missing, dups []string
	if o.Window == 0 {
		o.Since = time.Now().Add(-10 * time.Minute)
	}
	o.Grace = time.Minute
	o.Skew = 20 * time.Minute // the records are stamped now, the rows two minutes ago
	o.Source.Table, o.Source.IDColumn, o.Source.TimeColumn = `"public"."outbox"`, "id", "created_at"
	o.Source.RouteColumn, o.Source.KeyColumn, o.Source.EventIDColumn = "aggregatetype", "aggregateid", "id"
	if o.Match == MatchKey {
		// A service's own table of one aggregate type, keyed by the
		// aggregate id: here a view of the case's rows of the outbox.
		view := pgx.Identifier{"public", "keyed_" + aggType}.Sanitize()
		if _, err := f.db.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM outbox WHERE aggregatetype = '%s'`, view, aggType)); err != nil {
			t.Fatal(err)
		}
		o.Source = Source{Table: view, IDColumn: "aggregateid", KeyColumn: "aggregateid", TimeColumn: "created_at", AggregateType: aggType}
		o.DLQTopic, o.DeadLetterTable = "", ""
	}
	o.OnMissing = func(m Missing) {
		if m.AggregateType == aggType {
			missing = append(missing, m.ID)
		}
	}
	o.OnDuplicate = func(id string, n int) { dups = append(dups, fmt.Sprintf("%s×%d", id, n)) }
	var db DB = pool
	if f.afterSnapshot != nil {
		db = hookDB{Conn: pool, after: f.afterSnapshot}
	}
	res, err := Run(ctx, db, cl, o)
	if ctx.Err() != nil {
		t.Fatalf("the audit did not return within a minute (wedged): %v", err)
	}
	slices.Sort(missing)
	return res, missing, dups, err
}

func baseOptions() Options {
	topicOf, _ := route.TopicOf(route.DefaultConfig())
	return Options{Topic: topicOf, DLQTopic: "outbox.dlq"}
}

func ids(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = uuid.Must(uuid.NewV7()).String()
	}
	return s
}

// TestAuditVerdicts: every way an event can be in Kafka counts, under every
// header converter; exactly the events that are nowhere are missing.
func TestAuditVerdicts(t *testing.T) {
	f := newFixture(t)
	for i, c := range []struct {
		name   string
		format route.Format
	}{{"string", route.FormatString}, {"json", route.FormatJSON}, {"json-schema", route.FormatJSONSchema}} {
		t.Run(c.name, func(t *testing.T) {
			agg := fmt.Sprintf("verdict%d", i)
			o := baseOptions()
			o.HeaderFormat = c.format
			o.DeadLetterTable = "public.outbox_dead_letter"
			id := ids(6)
			f.write(t, agg, []event{
				{id: id[0], agg: "a", routed: 1},
				{id: id[1], agg: "a", routed: 0}, // lost
				{id: id[2], agg: "b", routed: 2}, // duplicated
				{id: id[3], agg: "b", dlq: 1},    // dead-lettered to the topic
				{id: id[4], agg: "c", table: true},
				{id: id[5], agg: "c", routed: 0}, // lost
			}, o)
			res, missing, dups, err := f.audit(t, agg, o)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{id[1], id[5]}
			slices.Sort(want)
			if !slices.Equal(missing, want) {
				t.Errorf("missing %v, want %v", missing, want)
			}
			if !slices.Contains(dups, id[2]+"×2") {
				t.Errorf("duplicates %v, want %s×2", dups, id[2])
			}
			if res.DeadLettered < 2 {
				t.Errorf("dead-lettered %d, want the topic's and the table's (2)", res.DeadLettered)
			}
		})
	}
}

// TestAuditKeyRepeated: with -match key, an aggregate with several rows is
// delivered row for record; one record short is one missing, not zero, and
// a second row is not a false duplicate.
func TestAuditKeyRepeated(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	o.Match = MatchKey
	id := ids(6)
	f.write(t, "keyed", []event{
		{id: id[0], agg: "order-1", routed: 1}, {id: id[1], agg: "order-1", routed: 1}, // two rows, two records
		{id: id[2], agg: "order-2", routed: 1}, {id: id[3], agg: "order-2"}, // two rows, one record
		{id: id[4], agg: "order-3", routed: 2}, {id: id[5], agg: "order-4"}, // a copy; one lost
	}, o)
	res, missing, dups, err := f.audit(t, "keyed", o)
	if err != nil {
		t.Fatal(err)
	}
	// Missing reports the matched column: the key.
	if !slices.Equal(missing, []string{"order-2", "order-4"}) {
		t.Errorf("missing %v, want [order-2 order-4]", missing)
	}
	if !slices.Equal(dups, []string{"order-3×2"}) {
		t.Errorf("duplicates %v, want [order-3×2]", dups)
	}
	if res.Missing != 2 {
		t.Errorf("result counts %d missing, want 2", res.Missing)
	}
}

// TestAuditSpillFails: a sort that cannot write its spill files (a full or
// read-only disk) fails the audit; before, the Kafka read waited forever
// on a sort that no longer read, and the audit hung with nothing reported.
func TestAuditSpillFails(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	// More ids than the channel to the sort buffers (1024), so that the
	// read blocks on a sort that stopped reading.
	var evs []event
	for _, id := range ids(3000) {
		evs = append(evs, event{id: id, agg: "x", routed: 1})
	}
	f.write(t, "spill", evs, o)
	// A path under a regular file: no spill file can be created there.
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o.TempDir = filepath.Join(blocker, "dir")
	o.ChunkSize = 10
	_, missing, _, err := f.audit(t, "spill", o)
	if err == nil {
		t.Fatal("the audit succeeded although its sort could not spill")
	}
	if errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "sort") {
		t.Errorf("error %q: want the sort's failure", err)
	}
	if len(missing) > 0 {
		t.Errorf("a failed audit reported %d events missing", len(missing))
	}
}

// TestAuditUnreadableFormat: a converter the audit cannot read is refused
// up front instead of reporting every event missing.
func TestAuditUnreadableFormat(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	o.HeaderFormat = route.FormatAvro
	if _, _, _, err := f.audit(t, "avro", o); err == nil || !strings.Contains(err.Error(), "header format") {
		t.Fatalf("err %v, want the header format refused", err)
	}
}

// TestAuditKeyAround: with -match key, the records of an aggregate's rows
// outside the window share its key. Before, a later event's record covered
// a lost one of the window (k1 delivered), and an aggregate with events
// before or after the window showed false duplicates (k2, k3), or counted
// the records of those events among its copies (k6).
func TestAuditKeyAround(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	o.Match = MatchKey
	id := ids(10)
	const after, before = 30 * time.Second, 11 * time.Minute // the window is [now−10m, now−1m)
	f.write(t, "around", []event{
		{id: id[0], agg: "k1"}, {id: id[1], agg: "k1", age: after, routed: 1}, // lost; a later event delivered
		{id: id[2], agg: "k2", routed: 1}, {id: id[3], agg: "k2", age: after, routed: 1}, // both delivered
		{id: id[4], agg: "k3", age: before, routed: 1}, {id: id[5], agg: "k3", routed: 1}, // both delivered
		{id: id[6], agg: "k6", routed: 2}, {id: id[7], agg: "k6", age: after, routed: 1}, // a copy, and a later event
		{id: id[9], agg: "k7", age: after}, // on its way: not judged
	}, o)
	res, missing, dups, err := f.audit(t, "around", o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(missing, []string{"k1"}) {
		t.Errorf("missing %v, want [k1]", missing)
	}
	if !slices.Equal(dups, []string{"k6×2"}) {
		t.Errorf("duplicates %v, want [k6×2]", dups)
	}
	if res.Audited != 4 || res.DeadLettered != 0 {
		t.Errorf("audited %d, dead-lettered %d; want 4 (the window's rows), 0", res.Audited, res.DeadLettered)
	}
}

// TestAuditKeyAfterSnapshot: with -match key, an event committed and
// published after the audit's snapshot has a record the audit could read
// but a row it cannot see; its key telling it from no other row, that
// record covered a lost event of its aggregate (k1 delivered) while the
// end offsets were listed after the snapshot.
func TestAuditKeyAfterSnapshot(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	o.Match = MatchKey
	f.write(t, "aftersnap", []event{{id: ids(1)[0], agg: "k1"}, {id: ids(1)[0], agg: "k2", routed: 1}}, o)
	f.afterSnapshot = func() {
		f.write(t, "aftersnap", []event{{id: ids(1)[0], agg: "k1", age: time.Millisecond, routed: 1}}, o)
	}
	res, missing, _, err := f.audit(t, "aftersnap", o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(missing, []string{"k1"}) || res.Audited != 2 {
		t.Errorf("missing %v of %d audited; want [k1] of 2", missing, res.Audited)
	}
}

// TestAuditKeyRefusesStandby: -match key against a hot standby is refused
// (its snapshot can lack a row whose record the end offsets cover, which
// would then cover a lost row of its key); -match header reads one.
func TestAuditKeyRefusesStandby(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	id := ids(2)
	f.write(t, "standby", []event{{id: id[0], agg: "k1", routed: 1}, {id: id[1], agg: "k2"}}, o)
	o.Match = MatchKey
	if _, missing, _, err := f.audit(t, "standby", o); err != nil || !slices.Equal(missing, []string{"k2"}) {
		t.Fatalf("on the primary: missing %v, %v; want [k2]", missing, err)
	}
	sb := f.pg.StartStandby(t, nil)
	sc := sb.Conn(t, "outbox")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := sc.QueryRow(context.Background(), `SELECT count(*) FROM public.keyed_standby`).Scan(&n); err == nil && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby did not replay the case's rows in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.auditDB = sb
	_, _, _, err := f.audit(t, "standby", o)
	if err == nil || !strings.Contains(err.Error(), "point the DSN at the primary") {
		t.Errorf("-match key on a standby: %v; want refused", err)
	}
	o.Match = MatchHeader
	if _, missing, _, err := f.audit(t, "standby", o); err != nil || !slices.Equal(missing, id[1:]) {
		t.Errorf("-match header on a standby: missing %v, %v; want %v", missing, err, id[1:])
	}
}

// TestAuditRefusesKeyWithRoutes: -match key audits one aggregate type with
// no dead letters; anything else is refused before the audit reads.
func TestAuditRefusesKeyWithRoutes(t *testing.T) {
	one := Source{Table: "t", IDColumn: "id", TimeColumn: "created_at", AggregateType: "Order"}
	routed := one
	routed.RouteColumn, routed.AggregateType = "aggregatetype", ""
	withEvents := one
	withEvents.EventIDColumn = "id"
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"routes", Options{Source: routed}, "one aggregate type"},
		{"DLQ topic", Options{Source: one, DLQTopic: "outbox.dlq"}, "no dead letters"},
		{"dead-letter table", Options{Source: one, DeadLetterTable: "public.outbox_dead_letter"}, "no dead letters"},
		{"event ids", Options{Source: withEvents}, "no dead letters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.o.Match, c.o.Since = MatchKey, time.Now()
			if _, err := Run(context.Background(), nil, nil, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want %q", err, c.want)
			}
		})
	}
	if _, err := Run(context.Background(), nil, nil, Options{Source: one}); err == nil || !strings.Contains(err.Error(), "no window") {
		t.Errorf("no Since, no Window: err %v", err)
	}
}

// TestAuditMixedConverters: ids are read by their shape, so records written
// under an earlier OUTBOX_ROUTE_HEADER_FORMAT (a rolling change) and
// numeric JSON ids count; before, every record of the other converter was
// missing.
func TestAuditMixedConverters(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	o.HeaderFormat = route.FormatJSON
	id := ids(4)
	f.write(t, "mixed", []event{
		{id: id[0], agg: "a", routed: 1, format: route.FormatString},
		{id: id[1], agg: "a", routed: 1, format: route.FormatJSON},
		{id: id[2], agg: "a", routed: 1, format: route.FormatJSONSchema},
		{id: id[3], agg: "a"}, // lost
	}, o)
	_, missing, _, err := f.audit(t, "mixed", o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(missing, []string{id[3]}) {
		t.Errorf("missing %v, want [%s]", missing, id[3])
	}
}

// TestAuditUnreadableRecords: topics whose records carry no id the audit can
// read (no id header: another producer, or a router that sets none) fail
// the audit instead of reporting every event missing.
func TestAuditUnreadableRecords(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	// Dead letters of another event do not count as readable: before, the
	// three below made the two unreadable records a minority.
	f.write(t, "noheader", []event{{id: ids(1)[0], agg: "a"}, {id: ids(1)[0], agg: "b"}, {id: ids(1)[0], agg: "c", dlq: 3}}, o)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic, _ := o.Topic("noheader")
	// The router's records written by a converter the audit does not
	// know: the schema registry's Avro (magic byte, schema id, the
	// string), and a null. Before, the Avro one read as an id no row has,
	// and the events were reported missing: a false EventsMissing.
	for k, v := range map[string][]byte{"a": {0, 0, 0, 0, 7, 2 * 36}, "b": nil} {
		r := &kgo.Record{Topic: topic, Key: []byte(k), Value: []byte("{}"), Headers: []kgo.RecordHeader{{Key: "id", Value: v}}}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	res, missing, _, err := f.audit(t, "noheader", o)
	var ue *UnreadableError
	if !errors.As(err, &ue) || ue.Records != 2 || ue.Missing != 2 || !strings.Contains(err.Error(), "carries an id header") {
		t.Errorf("err %v (missing %v, %+v); want the 2 unreadable records named beside the 2 events that look missing", err, missing, res)
	}
}

// TestAuditUnreadableBesideLoss: a relay that is down for the whole window
// while another producer writes to the topic, one record with an id
// header the audit cannot read, then (busy) more records without an id
// header than events are missing. The events are missing whatever those
// records are: before, the audit failed (no readable record, and
// unreadable ones at least as many as the missing), so AuditFailing fired
// and EventsMissing did not; with the busy producer it failed until the
// records without an id header were left out of the count.
func TestAuditUnreadableBesideLoss(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	id := ids(3)
	f.write(t, "foreign", []event{{id: id[0], agg: "a"}, {id: id[1], agg: "b"}, {id: id[2], agg: "c"}}, o)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic, _ := o.Topic("foreign")
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte("x"), Value: []byte("{}"),
		Headers: []kgo.RecordHeader{{Key: "id"}}}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	res, missing, _, err := f.audit(t, "foreign", o)
	if err != nil {
		t.Fatalf("audit: %v; want the 3 events reported missing", err)
	}
	if !slices.Equal(missing, id) || res.Unreadable != 1 || !strings.Contains(res.Summary(), "1 with an id the audit cannot read") {
		t.Errorf("missing %v, %d unreadable (%s); want %v and the null id counted", missing, res.Unreadable, res.Summary(), id)
	}
	// A busy foreign producer: 5 records, none with an id header.
	for i := range 5 {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte{'k', byte('0' + i)}, Value: []byte("{}")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	res, missing, _, err = f.audit(t, "foreign", o)
	if err != nil {
		t.Fatalf("audit beside a busy producer: %v; want the 3 events reported missing", err)
	}
	if !slices.Equal(missing, id) || res.Unreadable != 1 || res.Foreign != 5 || !strings.Contains(res.Summary(), "5 without an id header") {
		t.Errorf("missing %v, %d unreadable, %d foreign (%s); want %v, 1 and 5", missing, res.Unreadable, res.Foreign, res.Summary(), id)
	}
}

// TestAuditUnreadableElsewhere: unreadable records are weighed against the
// missing events of their own topic and time (review): foreign records on
// one topic, or stamped long after the window, hide no loss on another
// topic or in the window. Before, the totals were compared and the audit
// failed.
func TestAuditUnreadableElsewhere(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	lost, late := ids(2), ids(1)
	f.write(t, "elsewhereA", nil, o)
	f.write(t, "elsewhereB", []event{{id: lost[0], agg: "a"}, {id: lost[1], agg: "b"}}, o)
	f.write(t, "elsewhereC", []event{{id: late[0], agg: "c"}}, o)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	a, _ := o.Topic("elsewhereA")
	c, _ := o.Topic("elsewhereC")
	null := []kgo.RecordHeader{{Key: "id"}} // an id header the audit cannot read
	recs := []*kgo.Record{
		{Topic: a, Key: []byte("x"), Value: []byte("{}"), Headers: null}, {Topic: a, Key: []byte("y"), Value: []byte("{}"), Headers: null},
		{Topic: a, Key: []byte("z"), Value: []byte("{}"), Headers: null},
		// Stamped an hour ahead: past the window and its skew.
		{Topic: c, Key: []byte("w"), Value: []byte("{}"), Headers: null, Timestamp: time.Now().Add(time.Hour)},
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// A row of A's aggregate type so that its topic is read.
	aRow := ids(1)
	f.write(t, "elsewhereA", []event{{id: aRow[0], agg: "d", dlq: 1}}, o)
	for _, agg := range []string{"elsewhereB", "elsewhereC"} {
		res, missing, _, err := f.audit(t, agg, o)
		want := lost
		if agg == "elsewhereC" {
			want = late
		}
		if err != nil || !slices.Equal(missing, want) {
			t.Errorf("%s: missing %v, %v; want %v (%+v)", agg, missing, err, want, res)
		}
	}
}

// TestAuditIdleSnapshot: the snapshot's transaction is idle while Kafka is
// read; a server's idle_in_transaction_session_timeout shorter than that
// read ended the session and failed the audit ("terminating connection due
// to idle-in-transaction timeout"), every round, on a large window.
func TestAuditIdleSnapshot(t *testing.T) {
	f := newFixture(t)
	f.params = map[string]string{"idle_in_transaction_session_timeout": "150ms"}
	// Every fetch answers 400 ms late: a slow read of a large window.
	f.kafka.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.kafka.SleepControl(func() { time.Sleep(400 * time.Millisecond) })
		return nil, nil, false
	})
	o := baseOptions()
	id := ids(3)
	f.write(t, "idle", []event{{id: id[0], agg: "a", routed: 1}, {id: id[1], agg: "b", routed: 1}, {id: id[2], agg: "c"}}, o)
	res, missing, _, err := f.audit(t, "idle", o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(missing, []string{id[2]}) || res.Audited != 3 {
		t.Errorf("missing %v of %d audited; want [%s] of 3", missing, res.Audited, id[2])
	}
}

// TestAuditResume: a window taken from the database's clock starts at
// Resume when that is earlier (a continuous audit whose rounds failed for
// longer than the window): the event lost there is found; before, the
// window was the last minute only and it was never audited.
func TestAuditResume(t *testing.T) {
	f := newFixture(t)
	o := baseOptions()
	id := ids(2)
	f.write(t, "resume", []event{{id: id[0], agg: "a", age: 5 * time.Minute}, {id: id[1], agg: "b", age: 5 * time.Minute, routed: 1}}, o)
	o.Window = 2 * time.Minute
	resume := time.Now().Add(-8 * time.Minute)
	// Resumed 8 minutes back, the stretch is caught up one Window at a
	// time (a round failing for its size would otherwise fail for ever):
	// each round starts where the last ended, none is wider than the
	// window, all but the last are Behind, and together they find the
	// lost event. Before, one round took the whole 8 minutes.
	o.Resume = resume
	var allMissing []string
	rounds := 0
	for {
		res, missing, _, err := f.audit(t, "resume", o)
		if err != nil {
			t.Fatal(err)
		}
		rounds++
		allMissing = append(allMissing, missing...)
		if !res.Since.Equal(o.Resume) || res.Until.Sub(res.Since) > o.Window || !res.Skipped.IsZero() {
			t.Fatalf("round %d: %s to %s, skipped from %s; want from %s (Resume), no wider than %s, nothing skipped with no CatchUp",
				rounds, res.Since, res.Until, res.Skipped, o.Resume, o.Window)
		}
		if !res.Behind {
			break
		}
		if rounds > 5 {
			t.Fatalf("still behind after %d rounds", rounds)
		}
		o.Resume = res.Until
	}
	if rounds != 4 || !slices.Equal(allMissing, []string{id[0]}) {
		t.Errorf("%d rounds found %v missing; want 4 (8 minutes, 2 a round) and [%s]", rounds, allMissing, id[0])
	}
	o.Resume = resume
	var res Result
	var missing []string
	var err error
	// CatchUp bounds how far back the window reaches: the lost event, 5
	// minutes back, is left to a one-shot audit of the stretch skipped.
	o.CatchUp = 4 * time.Minute
	res, missing, _, err = f.audit(t, "resume", o)
	if err != nil {
		t.Fatal(err)
	}
	if floor := time.Now().Add(-4 * time.Minute); len(missing) != 0 || !res.Skipped.Equal(resume) || res.Since.Before(floor.Add(-5*time.Second)) || res.Since.After(floor) {
		t.Errorf("since %s, skipped from %s, missing %v; want since about %s (CatchUp), skipped from %s (Resume), none missing", res.Since, res.Skipped, missing, floor, resume)
	}
	// A CatchUp shorter than the window does not shorten it.
	o.CatchUp = time.Minute
	if res, _, _, err = f.audit(t, "resume", o); err != nil || res.Since.Before(time.Now().Add(-2*time.Minute-5*time.Second)) || res.Since.After(time.Now().Add(-2*time.Minute)) {
		t.Errorf("since %s, err %v; want the last two minutes (Window)", res.Since, err)
	}
	o.CatchUp = 0
	o.Resume = time.Now() // later than now − Window: the window as usual
	if res, _, _, err = f.audit(t, "resume", o); err != nil || res.Since.Before(time.Now().Add(-3*time.Minute)) {
		t.Errorf("since %s, err %v; want the last two minutes", res.Since, err)
	}
}
