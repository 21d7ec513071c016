package collect

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json from the recorded rows")

func TestLSN(t *testing.T) {
	tests := []struct {
		in   string
		want LSN
		bad  bool
	}{
		{in: "0/0", want: 0},
		{in: "0/191FA68", want: 0x191FA68},
		{in: "16/B374D848", want: 0x16B374D848},
		{in: "FFFFFFFF/FFFFFFFF", want: LSN(^uint64(0))},
		{in: "191FA68", bad: true},
		{in: "x/1", bad: true},
		{in: "1/100000000", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseLSN(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParseLSN(%q) = %v, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseLSN(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if got.String() != strings.ToUpper(tt.in) {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
	if d := Diff(0x2000000, 0x191FA68); d != 0x2000000-0x191FA68 {
		t.Fatalf("Diff = %d", d)
	}
	if d := Diff(1, 2); d != -1 {
		t.Fatalf("Diff(1,2) = %d, want -1", d)
	}
}

func TestApplyUnit(t *testing.T) {
	tests := []struct {
		v    float64
		unit string
		want float64
		kind string
	}{
		{32, "MB", 32 << 20, "bytes"},
		{16777216, "B", 16777216, "bytes"},
		{1024, "8kB", 1024 * 8192, "bytes"},
		{2, "16MB", 32 << 20, "bytes"},
		{300, "s", 300, "time"},
		{5, "min", 300, "time"},
		{1500, "ms", 1.5, "time"},
		{7, "", 7, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v%s", tt.v, tt.unit), func(t *testing.T) {
			got, kind, err := applyUnit(tt.v, tt.unit)
			if err != nil || got != tt.want || kind != tt.kind {
				t.Fatalf("applyUnit(%v, %q) = %v, %q, %v; want %v, %q", tt.v, tt.unit, got, kind, err, tt.want, tt.kind)
			}
		})
	}
	if _, _, err := applyUnit(1, "parsecs"); err == nil {
		t.Fatal("unknown unit accepted")
	}
}

func TestParseSettingsUnlimited(t *testing.T) {
	s, err := parseSettings([]row{
		{"name": ptr("max_slot_wal_keep_size"), "setting": ptr("-1"), "unit": ptr("MB")},
		{"name": ptr("idle_replication_slot_timeout"), "setting": ptr("0"), "unit": ptr("s")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxSlotWALKeepSize == nil || *s.MaxSlotWALKeepSize != -1 {
		t.Fatalf("max_slot_wal_keep_size = %v, want -1 unscaled", s.MaxSlotWALKeepSize)
	}
	if s.IdleReplicationSlotTimeout == nil || *s.IdleReplicationSlotTimeout != 0 {
		t.Fatalf("idle_replication_slot_timeout = %v, want 0", s.IdleReplicationSlotTimeout)
	}
}

func ptr(s string) *string { return &s }

// TestParseSettingsFailover: the settings failover readiness needs, read as
// pg_settings shows them; synchronized_standby_slots split as PostgreSQL
// splits it (SplitIdentifierString).
func TestParseSettingsFailover(t *testing.T) {
	for _, tt := range []struct {
		list string
		want []string
	}{
		{"", nil},
		{"standby1", []string{"standby1"}},
		{"a, B ,\"c\"", []string{"a", "b", "c"}},
		{" s1 ,s2,,s3 ", []string{"s1", "s2", "s3"}},
		{`"q""x"`, []string{`q"x`}},
	} {
		s, err := parseSettings([]row{
			{"name": ptr("hot_standby_feedback"), "setting": ptr("on"), "unit": nil},
			{"name": ptr("primary_slot_name"), "setting": ptr("standby1"), "unit": nil},
			{"name": ptr("synchronized_standby_slots"), "setting": ptr(tt.list), "unit": nil},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.SynchronizedStandbySlots, tt.want) {
			t.Errorf("synchronized_standby_slots %q: %q, want %q", tt.list, s.SynchronizedStandbySlots, tt.want)
		}
		if s.HotStandbyFeedback == nil || !*s.HotStandbyFeedback || s.PrimarySlotName == nil || *s.PrimarySlotName != "standby1" {
			t.Errorf("hot_standby_feedback %v, primary_slot_name %v", s.HotStandbyFeedback, s.PrimarySlotName)
		}
	}
	s, err := parseSettings([]row{{"name": ptr("hot_standby_feedback"), "setting": ptr("off"), "unit": nil}})
	if err != nil || s.HotStandbyFeedback == nil || *s.HotStandbyFeedback {
		t.Errorf("hot_standby_feedback off: %v, %v", s.HotStandbyFeedback, err)
	}
	if _, err := parseSettings([]row{{"name": ptr("hot_standby_feedback"), "setting": ptr("maybe"), "unit": nil}}); err == nil {
		t.Error("hot_standby_feedback maybe: no error")
	}
}

// TestInvalidated reads the invalidation of slots shaped as each version's
// pg_replication_slots shows them (testdata/pg<major>.json were recorded
// from such servers).
func TestInvalidated(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name       string
		slot       Slot
		bad        bool
		wantReason string
	}{
		{"healthy", Slot{WALStatus: "reserved", RestartLSN: 0x1000000}, false, ""},
		{"13-15 lost", Slot{WALStatus: "lost"}, true, "wal_removed"},
		{"16 wal_removed", Slot{WALStatus: "lost", Conflicting: &yes}, true, "wal_removed"},
		{"16 conflict with recovery", Slot{WALStatus: "lost", RestartLSN: 0x1000000, Conflicting: &yes}, true, "rows_removed_or_wal_level_insufficient"},
		{"16 healthy", Slot{WALStatus: "reserved", RestartLSN: 0x1000000, Conflicting: &no}, false, ""},
		{"17 wal_removed", Slot{WALStatus: "lost", Conflicting: &no, InvalidationReason: "wal_removed"}, true, "wal_removed"},
		{"18 idle_timeout", Slot{WALStatus: "lost", RestartLSN: 0x1000000, Conflicting: &no, InvalidationReason: "idle_timeout"}, true, "idle_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad, reason := tt.slot.Invalidated()
			if bad != tt.bad || reason != tt.wantReason {
				t.Errorf("Invalidated() = %v, %q; want %v, %q", bad, reason, tt.bad, tt.wantReason)
			}
		})
	}
}

// viewColumns are the columns of pg_replication_slots that appeared after
// 13, by the version that added them (PostgreSQL's documentation of the
// view, release by release).
var addedSlotColumns = map[string]int{
	"two_phase":           14,
	"conflicting":         16,
	"inactive_since":      17,
	"invalidation_reason": 17,
	"failover":            17,
	"synced":              17,
	"two_phase_at":        18,
}

// TestQueriesByVersion checks that each version's query reads exactly the
// columns its version of the view has, so none fails at run time.
func TestQueriesByVersion(t *testing.T) {
	for major := 13; major <= 19; major++ {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			num := major*10000 + 1
			q := queries(num)
			for col, since := range addedSlotColumns {
				re := regexp.MustCompile(`\b` + col + `\b`)
				has := re.MatchString(q.slots)
				if want := major >= since; has != want {
					t.Errorf("PostgreSQL %d: slots query mentions %s = %v, want %v", major, col, has, want)
				}
			}
			if got, want := q.statReplicationSlots != "", major >= 14; got != want {
				t.Errorf("PostgreSQL %d: pg_stat_replication_slots queried = %v, want %v", major, got, want)
			}
			if got, want := strings.Contains(q.settings, "idle_replication_slot_timeout"), major >= 18; got != want {
				t.Errorf("PostgreSQL %d: idle_replication_slot_timeout read = %v, want %v", major, got, want)
			}
			if got, want := strings.Contains(q.settings, "synchronized_standby_slots"), major >= 17; got != want {
				t.Errorf("PostgreSQL %d: synchronized_standby_slots read = %v, want %v", major, got, want)
			}
			if !strings.Contains(q.settings, "hot_standby_feedback") || !strings.Contains(q.settings, "primary_slot_name") {
				t.Errorf("PostgreSQL %d: hot_standby_feedback or primary_slot_name not read", major)
			}
		})
	}
	if _, _, err := parseVersion([]row{{"server_version_num": ptr("120020"), "server_version": ptr("12.20")}}); err == nil {
		t.Error("PostgreSQL 12 accepted; it has no wal_status")
	}
}

// selectColumns returns the output column names of a SELECT: the alias or
// the bare column of each top-level item before FROM.
func selectColumns(sql string) []string {
	s := strings.TrimSpace(sql)
	s = strings.TrimPrefix(s, "SELECT")
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		}
		if depth == 0 && (s[i] == ' ' || s[i] == '\n') && strings.HasPrefix(s[i+1:], "FROM ") {
			items = append(items, s[start:i])
			start = -1
			break
		}
	}
	if start >= 0 {
		items = append(items, s[start:])
	}
	var cols []string
	for _, it := range items {
		it = strings.TrimSpace(it)
		if i := strings.LastIndex(it, " AS "); i >= 0 {
			it = it[i+4:]
		}
		cols = append(cols, strings.TrimSpace(it))
	}
	sort.Strings(cols)
	return cols
}

// recorded is a testdata/pgNN.json file: rows as a server of that version
// returns them to slotwatch's queries, in the text form the server sends.
type recorded struct {
	ServerVersionNum int              `json:"server_version_num"`
	Source           string           `json:"source"`
	Rows             map[string][]row `json:"rows"`
}

func viewQueries(version int) map[string]string {
	q := queries(version)
	m := map[string]string{
		"wal_position":         q.walPosition,
		"pg_replication_slots": q.slots,
		"pg_stat_replication":  q.statReplication,
		"pg_settings":          q.settings,
		"pg_ls_waldir":         q.walDir,
	}
	if q.statReplicationSlots != "" {
		m["pg_stat_replication_slots"] = q.statReplicationSlots
	}
	return m
}

// TestGolden parses the rows recorded from a real server of every version
// (TestQueriesOnRealVersions -record) through that version's queries and
// compares the snapshot with testdata/pgNN.golden.json (go test -update
// rewrites those).
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/pg[0-9][0-9].json")
	if err != nil {
		t.Fatal(err)
	}
	var majors []int
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			var rec recorded
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &rec); err != nil {
				t.Fatal(err)
			}
			majors = append(majors, Major(rec.ServerVersionNum))
			// Every recorded row has exactly the columns the version's query returns.
			vq := viewQueries(rec.ServerVersionNum)
			for view, rows := range rec.Rows {
				sql, ok := vq[view]
				if !ok {
					t.Errorf("%s: rows for %s, which version %d does not query", f, view, rec.ServerVersionNum)
					continue
				}
				want := selectColumns(sql)
				for i, r := range rows {
					var got []string
					for k := range r {
						got = append(got, k)
					}
					sort.Strings(got)
					if !slices.Equal(got, want) {
						t.Errorf("%s: %s row %d has columns %v; the query returns %v", f, view, i, got, want)
					}
				}
			}
			for view := range vq {
				if _, ok := rec.Rows[view]; !ok {
					t.Errorf("%s: no rows recorded for %s", f, view)
				}
			}
			snap, err := parseRecorded(rec.ServerVersionNum, rec.Rows)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			got, err := json.MarshalIndent(snap, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := strings.TrimSuffix(f, ".json") + ".golden.json"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if string(got) != string(want) {
				t.Errorf("%s differs from the parsed snapshot (go test -update rewrites it):\n%s", golden, got)
			}
		})
	}
	sort.Ints(majors)
	if !slices.Equal(majors, []int{13, 14, 15, 16, 17, 18}) {
		t.Errorf("recorded versions %v, want every one of 13 to 18", majors)
	}
}

func FuzzParseLSN(f *testing.F) {
	for _, s := range []string{"0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "1/", "/1", "x/y", "1/2/3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLSN(s)
		if err != nil {
			return
		}
		back, err := ParseLSN(l.String())
		if err != nil || back != l {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, uint64(l), l.String(), uint64(back), err)
		}
	})
}

// FuzzParseSlots feeds arbitrary text to the row parser: malformed values
// are errors, never panics.
func FuzzParseSlots(f *testing.F) {
	f.Add("outbox_slot", "t", "0/191FA68", "-8388608", "12", "3600.5")
	f.Add("", "x", "zz", "1e99", "-", "NaN")
	f.Fuzz(func(t *testing.T, name, b, lsn, n, age, secs string) {
		_, _ = parseSlots([]row{{
			"slot_name": &name, "active": &b, "temporary": &b, "restart_lsn": &lsn, "confirmed_flush_lsn": &lsn,
			"safe_wal_size": &n, "catalog_xmin_age": &age, "inactive_seconds": &secs, "active_pid": &n, "conflicting": &b,
		}})
		_, _ = parseSettings([]row{{"name": &name, "setting": &n, "unit": &b}})
	})
}
