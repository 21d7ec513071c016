package compose

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
	connconfig "github.com/pgoutbox/pgoutbox/relay/config"
	swconfig "github.com/pgoutbox/pgoutbox/slotwatch/config"
)

// TestToolingVariablesAccepted keeps the unknown-variable check from
// breaking the project's own tooling: every OUTBOX_* and SLOTWATCH_* name
// that the scripts, the Makefile, the compose file, the bench program and
// the examples use is a setting of the connector or slotwatch, one of
// outbox-router's (OUTBOX_ROUTER_*), or listed in config.Tooling. A
// developer's shell that exports them (make up prints such exports) must
// still start the binaries.
func TestToolingVariablesAccepted(t *testing.T) {
	root := testenv.RepoRoot()
	nameRE := regexp.MustCompile(`\b(?:OUTBOX|SLOTWATCH)_[A-Z0-9_]*[A-Z0-9]\b`)
	found := map[string]string{} // name -> a file that uses it
	for _, dir := range []string{"scripts", "bench", "examples", "deploy", ".ci"} {
		_ = filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "/results/") {
				return nil
			}
			scan(t, p, nameRE, found)
			return nil
		})
	}
	for _, f := range []string{"Makefile", "docker-compose.yml", "Dockerfile"} {
		scan(t, filepath.Join(root, f), nameRE, found)
	}
	if len(found) == 0 {
		t.Fatal("no OUTBOX_* or SLOTWATCH_* name found: the scan looks in the wrong place")
	}
	connector := iconfig.EnvRule{Prefixes: []string{"OUTBOX_"}, Others: []string{"OUTBOX_ROUTER_"}, Known: connconfig.EnvVars()}
	slotwatch := iconfig.EnvRule{Prefixes: []string{"SLOTWATCH_"}, Known: swconfig.EnvVars()}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, rule := range []iconfig.EnvRule{connector, slotwatch} {
			if err := iconfig.CheckUnknownEnv([]string{n + "=x"}, rule); err != nil {
				t.Errorf("%s (used in %s) would stop a binary: %v; add it to config.Tooling or rename it", n, found[n], err)
			}
		}
	}
	t.Logf("%d names checked", len(names))
}

func scan(t *testing.T, path string, re *regexp.Regexp, found map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return
		}
		t.Fatal(err)
	}
	for _, n := range re.FindAllString(string(raw), -1) {
		if _, ok := found[n]; !ok {
			found[n] = path
		}
	}
}
