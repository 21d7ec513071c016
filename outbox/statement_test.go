package outbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

func TestStatements(t *testing.T) {
	id := uuid.MustParse("01932c07-0000-7000-8000-000000000001")
	ev := func(cols map[string]any) Event {
		return Event{ID: id, AggregateType: "Order", AggregateID: "o-1", Type: "OrderPlaced", Payload: map[string]int{"n": 1}, Columns: cols}
	}
	tests := []struct {
		name    string
		mode    Mode
		events  []Event
		want    []string // statement texts
		wantErr string
	}{
		{"table single", ModeTable, []Event{ev(nil)},
			[]string{`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`}, ""},
		{"table batch with extra columns, missing ones DEFAULT", ModeTable, []Event{ev(map[string]any{"tenant": "a"}), ev(nil)},
			[]string{`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload, "tenant") VALUES ($1, $2, $3, $4, $5, $6), ($7, $8, $9, $10, $11, DEFAULT)`}, ""},
		{"delete after insert", ModeDeleteAfterInsert, []Event{ev(nil), ev(nil)},
			[]string{`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)`,
				`DELETE FROM "public"."outbox" WHERE id = ANY($1::uuid[])`}, ""},
		{"message single", ModeMessage, []Event{ev(nil)},
			[]string{`SELECT pg_logical_emit_message(true, $1, $2::jsonb::text) WHERE ` + pollGuard(3)}, ""},
		{"missing type", ModeTable, []Event{{AggregateType: "Order", AggregateID: "o"}}, nil, "are required"},
		{"base column as extra", ModeTable, []Event{ev(map[string]any{"payload": 1})}, nil, "set by the Event's fields"},
		{"invalid raw payload", ModeTable, []Event{{AggregateType: "O", AggregateID: "o", Type: "T", Payload: json.RawMessage(`{nope`)}}, nil, "not valid JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New(Config{Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			stmts, ids, err := w.statements(context.Background(), tc.events)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != len(tc.events) {
				t.Fatalf("%d ids for %d events", len(ids), len(tc.events))
			}
			if len(stmts) != len(tc.want) {
				t.Fatalf("%d statements, want %d: %+v", len(stmts), len(tc.want), stmts)
			}
			for i := range stmts {
				if stmts[i].sql != tc.want[i] {
					t.Errorf("statement %d:\n got %s\nwant %s", i, stmts[i].sql, tc.want[i])
				}
			}
		})
	}
}

func TestMessageContent(t *testing.T) {
	w, _ := New(Config{Mode: ModeMessage})
	stmts, _, err := w.statements(context.Background(), []Event{{ID: uuid.MustParse("01932c07-0000-7000-8000-000000000001"), AggregateType: "Order",
		AggregateID: "o-1", Type: "OrderPlaced", Payload: json.RawMessage(` {"b":1,"a":2} `), Columns: map[string]any{"tenant": "t1"}}})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stmts[0].args[1].(string)), &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"id": `"01932c07-0000-7000-8000-000000000001"`, "aggregatetype": `"Order"`,
		"aggregateid": `"o-1"`, "type": `"OrderPlaced"`, "payload": `{"b":1,"a":2}`, "tenant": `"t1"`} {
		if string(m[k]) != want {
			t.Errorf("member %s = %s, want %s", k, m[k], want)
		}
	}
}

func TestNewIDsAreV7(t *testing.T) {
	w, _ := New(Config{})
	_, ids, err := w.statements(context.Background(), []Event{{AggregateType: "O", AggregateID: "o", Type: "T"}, {AggregateType: "O", AggregateID: "o", Type: "T"}})
	if err != nil {
		t.Fatal(err)
	}
	if ids[0].Version() != 7 || ids[0] == ids[1] || ids[0].String() > ids[1].String() {
		t.Fatalf("ids %v: want distinct, ordered UUIDv7", ids)
	}
}

func TestQuoteTableAndParseMode(t *testing.T) {
	for in, want := range map[string]string{"outbox": `"public"."outbox"`, "app.events": `"app"."events"`} {
		if got, err := QuoteTable(in); err != nil || got != want {
			t.Errorf("QuoteTable(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a.b.c", `x"; DROP TABLE y; --`} {
		if _, err := QuoteTable(bad); err == nil {
			t.Errorf("QuoteTable(%q): no error", bad)
		}
	}
	for _, m := range []Mode{ModeTable, ModeDeleteAfterInsert, ModeMessage} {
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if _, err := ParseMode("outbox"); err == nil {
		t.Error("ParseMode(outbox): no error")
	}
}

func TestNewConfig(t *testing.T) {
	fixed := uuid.MustParse("01932c07-0000-7000-8000-0000000000ff")
	tests := []struct {
		name      string
		cfg       Config
		wantTable string // quoted; "" when New fails
		wantErr   string
	}{
		{"zero is the defaults", Config{}, `"public"."outbox"`, ""},
		{"table without schema", Config{Table: "events"}, `"public"."events"`, ""},
		{"schema-qualified table", Config{Table: "app.events", Mode: ModeDeleteAfterInsert}, `"app"."events"`, ""},
		{"invalid table", Config{Table: "a.b.c"}, "", `outbox: table "a.b.c": want schema.name of plain identifiers`},
		{"invalid table in ModeMessage too", Config{Table: `x"y`, Mode: ModeMessage}, "", `outbox: table "x\"y": want schema.name of plain identifiers`},
		{"unknown mode", Config{Mode: ModeMessage + 1}, "", "outbox: unknown mode 3"},
		{"negative mode", Config{Mode: -1}, "", "outbox: unknown mode -1"},
		{"id function", Config{NewID: func() (uuid.UUID, error) { return fixed, nil }}, `"public"."outbox"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w.table != tc.wantTable || w.Mode() != tc.cfg.Mode || w.prefix != MessagePrefix {
				t.Fatalf("table %s, mode %v, prefix %q; want %s, %v, %q", w.table, w.Mode(), w.prefix, tc.wantTable, tc.cfg.Mode, MessagePrefix)
			}
			_, ids, err := w.statements(context.Background(), []Event{{AggregateType: "O", AggregateID: "o", Type: "T"}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.cfg.NewID != nil && ids[0] != fixed {
				t.Fatalf("id %v: want the NewID's %v", ids[0], fixed)
			}
			if tc.cfg.NewID == nil && ids[0].Version() != 7 {
				t.Fatalf("id %v: want a UUIDv7", ids[0])
			}
		})
	}
}

// traced is a ctx carrying a valid remote span context, as an HTTP
// middleware leaves it.
func traced(t testing.TB, state string) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true}))
}

// TestTraceColumn: a traced write names the trace column with the
// Properties text the router reads back; an untraced one, or one with the
// column off, never names it (a table without it keeps working).
func TestTraceColumn(t *testing.T) {
	id := uuid.MustParse("01932c07-0000-7000-8000-000000000001")
	ev := func(cols map[string]any) Event {
		return Event{ID: id, AggregateType: "Order", AggregateID: "o-1", Type: "OrderPlaced", Columns: cols}
	}
	const tp = "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"
	tests := []struct {
		name    string
		cfg     Config
		ctx     context.Context
		events  []Event
		want    string
		wantArg map[int]string // the trace column's arguments by index (nil: none)
	}{
		{"untraced", Config{}, context.Background(), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`, nil},
		{"traced", Config{}, traced(t, ""), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload, "tracingspancontext") VALUES ($1, $2, $3, $4, $5, $6)`, map[int]string{5: tp}},
		{"traced with tracestate, escaped as Properties.store does", Config{}, traced(t, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload, "tracingspancontext") VALUES ($1, $2, $3, $4, $5, $6)`,
			map[int]string{5: tp + `tracestate=congo\=t61rcWkgMzE,rojo\=00f067aa0ba902b7` + "\n"}},
		{"traced batch beside another column; an event's own value wins", Config{}, traced(t, ""),
			[]Event{ev(map[string]any{"tenant": "a"}), ev(map[string]any{"tracingspancontext": "mine"})},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload, "tenant", "tracingspancontext") VALUES ($1, $2, $3, $4, $5, $6, $7), ($8, $9, $10, $11, $12, DEFAULT, $13)`,
			map[int]string{6: tp, 12: "mine"}},
		{"column off", Config{TraceColumn: TraceColumnOff}, traced(t, ""), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`, nil},
		{"column renamed, delete-after-insert", Config{TraceColumn: "span_ctx", Mode: ModeDeleteAfterInsert}, traced(t, ""), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload, "span_ctx") VALUES ($1, $2, $3, $4, $5, $6)`, map[int]string{5: tp}},
		{"an invalid span context is no trace", Config{}, trace.ContextWithSpanContext(context.Background(), trace.SpanContext{}), []Event{ev(nil)},
			`INSERT INTO "public"."outbox" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			stmts, _, err := w.statements(tc.ctx, tc.events)
			if err != nil {
				t.Fatal(err)
			}
			if stmts[0].sql != tc.want {
				t.Fatalf("statement:\n got %s\nwant %s", stmts[0].sql, tc.want)
			}
			if stmts[0].traced != (tc.wantArg != nil) {
				t.Fatalf("traced = %v", stmts[0].traced)
			}
			for i, want := range tc.wantArg {
				if got := stmts[0].args[i]; got != want {
					t.Errorf("argument $%d = %q, want %q", i+1, got, want)
				}
			}
			if tc.cfg.Mode == ModeDeleteAfterInsert && (len(stmts) != 2 || !strings.HasPrefix(stmts[1].sql, "DELETE")) {
				t.Fatalf("delete-after-insert: %+v", stmts)
			}
		})
	}
}

// TestTraceMessage: ModeMessage carries the trace context as a member of
// the content, which route.RowFromMessage reads as a column.
func TestTraceMessage(t *testing.T) {
	w, _ := New(Config{Mode: ModeMessage})
	for _, tc := range []struct {
		ctx  context.Context
		want string // "" = no member
	}{{context.Background(), ""}, {traced(t, ""), "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"}} {
		stmts, _, err := w.statements(tc.ctx, []Event{{AggregateType: "O", AggregateID: "o", Type: "T"}})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(stmts[0].args[1].(string)), &m); err != nil {
			t.Fatal(err)
		}
		got, ok := m["tracingspancontext"]
		if tc.want == "" && ok || tc.want != "" && got != tc.want {
			t.Errorf("tracingspancontext member = %v (present %v), want %q", got, ok, tc.want)
		}
	}
}

func TestTraceColumnConfig(t *testing.T) {
	for _, bad := range []string{"payload", `a"b`, "a b"} {
		if _, err := New(Config{TraceColumn: bad}); err == nil {
			t.Errorf("TraceColumn %q: no error", bad)
		}
	}
}

// BenchmarkStatements: what a traced write adds to building the statement,
// and that an untraced one pays only the span context lookup.
func BenchmarkStatements(b *testing.B) {
	w, _ := New(Config{})
	evs := []Event{{AggregateType: "Order", AggregateID: "o-1", Type: "OrderPlaced", Payload: map[string]int{"n": 1}}}
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{{"untraced", context.Background()}, {"traced", traced(b, "congo=t61rcWkgMzE")}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := w.statements(bc.ctx, evs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
