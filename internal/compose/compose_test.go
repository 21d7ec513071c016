package compose

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	connconfig "github.com/pgoutbox/pgoutbox/relay/config"
	swconfig "github.com/pgoutbox/pgoutbox/slotwatch/config"
)

type composeFile struct {
	Services map[string]service `yaml:"services"`
}

type service struct {
	Image       string            `yaml:"image"`
	Build       *build            `yaml:"build"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
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

// TestComposeFile checks docker-compose.yml without Docker: every service
// the design names exists; every environment variable set for our services
// is one our binaries read; every mounted file exists; our images come from
// the Dockerfile's targets; dependencies wait on healthchecks.
func TestComposeFile(t *testing.T) {
	root := testenv.RepoRoot()
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	for _, name := range []string{"postgres", "kafka", "schema-registry", "connector", "slotwatch", "prometheus"} {
		if _, ok := cf.Services[name]; !ok {
			t.Errorf("service %q is missing", name)
		}
	}
	known := map[string][]string{
		"connector": connconfig.EnvVars(),
		"slotwatch": swconfig.EnvVars(),
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for name, vars := range known {
		svc, ok := cf.Services[name]
		if !ok {
			continue
		}
		for k := range svc.Environment {
			if !slices.Contains(vars, k) {
				t.Errorf("service %s sets %s, which the %s binary does not read (it reads %s)", name, k, name, strings.Join(vars, ", "))
			}
		}
		if svc.Build == nil || svc.Build.Target != name {
			t.Errorf("service %s must be built from the Dockerfile's %q target", name, name)
		} else if !strings.Contains(string(dockerfile), "AS "+name+"\n") {
			t.Errorf("Dockerfile has no %q stage", name)
		}
		if svc.Healthcheck == nil {
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
	if !strings.Contains(string(raw), "wal_level=logical") {
		t.Errorf("postgres must run with wal_level=logical")
	}
}
