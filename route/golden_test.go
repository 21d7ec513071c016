package route

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The golden cases under testdata/golden are Debezium's behaviour, written by
// hand from Debezium's documentation and source (each file cites where its
// expectation comes from). They are never regenerated from this router, so
// there is no -update flag: a failure here means the router differs from
// Debezium, or the case misreads Debezium and needs a new citation.

type goldenCase struct {
	Name       string    `json:"name"`
	Sources    []string  `json:"sources"`
	Note       string    `json:"note"`
	Properties string    `json:"properties"`
	Row        goldenRow `json:"row"`
	Expect     *struct {
		Topic       string       `json:"topic"`
		Key         *string      `json:"key"`
		Value       *string      `json:"value"`
		ValueBase64 *string      `json:"value_base64"`
		Headers     [][2]*string `json:"headers"`
		TimestampMS *int64       `json:"timestamp_ms"`
		Partition   int32        `json:"partition"`
	} `json:"expect"`
	Error *struct {
		Class ErrorClass `json:"class"`
	} `json:"error"`
}

// goldenRow is a case's row: columns as [name, type, text value or null],
// and what the catalog says of some (NOT NULL, default), which a real
// table of the soak test is created with (ddl) and the connector reads.
type goldenRow struct {
	Op          string                      `json:"op"`
	Table       string                      `json:"table"`
	ProcessedMS int64                       `json:"processed_ms"`
	Columns     [][3]*string                `json:"columns"`
	Info        map[string]goldenColumnInfo `json:"info,omitempty"`
}

type goldenColumnInfo struct {
	NotNull bool    `json:"not_null"`
	Default *string `json:"default"` // pg_get_expr's text, as the catalog holds it
	DDL     string  `json:"ddl"`     // the column constraint that makes it so
}

var typeOIDs = map[string]uint32{
	"bool": OIDBool, "bytea": OIDBytea, "int8": OIDInt8, "int2": OIDInt2, "int4": OIDInt4, "text": OIDText,
	"json": OIDJSON, "float4": OIDFloat4, "float8": OIDFloat8, "varchar": OIDVarchar, "date": OIDDate,
	"timestamp": OIDTimestamp, "timestamptz": OIDTimestamptz, "numeric": OIDNumeric, "uuid": OIDUUID, "jsonb": OIDJSONB,
}

// goldenType reads a column type of a golden row: a name of typeOIDs, and
// for numeric an optional (precision[, scale]).
func goldenType(s string) (oid uint32, typmod int32, ok bool) {
	name, args, hasArgs := strings.Cut(s, "(")
	oid, ok = typeOIDs[name]
	if !ok {
		return 0, 0, false
	}
	if !hasArgs {
		return oid, NoTypeMod, true
	}
	if oid != OIDNumeric || !strings.HasSuffix(args, ")") {
		return 0, 0, false
	}
	ps := strings.Split(strings.TrimSuffix(args, ")"), ",")
	var n [2]int
	for i, a := range ps {
		v, err := strconv.Atoi(strings.TrimSpace(a))
		if err != nil || i >= len(n) {
			return 0, 0, false
		}
		n[i] = v
	}
	return oid, NumericTypeMod(n[0], n[1]), true
}

var opCodes = map[string]Op{"c": OpInsert, "r": OpRead, "u": OpUpdate, "d": OpDelete}

func loadGolden(t testing.TB, path string) goldenCase {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c goldenCase
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(c.Sources) == 0 {
		t.Fatalf("%s: a golden case must cite its Debezium sources", path)
	}
	if (c.Expect == nil) == (c.Error == nil) {
		t.Fatalf("%s: want exactly one of expect and error", path)
	}
	return c
}

func (c *goldenCase) row(t testing.TB) *Row {
	t.Helper()
	row := &Row{Source: Source{Table: c.Row.Table, ProcessedTime: time.UnixMilli(c.Row.ProcessedMS), LSN: 0x16B3748, CommitLSN: 0x16B3800}}
	op, ok := opCodes[c.Row.Op]
	if !ok {
		t.Fatalf("op %q", c.Row.Op)
	}
	row.Op = op
	for _, col := range c.Row.Columns {
		oid, typmod, ok := goldenType(*col[1])
		if !ok {
			t.Fatalf("type %q", *col[1])
		}
		// A golden row is a real table's (the soak test creates it from
		// these types), so the declaration is known, as pgoutput sends it.
		cc := Column{Name: *col[0], Type: oid, TypeMod: typmod, HasTypeMod: true}
		if info, ok := c.Row.Info[*col[0]]; ok {
			cc.Info = &ColumnInfo{NotNull: info.NotNull}
			if info.Default != nil {
				cc.Info.Default, cc.Info.HasDefault = *info.Default, true
			}
		}
		if col[2] == nil {
			cc.Null = true
		} else {
			cc.Value = []byte(*col[2])
		}
		row.Columns = append(row.Columns, cc)
	}
	return row
}

func TestGolden(t *testing.T) {
	paths, err := filepath.Glob("testdata/golden/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".json"), func(t *testing.T) {
			c := loadGolden(t, path)
			cfg, err := ParseProperties(strings.NewReader(c.Properties))
			if err != nil {
				t.Fatalf("properties: %v", err)
			}
			r, err := New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			rec, err := r.Route(context.Background(), c.row(t))
			if c.Error != nil {
				if rec != nil || ClassOf(err) != c.Error.Class {
					t.Fatalf("got record %v, error %v; want error class %s", rec, err, c.Error.Class)
				}
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			checkRecord(t, c, rec)
		})
	}
}

func checkRecord(t *testing.T, c goldenCase, rec *kgo.Record) {
	t.Helper()
	e := c.Expect
	if rec.Topic != e.Topic {
		t.Errorf("topic %q, want %q", rec.Topic, e.Topic)
	}
	eqBytes(t, "key", rec.Key, e.Key)
	if e.ValueBase64 != nil {
		want, _ := base64.StdEncoding.DecodeString(*e.ValueBase64)
		if string(rec.Value) != string(want) || rec.Value == nil {
			t.Errorf("value %x, want %x", rec.Value, want)
		}
	} else {
		eqBytes(t, "value", rec.Value, e.Value)
	}
	if len(rec.Headers) != len(e.Headers) {
		t.Errorf("headers %s, want %d", fmtHeaders(rec.Headers), len(e.Headers))
	} else {
		for i, h := range e.Headers {
			if rec.Headers[i].Key != *h[0] {
				t.Errorf("header %d key %q, want %q", i, rec.Headers[i].Key, *h[0])
			}
			eqBytes(t, "header "+*h[0], rec.Headers[i].Value, h[1])
		}
	}
	switch {
	case e.TimestampMS == nil && !rec.Timestamp.IsZero():
		t.Errorf("timestamp %v, want none (the producer stamps it)", rec.Timestamp)
	case e.TimestampMS != nil && rec.Timestamp.UnixMilli() != *e.TimestampMS:
		t.Errorf("timestamp %d, want %d", rec.Timestamp.UnixMilli(), *e.TimestampMS)
	}
	if rec.Partition != e.Partition {
		t.Errorf("partition %d, want %d", rec.Partition, e.Partition)
	}
}

func eqBytes(t *testing.T, what string, got []byte, want *string) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("%s %q, want null", what, got)
	case want != nil && got == nil:
		t.Errorf("%s null, want %q", what, *want)
	case want != nil && string(got) != *want:
		t.Errorf("%s\n got %s\nwant %s", what, got, *want)
	}
}

func fmtHeaders(hs []kgo.RecordHeader) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.Key + "=" + string(h.Value) + " ")
	}
	return b.String()
}
