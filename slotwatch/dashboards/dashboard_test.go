package dashboards

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/slotwatch/metric"
	"github.com/pgoutbox/pgoutbox/slotwatch/pipeline"
)

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
	} `json:"panels"`
}

func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("slotwatch.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("slotwatch.json is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	exported := append(metric.Names(), pipeline.Names()...)
	metricRE := regexp.MustCompile(`slotwatch_[a-z0-9_]+`)
	check := func(where, expr string) {
		for _, m := range metricRE.FindAllString(expr, -1) {
			if !slices.Contains(exported, m) && !slices.Contains(exported, strings.TrimSuffix(m, "_bucket")) {
				t.Errorf("%s uses %s, which slotwatch does not export", where, m)
			}
		}
	}
	for _, v := range d.Templating.List {
		check("variable "+v.Name, v.Definition)
	}
	ids := map[int]bool{}
	titles := map[string]string{} // title -> unit
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		titles[p.Title] = p.FieldConfig.Defaults.Unit
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
		}
	}
	// What the issue asks the dashboard to show, with the right units.
	for title, unit := range map[string]string{
		"Lag (bytes) per slot":                      "bytes",
		"Lag (seconds) per slot":                    "s",
		"Retained WAL per slot":                     "bytes",
		"Time to invalidation":                      "s",
		"Alerts":                                    "",
		"Canary latency (commit to Kafka)":          "s",
		"Canary age":                                "s",
		"Audit: missing, duplicated, dead-lettered": "short",
	} {
		got, ok := titles[title]
		if !ok {
			t.Errorf("no panel %q", title)
		} else if got != unit {
			t.Errorf("panel %q unit %q, want %q", title, got, unit)
		}
	}
	if !strings.Contains(string(raw), "${datasource}") {
		t.Error("panels must use the datasource variable")
	}
}
