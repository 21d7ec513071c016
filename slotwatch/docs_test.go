package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/config"
	"github.com/pgoutbox/pgoutbox/slotwatch/metric"
	"github.com/pgoutbox/pgoutbox/slotwatch/pipeline"
)

// TestDocsCoverEverything checks README.md documents every setting,
// metric and alert slotwatch has.
func TestDocsCoverEverything(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	check := func(kind string, names []string) {
		for _, n := range names {
			if !strings.Contains(doc, "`"+n+"`") {
				t.Errorf("README.md does not document %s %s", kind, n)
			}
		}
	}
	check("setting", config.EnvVars())
	check("metric", metric.Names())
	check("metric", pipeline.Names())
	check("alert", alert.Names())
}
