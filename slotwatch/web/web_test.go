package web

import (
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/collect"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
	"github.com/pgoutbox/pgoutbox/slotwatch/web/webtest"
)

func i64(v int64) *int64 { return &v }

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func spark(vals ...float64) []watch.Point {
	var out []watch.Point
	for i, v := range vals {
		out = append(out, watch.Point{Time: now.Add(time.Duration(i-len(vals)) * 10 * time.Second), Value: v})
	}
	return out
}

func fixture() ([]watch.Report, []alert.Status) {
	reports := []watch.Report{
		{
			Server: "primary", Database: `odd"<db>&`, Up: true, Collected: true, VersionNum: 150010,
			Settings: collect.Settings{MaxSlotWALKeepSize: i64(64 << 30)},
			WALRate:  1 << 20, WALRateOK: true,
			Slots: []watch.SlotReport{
				{
					Slot:     collect.Slot{Name: "outbox_slot", Type: "logical", Plugin: "pgoutput", Database: "app", Active: true, WALStatus: "reserved", SafeWALSize: i64(60 << 30)},
					LagBytes: 3 << 29, LagBytesOK: true, LagSeconds: 420, LagSecondsOK: true, RetainedBytes: 2 << 30, RetainedOK: true,
					TimeToInvalidation: 5 * 3600, TimeToInvalidationOK: true,
					Spark: spark(1, 5, 10, 200, 1<<29, 3<<29),
				},
				{
					Slot:     collect.Slot{Name: "idle", Type: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "reserved", SafeWALSize: i64(60 << 30)},
					LagBytes: 100, LagBytesOK: true, InactiveSeconds: 900, RetainedBytes: 100, RetainedOK: true,
					TimeToInvalidation: math.Inf(1), TimeToInvalidationOK: true, Spark: spark(100, 100),
				},
				{
					Slot:     collect.Slot{Name: "doomed", Type: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "unreserved", SafeWALSize: i64(-1)},
					LagBytes: 70 << 30, LagBytesOK: true, TimeToInvalidationOK: true, Spark: spark(1, 2, 3),
				},
				{
					Slot:     collect.Slot{Name: "gone", Type: "logical", Plugin: "pgoutput", Database: "app", WALStatus: "lost"},
					LagBytes: 80 << 30, LagBytesOK: true, TimeToInvalidationOK: true,
				},
				{
					Slot: collect.Slot{Name: "standby_1", Type: "physical", Active: true, WALStatus: "reserved"},
				},
			},
		},
		{Server: "replica", Database: "app", Up: false, Collected: true, Err: "connect: dial tcp 10.0.0.2:5432: connection refused", DownSince: now.Add(-time.Minute)},
		{Server: "empty", Database: "app", Up: true, Collected: true},
	}
	alerts := []alert.Status{
		{Name: "SlotLagHigh", State: "firing", Severity: "warning", Labels: map[string]string{"server": "primary", "slot": "outbox_slot"}, Annotations: map[string]string{"summary": "Replication slot outbox_slot is 1.5 GiB behind"}},
		{Name: "SlotInvalidated", State: "firing", Severity: "critical", Labels: map[string]string{"server": "primary", "slot": "gone"}, Annotations: map[string]string{"summary": "Replication slot gone is invalidated (wal_removed)"}},
		{Name: "DatabaseUnreachable", State: "pending", Severity: "critical", Labels: map[string]string{"server": "replica"}},
	}
	return reports, alerts
}

// TestStatusPage renders the page and reads it back as a person would:
// one row per slot, its state, figures and sparkline, readable and
// self-contained.
func TestStatusPage(t *testing.T) {
	reports, alerts := fixture()
	var b strings.Builder
	if err := RenderStatus(&b, reports, alerts, 10*time.Second, now); err != nil {
		t.Fatal(err)
	}
	p, err := webtest.Parse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if p.External != 0 {
		t.Errorf("page loads %d external assets", p.External)
	}
	if !strings.Contains(p.Title, "2 firing") {
		t.Errorf("title %q", p.Title)
	}
	for _, want := range []string{"3 servers", "(1 unreachable)", "5 slots", "2 alerts firing, 1 pending"} {
		if !strings.Contains(p.Summary, want) {
			t.Errorf("summary %q lacks %q", p.Summary, want)
		}
	}
	if len(p.Firing) != 2 || !strings.Contains(p.Firing[0], "SlotLagHigh") {
		t.Errorf("firing list %q", p.Firing)
	}
	tests := []struct {
		key, level, state string
		cells             map[string]string
		spark             int
	}{
		{"outbox_slot", "warn", "active", map[string]string{"Lag": "1.5 GiB", "Lag time": "7m0s", "Retained WAL": "2 GiB", "Time to invalidation": "5h0m", "Alerts": "SlotLagHigh", "Type": "logical · pgoutput"}, 6},
		{"idle", "warn", "inactive 15m0s", map[string]string{"Time to invalidation": "∞"}, 2},
		{"doomed", "crit", "inactive 0s", map[string]string{"WAL status": "unreserved", "Time to invalidation": "0s"}, 3},
		{"gone", "crit", "invalidated (wal_removed)", map[string]string{"WAL status": "lost", "Alerts": "SlotInvalidated"}, 0},
		{"standby_1", "ok", "active", map[string]string{"Lag": "–", "Type": "physical"}, 0},
		{"server/replica", "down", "", map[string]string{"Alerts": "DatabaseUnreachable (pending)"}, 0},
		{"server/empty", "ok", "", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			r, ok := p.Rows[tt.key]
			if !ok {
				t.Fatalf("no row; rows: %v", p.Rows)
			}
			if r.Level != tt.level {
				t.Errorf("level %q, want %q", r.Level, tt.level)
			}
			if tt.state != "" && !strings.Contains(r.Cells["State"], tt.state) {
				t.Errorf("state %q, want %q", r.Cells["State"], tt.state)
			}
			for k, v := range tt.cells {
				if !strings.Contains(r.Cells[k], v) {
					t.Errorf("%s = %q, want %q", k, r.Cells[k], v)
				}
			}
			if r.SparkPoints != tt.spark {
				t.Errorf("sparkline has %d points, want %d", r.SparkPoints, tt.spark)
			}
		})
	}
	// The doomed slot is unreserved: critical even before any alert.
	if !strings.Contains(p.Rows["server/replica"].Cells["WAL status"]+p.Rows["server/replica"].Cells["State"], "unreachable") {
		t.Errorf("down row: %+v", p.Rows["server/replica"])
	}
}

func TestHandler(t *testing.T) {
	reports, alerts := fixture()
	reg := prometheus.NewRegistry()
	h := Handler(Source{Reports: func() []watch.Report { return reports }, Alerts: func() []alert.Status { return alerts }, Interval: time.Second},
		reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(method, path string) (int, string, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	tests := []struct {
		method, path string
		code         int
		ctype        string
	}{
		{"GET", "/", 200, "text/html"},
		{"GET", "/healthz", 200, "application/json"},
		{"GET", "/slots", 200, "application/json"},
		{"GET", "/metrics", 200, "text/plain"},
		{"GET", "/nothing", 404, ""},
		{"POST", "/slots", 405, ""},
	}
	for _, tt := range tests {
		code, ctype, _ := get(tt.method, tt.path)
		if code != tt.code || !strings.HasPrefix(ctype, tt.ctype) {
			t.Errorf("%s %s: %d %q, want %d %q", tt.method, tt.path, code, ctype, tt.code, tt.ctype)
		}
	}
	_, _, body := get("GET", "/slots")
	var servers []ServerView
	if err := json.Unmarshal([]byte(body), &servers); err != nil {
		t.Fatalf("/slots: %v\n%s", err, body)
	}
	if len(servers) != 3 || servers[1].Up || servers[1].Err == "" {
		t.Fatalf("/slots servers: %+v", servers)
	}
	var raw []map[string]any
	_ = json.Unmarshal([]byte(body), &raw)
	slots := raw[0]["slots"].([]any)
	first := slots[0].(map[string]any)
	if first["slot_name"] != "outbox_slot" || first["lag_bytes"].(float64) != 3<<29 || first["time_to_invalidation_seconds"].(float64) != 5*3600 {
		t.Errorf("first slot: %v", first)
	}
	if idle := slots[1].(map[string]any); idle["time_to_invalidation_seconds"] != nil {
		t.Errorf("infinite time to invalidation must be null in JSON, got %v", idle["time_to_invalidation_seconds"])
	}
	if len(first["alerts"].([]any)) != 1 {
		t.Errorf("alerts of the first slot: %v", first["alerts"])
	}
	_, _, hz := get("GET", "/healthz")
	if !strings.Contains(hz, `"up": false`) || !strings.Contains(hz, `"status": "ok"`) {
		t.Errorf("/healthz: %s", hz)
	}
}
