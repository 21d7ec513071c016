package localenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// FindJava returns java (or, when empty, the newest JDK under /usr/lib/jvm
// or on PATH) if it is at least version min.
func FindJava(java string, min int) (string, string, error) {
	var candidates []string
	if java != "" {
		candidates = []string{java}
	} else {
		found, _ := filepath.Glob("/usr/lib/jvm/*/bin/java")
		candidates = append(found, "java")
	}
	type jv struct {
		path string
		ver  string
		n    int
	}
	var ok []jv
	var seen []string
	for _, c := range candidates {
		out, err := exec.Command(c, "-version").CombinedOutput()
		if err != nil {
			continue
		}
		m := regexp.MustCompile(`version "(\d+)(\.[^"]*)?"`).FindSubmatch(out)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(string(m[1]))
		line := strings.SplitN(string(out), "\n", 2)[0]
		seen = append(seen, fmt.Sprintf("%s (%s)", c, line))
		if n >= min {
			ok = append(ok, jv{c, strings.TrimSpace(line), n})
		}
	}
	if len(ok) == 0 {
		return "", "", fmt.Errorf("Debezium Server needs Java %d or newer; found only %v; install one (e.g. a Temurin JDK under /usr/lib/jvm) or name one explicitly", min, seen)
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i].n > ok[j].n })
	return ok[0].path, ok[0].ver, nil
}
