package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// Promtool finds or builds promtool at version (a Prometheus module version,
// v0.316.0 being Prometheus 3.16): $PROMTOOL, else a cached build of version
// in the user cache directory (where scripts/install.sh builds it), else it
// builds one there (a few minutes, once per machine). It is never added to
// go.mod: the build runs outside the repo, from the Go module proxy.
func Promtool(t testing.TB, version string) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	// Where scripts/install.sh builds it: OUTBOX_CACHE_DIR, else
	// $HOME/.cache/pgoutbox.
	cache := os.Getenv("OUTBOX_CACHE_DIR")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "pgoutbox")
	}
	dir := filepath.Join(cache, "promtool-"+version)
	bin := filepath.Join(dir, "promtool")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	t.Logf("building promtool %s into %s (once per machine)", version, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/prometheus/prometheus/cmd/promtool@"+version)
	// Outside the repo, so that our go.mod is neither read nor touched.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		Unavailable(t, "build promtool %s from the Go module proxy: %v\n%s", version, err, out)
	}
	return bin
}

// InstalledPromtoolVersion is the promtool version scripts/install.sh
// builds: the promtoolVersion constant of slotwatch/rules/rules_test.go,
// read as install.sh reads it. A rules test that pins another version would
// build a second promtool on every new machine.
func InstalledPromtoolVersion(t testing.TB) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(RepoRoot(), "slotwatch", "rules", "rules_test.go"))
	if err != nil {
		t.Fatalf("read the promtool version scripts/install.sh builds: %v", err)
	}
	m := regexp.MustCompile(`(?m)^const promtoolVersion = "(.*)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal(`slotwatch/rules/rules_test.go has no line 'const promtoolVersion = "..."', which scripts/install.sh reads`)
	}
	return string(m[1])
}
