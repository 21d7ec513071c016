// Package layout holds the test of the module's package graph: each binary
// is a leaf (main plus packages only it imports), and no binary links the
// testing package. The exceptions of today are listed, to be removed; a new
// one fails, and so does an exception that no longer holds (so the list
// stays true as it shrinks).
package layout

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/pgoutbox/pgoutbox"

// knownImports are imports across binaries' folders that exist today:
// none since the relay's packages left connector/ for relay/ (the demo and
// the profiling bench run the relay in-process).
var knownImports []string

// knownTesting are binaries that link the testing package today: none
// since the demo and the bench start their services with internal/localenv.
var knownTesting []string

type pkg struct {
	path, name string
	imports    []string
	deps       []string
}

func list(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{.Name}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}|{{.Dir}}", module+"/...").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 5 {
			t.Fatalf("go list line %q", line)
		}
		pkgs = append(pkgs, pkg{path: rel(f[0]), name: f[1], imports: strings.Fields(f[2]), deps: strings.Fields(f[3])})
		touch(t, f[4])
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; want the whole module", len(pkgs))
	}
	return pkgs
}

// touch reads the Go files of a package's folder: the graph comes from a
// go list child process, which Go's test cache does not see, and a file the
// test reads is one of its inputs, so a changed import runs the test again
// instead of answering from the cache.
func touch(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".go") {
			if _, err := os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func rel(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "/") }

// TestBinariesAreLeaves: no package in one binary's folder (the folder of a
// main package and everything under it, to the next main package) is
// imported from another binary's folder.
func TestBinariesAreLeaves(t *testing.T) {
	pkgs := list(t)
	var mains []string
	for _, p := range pkgs {
		if p.name == "main" {
			mains = append(mains, p.path)
		}
	}
	if !slices.Contains(mains, "connector") || !slices.Contains(mains, "outbox-router") {
		t.Fatalf("main packages %v: want connector and outbox-router among them", mains)
	}
	// folder is the binary folder p belongs to: the deepest main package
	// folder that is p's or an ancestor of it ("" for none).
	folder := func(p string) string {
		best := ""
		for _, m := range mains {
			if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		return best
	}
	var found []string
	for _, p := range pkgs {
		from := folder(p.path)
		for _, imp := range p.imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := folder(rel(imp))
			if to != "" && to != from {
				found = append(found, p.path+" -> "+rel(imp))
			}
		}
	}
	compare(t, "imports across binaries' folders", found, knownImports)
}

// TestBinariesDoNotLinkTesting: no main package depends on testing.
func TestBinariesDoNotLinkTesting(t *testing.T) {
	var found []string
	for _, p := range list(t) {
		if p.name == "main" && slices.Contains(p.deps, "testing") {
			found = append(found, p.path)
		}
	}
	compare(t, "binaries linking the testing package", found, knownTesting)
}

func compare(t *testing.T, what string, found, known []string) {
	t.Helper()
	slices.Sort(found)
	for _, f := range found {
		if !slices.Contains(known, f) {
			t.Errorf("%s: %s is new; a binary's packages are its own (move what two binaries share out of both folders, e.g. to the top level or internal/)", what, f)
		}
	}
	for _, k := range known {
		if !slices.Contains(found, k) {
			t.Errorf("%s: %s is listed as known but no longer holds; remove it from the list", what, k)
		}
	}
	t.Logf("%s: %d (%s)", what, len(found), strings.Join(found, ", "))
}

// TestDesignNamesPackages: docs/design.md's table of where each decision is
// made names packages of the module, and the files it names are in them, so
// that the answer a newcomer reads stays true as packages move.
func TestDesignNamesPackages(t *testing.T) {
	pkgs := map[string]bool{}
	for _, p := range list(t) {
		pkgs[p.path] = true
	}
	text, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(text), "## Where each decision is made")
	if !ok {
		t.Fatal(`docs/design.md has no "Where each decision is made" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	tick := regexp.MustCompile("`([^`]+)`")
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.Contains(cells[2], "`") {
			continue
		}
		rows++
		pm := tick.FindStringSubmatch(cells[2])
		dir := pm[1]
		if !pkgs[dir] {
			t.Errorf("design.md: %q is not a package of the module", dir)
			continue
		}
		for _, m := range tick.FindAllStringSubmatch(cells[3], -1) {
			if name := m[1]; strings.HasSuffix(name, ".go") {
				if _, err := os.Stat(filepath.Join("../..", dir, name)); err != nil {
					t.Errorf("design.md: %s names %s, not a file of it", dir, name)
				}
			}
		}
	}
	if rows < 3 {
		t.Errorf("design.md: %d rows in the decisions table; want at least the three (confirmed, routed, alerted)", rows)
	}
}
