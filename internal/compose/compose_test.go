package compose

import (
	"encoding/json"
	"flag"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
	mconfig "github.com/pgoutbox/pgoutbox/maintain/config"
	connconfig "github.com/pgoutbox/pgoutbox/relay/config"
	swconfig "github.com/pgoutbox/pgoutbox/slotwatch/config"
)

type composeFile struct {
	Services map[string]service `yaml:"services"`
}

type service struct {
	Image           string            `yaml:"image"`
	Build           *build            `yaml:"build"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Ports           []string          `yaml:"ports"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

type build struct {
	Context string `yaml:"context"`
	Target  string `yaml:"target"`
}

// binaries are the variables each of our binaries reads, by the Dockerfile
// target (and image) that holds it.
func binaries() map[string]iconfig.EnvRule {
	return map[string]iconfig.EnvRule{
		"connector": {Known: connconfig.EnvVars()},
		"slotwatch": {Known: swconfig.EnvVars()},
		"maintain":  {Known: mconfig.EnvVars()},
	}
}

func loadCompose(t *testing.T) (composeFile, string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	return cf, string(raw)
}

// TestComposeFile checks docker-compose.yml without Docker: every service
// the design names exists; every environment variable set for our services
// is one our binaries read; every mounted file exists; our images come from
// the Dockerfile's targets; dependencies wait on healthchecks.
func TestComposeFile(t *testing.T) {
	root := testenv.RepoRoot()
	cf, raw := loadCompose(t)
	for _, name := range []string{"postgres", "kafka", "schema-registry", "connector-a", "connector-b", "slotwatch", "maintain", "prometheus", "grafana"} {
		if _, ok := cf.Services[name]; !ok {
			t.Errorf("service %q is missing", name)
		}
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	known := binaries()
	for name, svc := range cf.Services {
		if svc.Build == nil {
			continue
		}
		rule, ok := known[svc.Build.Target]
		if !ok {
			t.Errorf("service %s is built from target %q, which is none of our binaries with settings", name, svc.Build.Target)
			continue
		}
		if !strings.Contains(string(dockerfile), "AS "+svc.Build.Target+"\n") {
			t.Errorf("service %s: the Dockerfile has no %q stage", name, svc.Build.Target)
		}
		for k := range svc.Environment {
			if !rule.Reads(k) {
				t.Errorf("service %s sets %s, which the %s binary does not read (it reads %s)", name, k, svc.Build.Target, strings.Join(rule.Known, ", "))
			}
		}
		if svc.Healthcheck == nil && svc.Build.Target != "maintain" {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	for name, svc := range cf.Services {
		for _, v := range svc.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, ".") {
				continue // a named volume
			}
			if _, err := os.Stat(filepath.Join(root, src)); err != nil {
				t.Errorf("service %s mounts %s, which does not exist", name, src)
			}
		}
		for dep, cond := range svc.DependsOn {
			if _, ok := cf.Services[dep]; !ok {
				t.Errorf("service %s depends on unknown service %s", name, dep)
			}
			if cond.Condition == "service_healthy" && cf.Services[dep].Healthcheck == nil {
				t.Errorf("service %s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
	}
	for _, name := range []string{"postgres", "kafka"} {
		if cf.Services[name].Healthcheck == nil {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	if !slices.ContainsFunc(cf.Services["postgres"].Volumes, func(v string) bool { return strings.HasPrefix(v, "./sql:/docker-entrypoint-initdb.d") }) {
		t.Errorf("postgres must mount ./sql as its init scripts")
	}
	if !strings.Contains(raw, "wal_level=logical") {
		t.Errorf("postgres must run with wal_level=logical")
	}
	// Prometheus evaluates every alert rules file the project ships (and
	// promtool checks): slotwatch's and the connector's.
	rules, _ := filepath.Glob(filepath.Join(root, "*", "rules", "*.rules.yml"))
	if len(rules) < 2 {
		t.Fatalf("rules files %v; want slotwatch's and the connector's", rules)
	}
	for _, f := range rules {
		rel, _ := filepath.Rel(root, f)
		if !slices.ContainsFunc(cf.Services["prometheus"].Volumes, func(v string) bool {
			return strings.HasPrefix(v, "./"+rel+":/etc/prometheus/rules/")
		}) {
			t.Errorf("prometheus does not load %s (mount it under /etc/prometheus/rules/)", rel)
		}
	}
}

// TestDockerfileBuildsEveryBinary: the Dockerfile's build stage builds
// every binary `make build` writes, and each has an image of its own.
func TestDockerfileBuildsEveryBinary(t *testing.T) {
	root := testenv.RepoRoot()
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := buildPackages(t, "Makefile", string(makefile))
	df := buildPackages(t, "Dockerfile", string(dockerfile))
	if len(mk) < 4 {
		t.Fatalf("make build builds %v; want connector, outbox-router, slotwatch and maintain at least", mk)
	}
	for _, bin := range mk {
		if !slices.Contains(df, bin) {
			t.Errorf("the Dockerfile does not build %s, which make build does (it builds %v)", bin, df)
		}
		if !strings.Contains(string(dockerfile), "AS "+bin+"\n") {
			t.Errorf("the Dockerfile has no %q image stage", bin)
		}
	}
}

// buildPackages are the ./dir packages of the text's one `go build` line.
func buildPackages(t *testing.T, what, text string) []string {
	t.Helper()
	line := regexp.MustCompile(`(?m)^.*(?:go|\$\(GO\)) build .*$`).FindString(text)
	if line == "" {
		t.Fatalf("%s has no go build line", what)
	}
	var out []string
	for _, m := range regexp.MustCompile(`\./([a-z][a-z0-9-]*)`).FindAllStringSubmatch(line, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestComposeConnectorReplicas: the stack runs the connector as the design
// wants it deployed, a leader and a hot standby behind the lease: two
// services of the same image with the same settings (slot, database,
// Kafka), each reachable by Prometheus, each given the time to hand over
// gracefully before Docker kills it.
func TestComposeConnectorReplicas(t *testing.T) {
	cf, _ := loadCompose(t)
	var replicas []string
	for name, svc := range cf.Services {
		if svc.Build != nil && svc.Build.Target == "connector" {
			replicas = append(replicas, name)
		}
	}
	slices.Sort(replicas)
	if len(replicas) < 2 {
		t.Fatalf("connector services %v; want two replicas (a leader and a standby)", replicas)
	}
	var def connconfig.Config
	def.Bind(flag.NewFlagSet("connector", flag.ContinueOnError), func(string) string { return "" })
	first := cf.Services[replicas[0]]
	hostPorts := map[string]string{}
	targets := prometheusTargets(t, "outbox-connector")
	for _, name := range replicas {
		svc := cf.Services[name]
		// Only the client id may differ: the lease, the slot and the
		// transactional ids are shared by name.
		for _, k := range []string{"OUTBOX_PG_DSN", "OUTBOX_KAFKA_BROKERS", "OUTBOX_SLOT", "OUTBOX_PUBLICATION", "OUTBOX_TABLE", "OUTBOX_LEASE_TTL", "OUTBOX_HTTP_ADDR"} {
			if svc.Environment[k] != first.Environment[k] {
				t.Errorf("%s sets %s=%q, %s %q: replicas must share their settings", name, k, svc.Environment[k], replicas[0], first.Environment[k])
			}
		}
		for k := range first.Environment {
			if _, ok := svc.Environment[k]; !ok {
				t.Errorf("%s does not set %s, which %s sets", name, k, replicas[0])
			}
		}
		addr := svc.Environment["OUTBOX_HTTP_ADDR"]
		if !strings.HasPrefix(addr, "0.0.0.0:") {
			t.Errorf("%s: OUTBOX_HTTP_ADDR=%q; Prometheus scrapes it from another container, listen on 0.0.0.0", name, addr)
		}
		_, port, _ := strings.Cut(addr, ":")
		if !slices.Contains(targets, name+":"+port) {
			t.Errorf("deploy/prometheus.yml does not scrape %s:%s (job outbox-connector scrapes %v)", name, port, targets)
		}
		for _, p := range svc.Ports {
			host, _, _ := strings.Cut(p, ":")
			if other, ok := hostPorts[host]; ok {
				t.Errorf("%s and %s both publish host port %s", name, other, host)
			}
			hostPorts[host] = name
		}
		shutdown := def.ShutdownTimeout
		if v := svc.Environment["OUTBOX_SHUTDOWN_TIMEOUT"]; v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: OUTBOX_SHUTDOWN_TIMEOUT=%q: %v", name, v, err)
			}
			shutdown = d
		}
		grace, err := time.ParseDuration(svc.StopGracePeriod)
		if err != nil || grace <= shutdown {
			t.Errorf("%s: stop_grace_period %q must exceed OUTBOX_SHUTDOWN_TIMEOUT (%s): Docker kills after 10 s by default, before the leader has released the lease", name, svc.StopGracePeriod, shutdown)
		}
		if svc.Healthcheck == nil || !slices.Contains(svc.Healthcheck.Test, "http://127.0.0.1:"+port+"/readyz") {
			t.Errorf("%s: the healthcheck must probe /readyz on port %s (ready as leader or standby)", name, port)
		}
	}
	if sw := prometheusTargets(t, "slotwatch"); !slices.Contains(sw, "slotwatch:9188") {
		t.Errorf("deploy/prometheus.yml does not scrape slotwatch:9188 (job slotwatch scrapes %v)", sw)
	}
}

// TestComposeMaintain: the maintain job runs against the table the stack
// creates (sql/ applies the plain table, so MAINTAIN_MODE=delete) and keeps
// running (a service that ran once would be restarted in a loop).
func TestComposeMaintain(t *testing.T) {
	cf, _ := loadCompose(t)
	svc, ok := cf.Services["maintain"]
	if !ok {
		t.Fatal("service maintain is missing")
	}
	if svc.Build == nil || svc.Build.Target != "maintain" {
		t.Errorf("maintain must be built from the Dockerfile's maintain target")
	}
	if svc.Environment["MAINTAIN_PG_DSN"] == "" {
		t.Errorf("maintain: MAINTAIN_PG_DSN is not set")
	}
	if m := svc.Environment["MAINTAIN_MODE"]; m != "delete" {
		t.Errorf("maintain: MAINTAIN_MODE=%q; the stack applies sql/ (the plain table, no partitions): use delete", m)
	}
	if d, err := time.ParseDuration(svc.Environment["MAINTAIN_INTERVAL"]); err != nil || d <= 0 {
		t.Errorf("maintain: MAINTAIN_INTERVAL=%q; set a positive interval, or the service exits and is restarted at once", svc.Environment["MAINTAIN_INTERVAL"])
	}
	if svc.DependsOn["postgres"].Condition != "service_healthy" {
		t.Errorf("maintain must wait for postgres to be healthy")
	}
}

// TestComposeGrafana: Grafana's provisioning files exist, the data source is
// the stack's Prometheus (the default, which the dashboards' data source
// variable picks), and every dashboard in the repository is mounted where
// the dashboard provider reads, as a real dashboard file.
func TestComposeGrafana(t *testing.T) {
	root := testenv.RepoRoot()
	cf, _ := loadCompose(t)
	svc, ok := cf.Services["grafana"]
	if !ok {
		t.Fatal("service grafana is missing")
	}
	mounts := map[string]string{} // container path -> repository path
	for _, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			continue
		}
		mounts[parts[1]] = parts[0]
	}
	provisioned := func(dir string) (repo string) {
		t.Helper()
		for c, r := range mounts {
			if path.Dir(c) == "/etc/grafana/provisioning/"+dir {
				return r
			}
		}
		t.Fatalf("grafana mounts no file into /etc/grafana/provisioning/%s", dir)
		return ""
	}

	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name      string `yaml:"name"`
			Type      string `yaml:"type"`
			URL       string `yaml:"url"`
			IsDefault bool   `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(root, provisioned("datasources")), &ds)
	if ds.APIVersion != 1 || len(ds.Datasources) != 1 {
		t.Fatalf("data source provisioning: want apiVersion 1 and one data source, got %+v", ds)
	}
	d := ds.Datasources[0]
	u, err := url.Parse(d.URL)
	if d.Type != "prometheus" || !d.IsDefault || err != nil || u.Hostname() != "prometheus" || u.Port() != "9090" {
		t.Errorf("data source %+v: want the default, of type prometheus, at http://prometheus:9090", d)
	}
	if _, ok := cf.Services[u.Hostname()]; !ok {
		t.Errorf("data source URL %s names no service", d.URL)
	}

	var prov struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(root, provisioned("dashboards")), &prov)
	if prov.APIVersion != 1 || len(prov.Providers) != 1 || prov.Providers[0].Type != "file" || prov.Providers[0].Options.Path == "" {
		t.Fatalf("dashboard provisioning: want apiVersion 1 and one file provider with a path, got %+v", prov)
	}
	dir := prov.Providers[0].Options.Path
	mounted := map[string]bool{}
	for c, r := range mounts {
		if path.Dir(c) != dir {
			continue
		}
		mounted[filepath.Clean(r)] = true
		raw, err := os.ReadFile(filepath.Join(root, r))
		if err != nil {
			t.Errorf("grafana mounts %s as a dashboard: %v", r, err)
			continue
		}
		var dash struct {
			UID    string            `json:"uid"`
			Title  string            `json:"title"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal(raw, &dash); err != nil || dash.UID == "" || dash.Title == "" || len(dash.Panels) == 0 {
			t.Errorf("grafana mounts %s as a dashboard, but it is not one (uid, title, panels): %v", r, err)
		}
	}
	all, _ := filepath.Glob(filepath.Join(root, "*", "dashboards", "*.json"))
	if len(all) == 0 {
		t.Fatal("no dashboard found in */dashboards/*.json")
	}
	for _, f := range all {
		rel, _ := filepath.Rel(root, f)
		if !mounted[rel] {
			t.Errorf("dashboard %s is not mounted into grafana's %s", rel, dir)
		}
	}
}

// prometheusTargets are the static targets of a job in deploy/prometheus.yml.
func prometheusTargets(t *testing.T, job string) []string {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, filepath.Join(testenv.RepoRoot(), "deploy", "prometheus.yml"), &cfg)
	var out []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName == job {
			for _, s := range sc.StaticConfigs {
				out = append(out, s.Targets...)
			}
		}
	}
	return out
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s does not parse: %v", file, err)
	}
}
