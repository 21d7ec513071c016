package route

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
)

// dbzGoldenSource is Debezium Server's PostgreSQL source and Kafka sink; each
// option set adds its debezium.format.* and debezium.transforms.* lines.
const dbzGoldenSource = `debezium.sink.kafka.producer.bootstrap.servers={{brokers}}
debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer
debezium.sink.kafka.producer.value.serializer={{value_serializer}}
debezium.sink.kafka.producer.max.block.ms=20000
debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
debezium.source.offset.storage.file.filename={{dir}}/data/offsets.dat
debezium.source.offset.flush.interval.ms=0
debezium.source.database.hostname=127.0.0.1
debezium.source.database.port={{port}}
debezium.source.database.user=postgres
debezium.source.database.password=postgres
debezium.source.database.dbname=outbox
debezium.source.topic.prefix=outbox
debezium.source.plugin.name=pgoutput
debezium.source.slot.name={{slot}}
debezium.source.publication.name={{slot}}_pub
debezium.source.publication.autocreate.mode=filtered
debezium.source.table.include.list={{tables}}
debezium.source.snapshot.mode=no_data
debezium.source.tombstones.on.delete=false
quarkus.http.port={{http}}
quarkus.log.level=INFO
`

// dbzGoldenSet is one Debezium Server run: the format and transform
// properties, shared by Debezium Server and the router, and the golden cases
// whose rows it captures. {{u}} in props is replaced by a per-set token so
// that the topics are new: the shared broker does not auto-create topics and
// other tests use outbox.event.Order.
type dbzGoldenSet struct {
	name  string
	props string
	cases []string
	// golden is true when the set's properties are exactly the golden
	// cases' (server runtime), so the capture is also checked against them.
	golden bool
	// noTracing turns the router's traceparent headers off.
	noTracing bool
	// contextHeaders turns the router's extended headers on and compares
	// Debezium's __debezium.context.* headers too (the run ids aside).
	contextHeaders bool
	// avro writes Avro values against the run's registry (the router
	// through its Confluent API).
	avro bool
	// confluent runs Confluent's AvroConverter, which neither Debezium
	// Server's distribution nor Maven Central has: only when
	// OUTBOX_SOAK_CONFLUENT_AVRO names a directory of its jars (see
	// docs/router.md, "Tests"), skipped otherwise.
	confluent bool
}

const (
	dbzStr  = "debezium.sink.type=kafka\ndebezium.format.key=simplestring\ndebezium.format.value=simplestring\ndebezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	dbzJSON = "debezium.sink.type=kafka\ndebezium.format.key=simplestring\ndebezium.format.value=json\ndebezium.format.value.schemas.enable=false\ndebezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	dbzAvro = "debezium.sink.type=kafka\ndebezium.sink.kafka.producer.value.serializer=org.apache.kafka.common.serialization.ByteArraySerializer\n" +
		"debezium.format.key=simplestring\ndebezium.format.value=avro\ndebezium.format.value.apicurio.registry.url={{registry_v3}}\n" +
		"debezium.format.value.apicurio.registry.auto-register=true\n" +
		"debezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	// Without an Apicurio URL, debezium.format.value=avro is Confluent's
	// AvroConverter (Debezium's ConverterBuilder).
	dbzAvroConfluent = "debezium.sink.type=kafka\ndebezium.format.key=simplestring\ndebezium.format.value=avro\ndebezium.format.value.schema.registry.url={{registry}}\n" +
		"debezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
	dbzT     = "debezium.transforms.outbox."
	dbzTopic = dbzT + "route.topic.replacement={{u}}.outbox.event.${routedByValue}\n"
)

var dbzGoldenSets = []dbzGoldenSet{
	{name: "defaults", golden: true, props: dbzStr + dbzTopic, cases: []string{"01", "02", "19", "42", "43", "50"}},
	// The Debezium Server distribution has no OpenTelemetry on its class
	// path, so it writes no traceparent; the router does by default
	// (Config.Tracing, docs/router.md), and is compared with it off.
	{name: "tracing", props: dbzStr + dbzTopic, cases: []string{"35"}, noTracing: true},
	{name: "server_33", golden: true, props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=p:partition,type:header\n", cases: []string{"33"}},
	{name: "server_34_header_no_schema", golden: true, props: dbzStr + dbzTopic + "debezium.format.header.schemas.enable=false\n", cases: []string{"34", "01", "43"}},
	{name: "header_types", props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=n:header,b:header,at:header:at,amount:header,raw:header,tiny:header\n", cases: []string{"40"}},
	// Numeric columns by declaration: numeric is a VariableScaleDecimal,
	// numeric(p,s) a Decimal with its precision (pgoutput's type modifier).
	{name: "numeric_unconstrained", golden: true, props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=" +
		"u_100:header,u_0:header,u_neg:header,u_1250:header,u_1e3:header,u_big:header,u_tiny:header,u_100_000:header,u_negsmall:header,u_null:header\n", cases: []string{"47"}},
	{name: "numeric_constrained", golden: true, props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=" +
		"c_100:header,c_0:header,c_neg:header,c_1250:header,c_1e3:header,c_max:header,c_round:header,c_null:header,p5:header,c_big:header,c_neg128:header\n", cases: []string{"48"}},
	// Not golden: the envelope's schema name has the soak's table name.
	{name: "numeric_key_envelope", props: "debezium.sink.type=kafka\ndebezium.format.key=json\ndebezium.format.value=json\n" +
		"debezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" + dbzTopic +
		dbzT + "table.field.event.key=k\n" + dbzT + "table.fields.additional.placement=amount:envelope:amount,price:envelope:price\n", cases: []string{"49"}},
	{name: "route_by_field", props: dbzJSON + dbzTopic + dbzT + "table.field.event.id=event_id\n" + dbzT + "table.field.event.key=payload_id\n" +
		dbzT + "table.field.event.type=event_type\n" + dbzT + "table.field.event.payload=payload_body\n" + dbzT + "route.by.field=my_route_field\n" +
		dbzT + "table.fields.additional.placement=some_boolean:envelope:bool\n", cases: []string{"05"}},
	{name: "placement_header_envelope", props: dbzJSON + dbzTopic + dbzT + "table.fields.additional.placement=type:header,eventType:envelope:type\n", cases: []string{"09", "10"}},
	{name: "expand_json", props: dbzJSON + dbzTopic + dbzT + "table.expand.json.payload=true\n", cases: []string{"20", "21", "23", "27"}},
	// Alone: Debezium converts a batch at a time, and this row stops it.
	{name: "expand_json_numbers", props: dbzJSON + dbzTopic + dbzT + "table.expand.json.payload=true\n", cases: []string{"26"}},
	{name: "tombstone", props: dbzJSON + dbzTopic + dbzT + "table.fields.additional.placement=is_deleted:envelope:deleted\n" + dbzT + "route.tombstone.on.empty.payload=true\n", cases: []string{"15", "17"}},
	{name: "topic_regex_replacement", props: dbzStr + dbzT + "route.topic.regex=(?<routedByValue>[a-z]+)_(.*)\n" + dbzT + "route.topic.replacement={{u}}.events.${routedByValue}.$2\n", cases: []string{"06"}},
	// Characters beyond the BMP in the key, the value and a header: equal
	// key bytes are equal partitions.
	{name: "non_bmp", golden: true, props: "debezium.sink.type=kafka\ndebezium.format.key=json\ndebezium.format.value=json\ndebezium.format.schemas.enable=false\n" +
		"debezium.transforms=outbox\ndebezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n" + dbzTopic +
		dbzT + "table.fields.additional.placement=type:header:eventType\n", cases: []string{"51"}},
	{name: "topic_replacement_suffix", props: dbzStr + dbzT + "route.topic.replacement=${routedByValue}.events.{{u}}\n", cases: []string{"08"}},
	// sql/001_outbox.sql's created_at (NOT NULL DEFAULT now()) in a
	// header: the schema is required and carries Debezium's placeholder
	// for a generated default.
	// Debezium 3's context headers, which the router adds with
	// extended.headers.enabled (ours is off by default), compared but for
	// the run id's UUID.
	{name: "context_headers", props: dbzStr + dbzTopic, cases: []string{"01"}, contextHeaders: true},
	// Avro values: Debezium Server's converter for debezium.format.value=avro
	// with an Apicurio registry is Apicurio's (Confluent's is not in its
	// distribution), writing Confluent's wire format by the content id; it
	// needs Apache Avro, which bench/debezium/install.sh adds. An expanded
	// payload differs as apicurioStructValue says.
	// Confluent's AvroConverter, which the router reproduces: byte for
	// byte, payload strings and expanded payloads alike.
	{name: "avro_confluent", avro: true, confluent: true, props: dbzAvroConfluent + dbzTopic, cases: []string{"01", "02", "42"}},
	{name: "avro_confluent_expand", avro: true, confluent: true, props: dbzAvroConfluent + dbzTopic + dbzT + "table.expand.json.payload=true\n", cases: []string{"20", "23", "27"}},
	{name: "avro_apicurio", avro: true, props: dbzAvro + dbzTopic, cases: []string{"01", "02", "42"}},
	{name: "avro_apicurio_expand", avro: true, props: dbzAvro + dbzTopic + dbzT + "table.expand.json.payload=true\n", cases: []string{"20", "23", "27"}},
	// A NULL in a column with a default: JsonConverter writes the default.
	{name: "null_column_default", golden: true, props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=channel:header,retries:header\n", cases: []string{"53"}},
	{name: "timestamptz_header_default", golden: true, props: dbzStr + dbzTopic + dbzT + "table.fields.additional.placement=created_at:header:createdAt\n", cases: []string{"52"}},
}

// TestDebeziumServerGolden (make soak) runs a real Debezium Server 3.6.1 with
// the Outbox Event Router over the rows of the golden cases, once per option
// set, and checks that the router, given the same properties (server
// runtime), produces each record byte for byte: topic, key, value and
// headers. Debezium Server's Kafka sink sets no timestamp, so the router
// must set none either.
func TestDebeziumServerGolden(t *testing.T) {
	if os.Getenv("OUTBOX_SOAK") != "1" {
		t.Skip("make soak only (OUTBOX_SOAK=1): runs Debezium Server")
	}
	dbz := testenv.InstallDebeziumServer(t)
	// A slot per set, all on one cluster.
	pg := testenv.StartPostgres(t, testenv.PGOptions{Settings: map[string]string{"max_replication_slots": strconv.Itoa(len(dbzGoldenSets) + 5), "max_wal_senders": strconv.Itoa(len(dbzGoldenSets) + 5)}})
	brokers := testenv.SharedKafka(t)
	registry := testenv.StartRegistry(t)
	u := "gold" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for i, set := range dbzGoldenSets {
		t.Run(set.name, func(t *testing.T) {
			dbz := dbz
			if set.confluent {
				dir := os.Getenv("OUTBOX_SOAK_CONFLUENT_AVRO")
				if dir == "" {
					t.Skip("OUTBOX_SOAK_CONFLUENT_AVRO names no directory of Confluent's AvroConverter jars, which Maven Central does not serve (docs/router.md, Tests)")
				}
				dbz.ClassPath = []string{filepath.Join(dir, "*")}
			}
			t.Parallel()
			runGoldenSet(t, dbz, pg, brokers, registry, u, i, set)
		})
	}
}

type capturedCase struct {
	id    string
	table string
	c     goldenCase
	row   *Row
	want  *kgo.Record // the router's record
	err   error       // the router's error
}

func runGoldenSet(t *testing.T, dbz testenv.DebeziumServer, pg *testenv.Postgres, brokers, registry, u string, i int, set dbzGoldenSet) {
	ctx := context.Background()
	tok := fmt.Sprintf("%s-%d", u, i) // the set's own topics
	// One file for both, written for Debezium Server: Quarkus would expand
	// ${routedByValue} as a configuration expression (to nothing); $${ is
	// its escape for a literal ${, and the router reads it so too.
	// The registry: its Confluent API for the router, its own (v3) for
	// Apicurio's converter, which Debezium Server ships.
	native := strings.Replace(registry, "/apis/ccompat/v7", "/apis/registry/v3", 1)
	props := strings.NewReplacer("{{u}}", tok, "{{registry_v3}}", native, "{{registry}}", registry).Replace(set.props)
	props = strings.ReplaceAll(props, "${", "$${")
	cfg, err := ParseProperties(strings.NewReader(props))
	if err != nil {
		t.Fatalf("properties: %v", err)
	}
	if cfg.Runtime != RuntimeServer {
		t.Fatalf("runtime %q, want server", cfg.Runtime)
	}
	if set.noTracing {
		cfg.Tracing = false
	}
	if set.contextHeaders {
		cfg.ExtendedHeaders = true
	}
	if set.avro {
		cfg.ValueFormat, cfg.RegistryURLs = FormatAvro, []string{registry}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn := pg.Conn(t, "outbox")
	slot := fmt.Sprintf("gold_%d", i)

	// Each case gets a table with its columns; the router's row is read back
	// as text, which is what pgoutput sends.
	var cases []*capturedCase
	var tables, topics []string
	for _, id := range set.cases {
		paths, _ := filepath.Glob(filepath.Join("testdata", "golden", id+"_*.json"))
		if len(paths) != 1 {
			t.Fatalf("case %s: %v", id, paths)
		}
		cc := &capturedCase{id: id, c: loadGolden(t, paths[0]), table: fmt.Sprintf("%s_c%s", slot, id)}
		var defs []string
		for _, col := range cc.c.Row.Columns {
			def := pgx.Identifier{*col[0]}.Sanitize() + " " + *col[1]
			// Without what the catalog says (the case's info, which the
			// connector reads), the router takes RequiredColumns as NOT
			// NULL; Debezium reads it from the catalog.
			if info, ok := cc.c.Row.Info[*col[0]]; ok {
				def += " " + info.DDL
			} else if col[2] != nil && slices.Contains(cfg.RequiredColumns, *col[0]) {
				def += " NOT NULL"
			}
			defs = append(defs, def)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE "+cc.table+" ("+strings.Join(defs, ", ")+")"); err != nil {
			t.Fatal(err)
		}
		// The case's info is what the catalog holds, as the connector
		// reads it (pg_get_expr's text, not the DDL's).
		for name, info := range cc.c.Row.Info {
			var notNull bool
			var def *string
			if err := conn.QueryRow(ctx, `SELECT a.attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a
				LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
				WHERE a.attrelid = $1::regclass AND a.attname = $2`, cc.table, name).Scan(&notNull, &def); err != nil {
				t.Fatalf("case %s: column %s: %v", id, name, err)
			}
			if notNull != info.NotNull || (def == nil) != (info.Default == nil) || def != nil && *def != *info.Default {
				t.Fatalf("case %s: column %s: the catalog says NOT NULL %v, default %v; the case says %v, %v", id, name, notNull, deref(def), info.NotNull, deref(info.Default))
			}
		}
		tables = append(tables, "public."+cc.table)
		cases = append(cases, cc)
	}

	serializer := "org.apache.kafka.common.serialization.StringSerializer"
	if set.avro {
		serializer = "org.apache.kafka.common.serialization.ByteArraySerializer"
	}
	run := dbz.Start(t, strings.ReplaceAll(dbzGoldenSource, "{{value_serializer}}", serializer)+props,
		"{{brokers}}", brokers, "{{port}}", strconv.Itoa(pg.Port), "{{slot}}", slot, "{{tables}}", strings.Join(tables, ","))
	logPath, exited := run.LogPath, run.Exited
	logTail := func() string {
		// Debezium Server logs JSON lines; its errors say why it stopped.
		b, _ := os.ReadFile(logPath)
		var errs []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) && !strings.Contains(l, "Primary keys are not defined") {
				errs = append(errs, l[:min(len(l), 3000)])
			}
		}
		if len(errs) > 0 {
			return strings.Join(errs, "\n")
		}
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		return string(b)
	}
	// stopped reports whether Debezium Server gave up on a record. It reads
	// the whole log: logTail keeps only ERROR and WARN lines when there are
	// any, and a WARN (a slow broker on a loaded machine) would hide this
	// line.
	stopped := func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "Connector completed: success = 'false'")
	}
	start := time.Now()
	for {
		var n int
		_ = conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot).Scan(&n)
		// The slot is active while Debezium creates it too; with
		// snapshot.mode=no_data it streams from the WAL position it reads
		// after that, so rows inserted before it logs that it streams
		// may be behind it (seen with four servers at once: no record).
		if b, _ := os.ReadFile(logPath); n == 1 && strings.Contains(string(b), `"message":"Processing messages"`) {
			break
		}
		select {
		case <-exited:
			t.Fatalf("Debezium Server exited:\n%s", logTail())
		default:
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("Debezium Server did not start streaming within 3 minutes:\n%s", logTail())
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("Debezium Server streaming after %s", time.Since(start).Round(time.Second))

	// Insert the rows, read them back as pgoutput's text, and route them.
	for _, cc := range cases {
		var names, lits []string
		for _, col := range cc.c.Row.Columns {
			names = append(names, pgx.Identifier{*col[0]}.Sanitize())
			if col[2] == nil {
				lits = append(lits, "NULL")
			} else {
				lits = append(lits, "'"+strings.ReplaceAll(*col[2], "'", "''")+"'::"+*col[1])
			}
		}
		if _, err := conn.Exec(ctx, "INSERT INTO "+cc.table+" ("+strings.Join(names, ", ")+") VALUES ("+strings.Join(lits, ", ")+")"); err != nil {
			t.Fatalf("case %s: insert: %v", cc.id, err)
		}
		texts := make([]*string, len(names))
		dst := make([]any, len(names))
		var sel []string
		for k, n := range names {
			sel = append(sel, n+"::text")
			dst[k] = &texts[k]
		}
		if err := conn.QueryRow(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+cc.table).Scan(dst...); err != nil {
			t.Fatalf("case %s: read back: %v", cc.id, err)
		}
		for k := range cc.c.Row.Columns {
			cc.c.Row.Columns[k][2] = texts[k]
		}
		cc.c.Row.Table = "public." + cc.table
		cc.row = cc.c.row(t)
		cc.want, cc.err = r.Route(ctx, cc.row)
		if cc.want != nil {
			for k, h := range cc.want.Headers {
				if h.Key == runIDHeader {
					cc.want.Headers[k].Value = runIDPattern.ReplaceAll(h.Value, []byte("<run id>"))
				}
			}
		}
		switch {
		case cc.err == nil:
		case cc.c.Expect != nil:
			// The router refuses the row; see what Debezium does with it
			// on the topic the golden file names.
			cc.want = &kgo.Record{Topic: tok + "." + cc.c.Expect.Topic}
		default:
			t.Fatalf("case %s: router: %v", cc.id, cc.err)
		}
		topics = append(topics, cc.want.Topic)
	}

	// The topics must exist before Debezium's producer sends; it then waits
	// up to max.block.ms for their metadata, so creating them after the
	// inserts is still in time.
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	uniq := map[string]bool{}
	var create []string
	for _, tp := range topics {
		if !uniq[tp] {
			uniq[tp] = true
			create = append(create, tp)
		}
	}
	if _, err := kadm.NewClient(adm).CreateTopics(ctx, 1, 1, nil, create...); err != nil {
		t.Fatal(err)
	}
	adm.Close()
	c := testenv.StartConsumer(t, brokers, create...)
	deadline := time.Now().Add(90 * time.Second)
	for c.Count() < len(cases) && time.Now().Before(deadline) && !stopped() {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // anything extra Debezium sends
	got := c.Records()
	refused := 0
	for _, cc := range cases {
		if cc.err != nil {
			refused++
		}
	}
	if len(got) != len(cases)-refused {
		t.Errorf("Debezium Server published %d records on the router's topics, want %d (topics %v)\n%s", len(got), len(cases)-refused, create, logTail())
	}
	// One partition per topic and one insert at a time: a topic's records
	// are in the order of its cases' inserts.
	byTopic := map[string][]*kgo.Record{}
	for _, g := range got {
		// Debezium 3's context headers (connector name, task, run id) are
		// not the Outbox Event Router's; the router writes none. They are
		// logged and left out of the comparison.
		var hs []kgo.RecordHeader
		var ctxHeaders []string
		for _, h := range g.Headers {
			if set.contextHeaders && h.Key == runIDHeader {
				h.Value = runIDPattern.ReplaceAll(h.Value, []byte("<run id>"))
			}
			if strings.HasPrefix(h.Key, "__debezium.context.") && !set.contextHeaders {
				ctxHeaders = append(ctxHeaders, h.Key+"="+string(h.Value))
				continue
			}
			hs = append(hs, h)
		}
		if len(ctxHeaders) > 0 {
			t.Logf("Debezium Server context headers on %s (not compared): %s", g.Topic, strings.Join(ctxHeaders, " "))
		}
		g.Headers = hs
		byTopic[g.Topic] = append(byTopic[g.Topic], g)
	}
	for _, cc := range cases {
		var rec *kgo.Record
		if q := byTopic[cc.want.Topic]; len(q) > 0 {
			rec, byTopic[cc.want.Topic] = q[0], q[1:]
		}
		t.Run(cc.id, func(t *testing.T) {
			if rec == nil && cc.err != nil && stopped() {
				t.Logf("both refuse the row: the router with %v, Debezium Server stops", cc.err)
				return
			}
			if rec == nil {
				t.Fatalf("no record from Debezium Server on %q (router error: %v)", cc.want.Topic, cc.err)
			}
			if cc.err != nil {
				t.Fatalf("router error %v; Debezium Server published topic %q key %s value %s headers %s",
					cc.err, rec.Topic, quoteNil(rec.Key), quoteNil(rec.Value), fmtHeaders(rec.Headers))
			}
			diffs := compareRecords(rec, cc.want)
			if set.avro && !set.confluent && len(diffs) == 1 && strings.HasPrefix(diffs[0], "value") && apicurioStructValue(t, registry, rec.Value, cc.want.Value) {
				// The one difference Apicurio's converter makes: see
				// apicurioStructValue.
				t.Logf("router matches Debezium Server (Apicurio's converter) but for the top-level union Confluent's AvroConverter writes for an optional struct: ours %q, Debezium Server's %q", cc.want.Value, rec.Value)
				return
			}
			for _, d := range diffs {
				t.Errorf("router vs Debezium Server: %s", d)
			}
			if len(diffs) == 0 {
				t.Logf("router matches Debezium Server byte for byte: topic %q key %q value %q headers %s", rec.Topic, rec.Key, rec.Value, fmtHeaders(rec.Headers))
			}
			// The case's own golden file, when it is for exactly these
			// properties (less the topic token).
			if set.golden && cc.c.Expect != nil && cc.c.Properties == strings.ReplaceAll(set.props, dbzTopic, "") {
				e := cc.c.Expect
				ge := &kgo.Record{Topic: tok + "." + e.Topic, Partition: -1}
				if e.Key != nil {
					ge.Key = []byte(*e.Key)
				}
				if e.Value != nil {
					ge.Value = []byte(*e.Value)
				}
				for _, h := range e.Headers {
					var v []byte
					if h[1] != nil {
						v = []byte(*h[1])
					}
					ge.Headers = append(ge.Headers, kgo.RecordHeader{Key: *h[0], Value: v})
				}
				for _, d := range compareRecords(rec, ge) {
					t.Errorf("golden file vs Debezium Server: %s", d)
				}
			}
		})
	}
}

// runIDHeader is Debezium's context header with a UUID per run, which no
// two runs share: compared with the UUID replaced.
const runIDHeader = "__debezium.context.runId"

var runIDPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// apicurioStructValue reports whether Debezium Server's Avro value differs
// from ours only as Apicurio's converter, which Debezium Server ships, differs
// from Confluent's AvroConverter, which the router reproduces: for an
// optional struct (an expanded payload), Confluent's registers the optional
// union ["null", record] that AvroData.fromConnectSchema derives and writes
// the union's branch index first; Apicurio's registers the record the datum
// carries, and writes no index. So its schema must be our union's record
// branch, and its datum ours without the leading index 1 (zigzag 0x02).
func apicurioStructValue(t *testing.T, registry string, dbz, ours []byte) bool {
	if len(dbz) < 5 || len(ours) < 6 || ours[5] != 0x02 || string(dbz[5:]) != string(ours[6:]) {
		return false
	}
	cl, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err1 := cl.SchemaByID(context.Background(), int(binary.BigEndian.Uint32(dbz[1:5])))
	mine, err2 := cl.SchemaByID(context.Background(), int(binary.BigEndian.Uint32(ours[1:5])))
	if err1 != nil || err2 != nil {
		t.Fatalf("schemas by id: %v, %v", err1, err2)
	}
	return `["null",`+theirs.Schema+`]` == mine.Schema
}

// compareRecords lists how Debezium Server's record differs from ours.
func compareRecords(dbz, ours *kgo.Record) []string {
	var d []string
	if dbz.Topic != ours.Topic {
		d = append(d, fmt.Sprintf("topic %q, ours %q", dbz.Topic, ours.Topic))
	}
	if (dbz.Key == nil) != (ours.Key == nil) || string(dbz.Key) != string(ours.Key) {
		d = append(d, fmt.Sprintf("key %s, ours %s", quoteNil(dbz.Key), quoteNil(ours.Key)))
	}
	if (dbz.Value == nil) != (ours.Value == nil) || string(dbz.Value) != string(ours.Value) {
		d = append(d, fmt.Sprintf("value\n  dbz  %s\n  ours %s", quoteNil(dbz.Value), quoteNil(ours.Value)))
	}
	if len(dbz.Headers) != len(ours.Headers) {
		d = append(d, fmt.Sprintf("headers\n  dbz  %s\n  ours %s", fmtHeaders(dbz.Headers), fmtHeaders(ours.Headers)))
	} else {
		for k, h := range dbz.Headers {
			o := ours.Headers[k]
			if h.Key != o.Key || string(h.Value) != string(o.Value) || (h.Value == nil) != (o.Value == nil) {
				d = append(d, fmt.Sprintf("header %d\n  dbz  %q=%s\n  ours %q=%s", k, h.Key, quoteNil(h.Value), o.Key, quoteNil(o.Value)))
			}
		}
	}
	if !ours.Timestamp.IsZero() {
		d = append(d, fmt.Sprintf("ours sets timestamp %v; Debezium Server's sink sets none", ours.Timestamp))
	}
	return d
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

func quoteNil(b []byte) string {
	if b == nil {
		return "null"
	}
	return strconv.Quote(string(b))
}
