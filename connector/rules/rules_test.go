package rules

import (
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/route"
)

// TestPromtool checks the rules file and runs its unit tests (the alert
// fires after its for-duration, resolves, and a short stall never fires)
// with the promtool scripts/install.sh builds.
func TestPromtool(t *testing.T) {
	bin := testenv.Promtool(t, testenv.InstalledPromtoolVersion(t))
	for _, args := range [][]string{
		{"check", "rules", "connector.rules.yml"},
		{"test", "rules", "connector.rules.test.yml"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestRulesUseConnectorMetrics: every outbox_connector_* name a rule reads
// (in its expression or in its annotations' template actions, where a
// query runs) is a metric the connector exports as soon as it starts, and
// every rule has a severity, a summary and a description.
func TestRulesUseConnectorMetrics(t *testing.T) {
	raw, err := os.ReadFile("connector.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	metricRE := regexp.MustCompile(`outbox_connector_[a-z0-9_]+`)
	actionRE := regexp.MustCompile(`\{\{.*?\}\}`)
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			used := metricRE.FindAllString(r.Expr, -1)
			for _, a := range r.Annotations {
				for _, action := range actionRE.FindAllString(a, -1) {
					used = append(used, metricRE.FindAllString(action, -1)...)
				}
			}
			if len(used) == 0 {
				t.Errorf("rule %s reads no connector metric", r.Alert)
			}
			for _, m := range used {
				if !exported[m] {
					t.Errorf("rule %s uses %s, which the connector does not export", r.Alert, m)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %s: a severity label and summary and description annotations are required", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

// exportedMetrics is what a new relay's registry gathers (the gauges
// computed at scrape time and every metric without labels), and the
// labelled counters of metrics.Metrics, which appear with their first
// observation: a rule may read those only through increase() or rate(),
// where a series not there yet means "none", never through absent().
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	// Each relay kind exports metrics of its own (poll mode its table's).
	var m *metrics.Metrics
	for _, source := range []string{"wal", "poll"} {
		var cfg config.Config
		cfg.Bind(flag.NewFlagSet("t", flag.ContinueOnError), func(string) string { return "" })
		cfg.Source = source
		router, err := route.New(route.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		m = metrics.New()
		relay.New(cfg, router, slog.New(slog.DiscardHandler), m)
		mfs, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			names[mf.GetName()] = true
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				// A rule reads a histogram by its series.
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					names[mf.GetName()+suffix] = true
				}
			}
		}
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		vec, ok := v.Field(i).Interface().(*prometheus.CounterVec)
		if !ok || vec == nil {
			continue
		}
		descs := make(chan *prometheus.Desc, 1)
		go func() { vec.Describe(descs); close(descs) }()
		for d := range descs {
			if sub := fqName.FindStringSubmatch(d.String()); sub != nil {
				names[sub[1]] = true
			}
		}
	}
	return names
}
