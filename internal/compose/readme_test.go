package compose

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/testenv"
	connconfig "github.com/pgoutbox/pgoutbox/relay/config"
	swconfig "github.com/pgoutbox/pgoutbox/slotwatch/config"
)

// TestReadmeDocumentsSettings keeps README.md true: every environment
// variable a binary reads appears in it.
func TestReadmeDocumentsSettings(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	for bin, vars := range map[string][]string{"connector": connconfig.EnvVars(), "slotwatch": swconfig.EnvVars()} {
		for _, v := range vars {
			if !strings.Contains(readme, "`"+v+"`") {
				t.Errorf("README.md does not document %s's setting %s", bin, v)
			}
		}
	}
}
