package route

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// The Avro golden cases under testdata/avro hold what Confluent's
// AvroConverter writes for the record Debezium's EventRouter makes of a
// row: the schema it registers and the datum after the schema id. The
// expectations were produced by running Confluent's own code
// (io.confluent.connect.avro.AvroData with AvroConverter's defaults,
// compiled from confluentinc/schema-registry's sources, since Confluent's
// jars are not served here; each file names the commit) on the Kafka Connect
// record that JsonConverter reads back from this router's json-schema value
// (which the golden cases under testdata/golden hold byte-equal to
// Debezium's). They are never regenerated from this router:
// -avro-golden-inputs only writes the records Confluent's code is to be run
// on.
var avroGoldenInputs = flag.String("avro-golden-inputs", "", "write the Kafka Connect records of the Avro golden cases (JsonConverter form) into this directory, and exit")

type avroGolden struct {
	Name       string    `json:"name"`
	Note       string    `json:"note,omitempty"`
	Properties string    `json:"properties"`
	Row        goldenRow `json:"row"`
	// Confluent is what Confluent's AvroData made of the record: the Avro
	// schema AvroConverter registers, the datum it writes after byte 0 and
	// the schema id, and the record's full name (the record subject
	// strategies' subject); or the error it threw.
	Confluent struct {
		Schema   string `json:"schema"`
		DatumHex string `json:"datum_hex"`
		Record   string `json:"record"`
		Error    string `json:"error"`
	} `json:"confluent"`
	Source string `json:"source"`
}

// avroGoldenConfigs are the subject name strategies each case runs with:
// Confluent's TopicNameStrategy, RecordNameStrategy and
// TopicRecordNameStrategy name the subject after the topic, the record's full
// name, or both.
var avroGoldenConfigs = []struct {
	name, subject string
	want          func(topic, record string) string // "" when the strategy refuses the value
}{
	{"default", "${topic}-value", func(topic, _ string) string { return topic + "-value" }},
	{"record", "${record}", func(_, record string) string { return record }},
	{"topic_record", "${topic}-${record}", func(topic, record string) string {
		if record == "" {
			return ""
		}
		return topic + "-" + record
	}},
}

func loadAvroGolden(t testing.TB, path string) avroGolden {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c avroGolden
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func (c *avroGolden) row(t testing.TB) *Row {
	g := goldenCase{}
	g.Row = c.Row
	return g.row(t)
}

// TestAvroGoldenConfluent: for every case and converter configuration,
// the router registers the same subjects with the same schema text as
// Confluent's AvroConverter, and writes the same value bytes after the
// schema id (which is the registered schema's); where AvroConverter threw,
// the router refuses the row.
func TestAvroGoldenConfluent(t *testing.T) {
	paths, err := filepath.Glob("testdata/avro/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Avro golden cases: %v", err)
	}
	if *avroGoldenInputs != "" {
		writeAvroGoldenInputs(t, paths, *avroGoldenInputs)
		return
	}
	for _, path := range paths {
		c := loadAvroGolden(t, path)
		if c.Confluent.Schema == "" && c.Confluent.Error == "" {
			t.Fatalf("%s: no expectation from Confluent's AvroData", path)
		}
		for _, conf := range avroGoldenConfigs {
			t.Run(c.Name+"/"+conf.name, func(t *testing.T) {
				reg := srfake.New()
				defer reg.Close()
				cfg, err := ParseProperties(strings.NewReader(c.Properties))
				if err != nil {
					t.Fatal(err)
				}
				cfg.ValueFormat = FormatAvro
				cfg.RegistryURLs = []string{reg.URL()}
				cfg.AvroSubject = conf.subject
				r, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				rec, err := r.Route(context.Background(), c.row(t))
				want := c.Confluent
				topic := ""
				if rec != nil {
					topic = rec.Topic
				}
				subject := ""
				if want.Error == "" {
					// The topic is the router's, which the JSON goldens hold
					// equal to Debezium's.
					subject = conf.want(topic, want.Record)
				}
				if want.Error != "" || subject == "" && conf.name != "default" {
					if err == nil {
						t.Fatalf("routed; Confluent's AvroData threw %q or the strategy names no subject", want.Error)
					}
					t.Logf("refused (%v), as Confluent's converter refuses it", err)
					return
				}
				if err != nil {
					t.Fatalf("Route: %v", err)
				}
				cl, _ := sr.NewClient(sr.URLs(reg.URL()))
				subjects, err := cl.Subjects(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(subjects, []string{subject}) {
					t.Fatalf("subjects %v, Confluent's %q", subjects, subject)
				}
				ss, err := cl.SchemaByVersion(context.Background(), subject, -1)
				if err != nil {
					t.Fatal(err)
				}
				if ss.Schema.Schema != want.Schema {
					t.Errorf("schema of %s:\n  ours        %s\n  Confluent's %s", subject, ss.Schema.Schema, want.Schema)
				}
				if len(rec.Value) < 5 || rec.Value[0] != 0 || int(binary.BigEndian.Uint32(rec.Value[1:5])) != ss.ID {
					t.Fatalf("value % x: not byte 0 and the registered id %d", rec.Value[:min(5, len(rec.Value))], ss.ID)
				}
				if got := hex.EncodeToString(rec.Value[5:]); got != want.DatumHex {
					t.Errorf("datum\n  ours        %s\n  Confluent's %s", got, want.DatumHex)
				}
			})
		}
	}
}

// writeAvroGoldenInputs writes, per case, the record Confluent's converter
// is to be run on: the topic and the JsonConverter form of the router's
// value (the properties with value.converter=JsonConverter).
func writeAvroGoldenInputs(t *testing.T, paths []string, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		c := loadAvroGolden(t, path)
		cfg, err := ParseProperties(strings.NewReader(c.Properties))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ValueFormat = FormatJSONSchema
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := r.Route(context.Background(), c.row(t))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		in, err := json.MarshalIndent(map[string]any{"topic": rec.Topic, "value": json.RawMessage(rec.Value)}, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), in, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d inputs to %s", len(paths), dir)
}
