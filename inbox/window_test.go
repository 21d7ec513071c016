package inbox

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// newOffline is a Consumer made by New with cfg, connected to nothing
// (neither the pool nor the Kafka client dials before first use).
func newOffline(t *testing.T, cfg Config) *Consumer {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Brokers, cfg.Group, cfg.Topics = []string{"127.0.0.1:1"}, "g", []string{"t"}
	c, err := New(pool, func(context.Context, pgx.Tx, *kgo.Record) error { return nil }, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.cl.Close)
	return c
}

// The sources of a late duplicate with the project's defaults, in hours.
const (
	outboxRowsDefault = 72 + 24 // maintain's MAINTAIN_RETENTION plus the partition's own day
	topicRetention    = 7 * 24  // Kafka's retention.ms default, for the topics the connector creates
	topicSegment      = 7 * 24  // Kafka's segment.ms default: a record leaves only with its segment
	lagMargin         = 24      // relay outage plus consumer lag
	boundDefault      = outboxRowsDefault + topicRetention + topicSegment + lagMargin
	oldRetentionHours = 72 // what the inbox kept before
	_                 = oldRetentionHours
)

// TestDefaultRetentionCoversDuplicateWindow: the retention New applies by
// default exceeds the duplicate window of the default deployment: a row the
// connector's initial snapshot republishes (up to the outbox row lifetime
// after it was written) can be read again from the topic after an offset
// loss (up to retention.ms plus segment.ms after that), and handled a lag
// later.
func TestDefaultRetentionCoversDuplicateWindow(t *testing.T) {
	c := newOffline(t, Config{})
	got := c.cfg.Retention
	if got <= outboxRowsDefault*time.Hour {
		t.Errorf("default Retention %s does not exceed the outbox row lifetime %dh (partition retention plus its day): rows the initial snapshot republishes are charged twice", got, outboxRowsDefault)
	}
	if got <= boundDefault*time.Hour {
		t.Errorf("default Retention %s does not exceed the duplicate window %dh (outbox rows %dh + topic retention.ms %dh + segment.ms %dh + lag %dh)",
			got, boundDefault, outboxRowsDefault, topicRetention, topicSegment, lagMargin)
	}
}

// TestNewWarnsUnsafeRetention: a Retention inside the default deployment's
// duplicate window is said aloud at New, naming the window and the setting;
// the default is not.
func TestNewWarnsUnsafeRetention(t *testing.T) {
	for _, c := range []struct {
		name      string
		retention time.Duration
		warn      bool
	}{
		{"72h", 72 * time.Hour, true},
		{"8 days", 8 * 24 * time.Hour, true},
		{"default", 0, false},
		{"30 days", 30 * 24 * time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			newOffline(t, Config{Retention: c.retention, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
			warned := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "duplicate window")
			if warned != c.warn {
				t.Errorf("Retention %s: warned %v, want %v; log:\n%s", c.retention, warned, c.warn, buf.String())
			}
			if c.warn && !strings.Contains(buf.String(), "Retention") {
				t.Errorf("the warning does not name the setting: %s", buf.String())
			}
		})
	}
}

// TestWindowValidate: the bound adds its sources up, Validate refuses a
// retention that does not exceed it with an error naming each source and
// the fix, and the defaults are consistent with the outbox's.
func TestWindowValidate(t *testing.T) {
	def := DefaultWindow()
	if got, want := def.Bound(), time.Duration(boundDefault)*time.Hour; got != want {
		t.Errorf("DefaultWindow().Bound() = %s, want %s", got, want)
	}
	if def.OutboxRows < 72*time.Hour+24*time.Hour {
		t.Errorf("DefaultWindow's outbox rows %s are shorter than maintain's 72h plus the partition's day", def.OutboxRows)
	}
	noRows := Window{TopicRetention: 24 * time.Hour, TopicSegment: time.Hour, Lag: 12 * time.Hour} // delete-after-insert, short topics
	for _, c := range []struct {
		name      string
		w         Window
		retention time.Duration
		ok        bool
	}{
		{"defaults", def, 0, true},
		{"72h on the defaults", def, 72 * time.Hour, false},
		{"8 days on the defaults", def, 8 * 24 * time.Hour, false},
		{"exactly the bound", def, def.Bound(), false},
		{"just above the bound", def, def.Bound() + time.Second, true},
		{"72h with no rows and 1-day topics", noRows, 72 * time.Hour, true},
		{"36h with no rows and 1-day topics", noRows, 37 * time.Hour, false},
		{"a snapshot's copy on 1-day topics", Window{OutboxRows: 96 * time.Hour, TopicRetention: 24 * time.Hour, TopicSegment: time.Hour, Lag: 12 * time.Hour}, 72 * time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.w.Validate(c.retention)
			if (err == nil) != c.ok {
				t.Fatalf("Validate(%s) with bound %s: %v; want ok %v", c.retention, c.w.Bound(), err, c.ok)
			}
			if err != nil {
				for _, want := range []string{"Retention", "duplicate window of " + c.w.Bound().String(), "outbox rows", "retention.ms", "segment.ms", "lag"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			}
		})
	}
}

// TestWindowRouterSource (review finding 7): with the outbox-router, a
// router whose group lost its offsets reads Debezium's change topic again
// from its oldest record and republishes it: the change topic's retention.ms
// plus segment.ms add to the window, between the snapshot's copy and the
// consumer's own replay of the outbox topic.
func TestWindowRouterSource(t *testing.T) {
	direct := Window{OutboxRows: 96 * time.Hour, TopicRetention: 7 * 24 * time.Hour, TopicSegment: 24 * time.Hour, Lag: 24 * time.Hour}
	routed := direct
	routed.RouterSourceRetention = 7 * 24 * time.Hour
	routed.RouterSourceSegment = 7 * 24 * time.Hour
	if got, want := routed.Bound(), direct.Bound()+14*24*time.Hour; got != want {
		t.Errorf("Bound with the router's change topic = %s, want %s (the direct bound plus its retention.ms and segment.ms)", got, want)
	}
	retention := direct.Bound() + time.Hour // enough without the router
	if err := direct.Validate(retention); err != nil {
		t.Fatalf("direct: %v", err)
	}
	err := routed.Validate(retention)
	if err == nil {
		t.Fatalf("Validate(%s) with the router's change topic (bound %s) accepted it", retention, routed.Bound())
	}
	if !strings.Contains(err.Error(), "change topic") {
		t.Errorf("the error %q does not name the router's change topic", err)
	}
	if DefaultWindow().RouterSourceRetention != 0 || DefaultWindow().RouterSourceSegment != 0 {
		t.Errorf("DefaultWindow is the connector's: no router source")
	}
}

// TestConfigWindow (review finding 7): a deployment states its own window
// in Config.Window. A Retention that exceeds it is accepted without the
// warning the defaults' window would give; one that does not is refused by
// New (the deployment said what its window is), also the default Retention
// under a window longer than it; without Config.Window the defaults' window
// is only warned about.
func TestConfigWindow(t *testing.T) {
	short := &Window{TopicRetention: 24 * time.Hour, TopicSegment: time.Hour, Lag: 12 * time.Hour} // 37h
	long := &Window{OutboxRows: 96 * time.Hour, RouterSourceRetention: 7 * 24 * time.Hour, RouterSourceSegment: 7 * 24 * time.Hour,
		TopicRetention: 7 * 24 * time.Hour, TopicSegment: 7 * 24 * time.Hour, Lag: 24 * time.Hour} // 33 days
	for _, c := range []struct {
		name      string
		window    *Window
		retention time.Duration
		refused   bool
		warned    bool
	}{
		{"72h inside a 37h window", short, 72 * time.Hour, false, false},
		{"24h under a 37h window", short, 24 * time.Hour, true, false},
		{"the default under a 33-day window", long, 0, true, false},
		{"40 days over a 33-day window", long, 40 * 24 * time.Hour, false, false},
		{"72h with no window said", nil, 72 * time.Hour, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			cfg := Config{Retention: c.retention, Window: c.window, Logger: slog.New(slog.NewTextHandler(&buf, nil)),
				Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}
			pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			cons, err := New(pool, func(context.Context, pgx.Tx, *kgo.Record) error { return nil }, cfg)
			if cons != nil {
				cons.cl.Close()
			}
			if (err != nil) != c.refused {
				t.Fatalf("New with Retention %s, window %v: %v; want refused %v", c.retention, c.window, err, c.refused)
			}
			if err != nil && (!strings.Contains(err.Error(), "Config.Window") || !strings.Contains(err.Error(), "Retention")) {
				t.Errorf("the refusal %q does not name Config.Window and Retention", err)
			}
			if warned := strings.Contains(buf.String(), "level=WARN"); warned != c.warned {
				t.Errorf("warned %v, want %v; log:\n%s", warned, c.warned, buf.String())
			}
		})
	}
}
