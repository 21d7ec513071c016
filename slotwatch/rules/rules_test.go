package rules

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
	"github.com/pgoutbox/pgoutbox/slotwatch/metric"
	"github.com/pgoutbox/pgoutbox/slotwatch/pipeline"
)

// promtoolVersion is the Prometheus module version promtool is built from
// (v0.316.0 is Prometheus 3.16). It is never added to go.mod: the binary is
// built from the Go module proxy into a cache directory outside the repo.
const promtoolVersion = "v0.316.0"

// promtool finds or builds promtool at promtoolVersion (testenv.Promtool).
func promtool(t *testing.T) string {
	t.Helper()
	return testenv.Promtool(t, promtoolVersion)
}

func TestPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "slotwatch.rules.yml"},
		{"test", "rules", "slotwatch.rules.test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestRulesMatchSlotwatch checks that the shipped rules are the alerts
// slotwatch evaluates: same names, severities, for-durations, default
// thresholds, and only metrics slotwatch exports.
func TestRulesMatchSlotwatch(t *testing.T) {
	raw, err := os.ReadFile("slotwatch.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	own := map[string]alert.Rule{}
	for _, r := range alert.Rules() {
		own[r.Name] = r
	}
	thresholds := map[string]string{
		alert.SlotLagHigh:               fmt.Sprint(config.DefaultLagWarnBytes),
		alert.SlotLagCritical:           fmt.Sprint(config.DefaultLagCritBytes),
		alert.SlotLagSecondsHigh:        fmt.Sprint(config.DefaultLagWarnTime.Seconds()),
		alert.SlotInactive:              fmt.Sprint(config.DefaultInactiveWarnTime.Seconds()),
		alert.SlotTimeToInvalidationLow: fmt.Sprint(config.DefaultInvalidationTime.Seconds()),
		alert.SlotCatalogXminAgeHigh:    fmt.Sprint(config.DefaultXminAgeWarn),
		alert.SlotNotFailoverReady:      fmt.Sprint(config.DefaultFailoverLagBytes),
	}
	exported := append(metric.Names(), pipeline.Names()...)
	metricRE := regexp.MustCompile(`slotwatch_[a-z0-9_]+`)
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			mine, ok := own[r.Alert]
			if !ok {
				t.Errorf("rule %s: slotwatch has no such alert", r.Alert)
				continue
			}
			if r.Labels["severity"] != mine.Severity {
				t.Errorf("rule %s: severity %q, slotwatch's %q", r.Alert, r.Labels["severity"], mine.Severity)
			}
			d, err := time.ParseDuration(r.For)
			if err != nil || d != mine.For {
				t.Errorf("rule %s: for %q, slotwatch's %s", r.Alert, r.For, mine.For)
			}
			if want, ok := thresholds[r.Alert]; ok && !regexp.MustCompile(`[<>] `+regexp.QuoteMeta(want)+`\b`).MatchString(r.Expr) {
				t.Errorf("rule %s: expr %q does not compare with slotwatch's default %s", r.Alert, r.Expr, want)
			}
			for _, m := range metricRE.FindAllString(r.Expr, -1) {
				if !slices.Contains(exported, m) {
					t.Errorf("rule %s uses %s, which slotwatch does not export", r.Alert, m)
				}
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %s: summary and description annotations required", r.Alert)
			}
		}
	}
	sort.Strings(names)
	want := alert.Names()
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Errorf("rules file alerts %v, slotwatch's %v", names, want)
	}
}
