package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// SharedRegistryEnv names the Confluent-API base URL of a schema registry
// started once for the whole run (scripts/registry.sh start DIR prints it).
// Unset, each StartRegistry starts its own.
const SharedRegistryEnv = "OUTBOX_TEST_REGISTRY_URL"

// StartRegistry returns the base URL of the Confluent-compatible API of a real
// schema registry: Apicurio Registry with in-memory storage, started by
// scripts/registry.sh (http://127.0.0.1:PORT/apis/ccompat/v7). It is the run's
// shared registry when OUTBOX_TEST_REGISTRY_URL is set, else one started for
// this test and stopped when it ends (about 5 to 10 s on an idle machine).
// Subjects may outlive the test in a shared registry: name them uniquely.
// A registry that cannot be started is Unavailable (a failure in CI).
func StartRegistry(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(SharedRegistryEnv); url != "" {
		if err := WaitRegistry(context.Background(), url, 30*time.Second); err != nil {
			Unavailable(t, "schema registry at %s (%s): %v", url, SharedRegistryEnv, err)
		}
		return url
	}
	dir, err := os.MkdirTemp("", "outbox-registry-")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(RepoRoot(), "scripts", "registry.sh")
	t.Cleanup(func() {
		_ = exec.Command(script, "stop", dir).Run()
		os.RemoveAll(dir)
	})
	start := time.Now()
	cmd := exec.Command(script, "start", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		Unavailable(t, "start the schema registry (scripts/registry.sh start): %v\n%s", err, tailString(stderr.String(), 4000))
	}
	url := strings.TrimSpace(string(out))
	if err := WaitRegistry(context.Background(), url, 30*time.Second); err != nil {
		Unavailable(t, "schema registry at %s: %v", url, err)
	}
	t.Logf("schema registry (Apicurio Registry, Confluent API) at %s, started in %s", url, time.Since(start).Round(100*time.Millisecond))
	return url
}

// WaitRegistry waits until the registry lists its subjects.
func WaitRegistry(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl := &http.Client{Timeout: 2 * time.Second}
	for {
		err := getOK(ctx, cl, strings.TrimRight(url, "/")+"/subjects")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("registry did not list its subjects within %s: %w", timeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func getOK(ctx context.Context, cl *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// PythonClients returns the python of a virtual environment holding the
// outside clients (confluent-kafka with its Avro deserializer), installed
// by scripts/pyclients.sh into the cache on first use. One that cannot be
// installed is Unavailable (a failure in CI).
func PythonClients(t testing.TB) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(RepoRoot(), "scripts", "pyclients.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		Unavailable(t, "install confluent-kafka for Python (scripts/pyclients.sh): %v\n%s", err, tailString(stderr.String(), 4000))
	}
	return strings.TrimSpace(string(out))
}
