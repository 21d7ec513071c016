package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// SharedKafkaEnv names the bootstrap address of the broker that `make test`
// starts once for the whole run (scripts/test.sh).
const SharedKafkaEnv = "OUTBOX_TEST_KAFKA_BROKERS"

// SharedKafka returns the run's shared real broker. Tests that stop, freeze or
// reconfigure a broker must use StartKafka instead, so that other packages
// running at the same time are not disturbed.
func SharedKafka(t testing.TB) string {
	t.Helper()
	brokers := os.Getenv(SharedKafkaEnv)
	if brokers == "" {
		Unavailable(t, "%s is not set: run the tests with `make test`, or start a broker with scripts/kafka.sh start DIR and export its address", SharedKafkaEnv)
	}
	if err := WaitKafka(context.Background(), brokers, 30*time.Second); err != nil {
		Unavailable(t, "Kafka at %s: %v", brokers, err)
	}
	return brokers
}

// KafkaVersion asks the broker for its API versions and names the release.
func KafkaVersion(ctx context.Context, brokers string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	vs, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		return "", err
	}
	for _, v := range vs.Sorted() {
		if v.Err != nil {
			return "", v.Err
		}
		return v.VersionGuess(kversion.SkipKeys()), nil
	}
	return "", fmt.Errorf("no broker answered ApiVersions")
}

// Kafka is a dedicated broker started for one test by scripts/kafka.sh.
type Kafka struct {
	Dir     string
	Brokers string
	Pid     int
	extra   []string
	mu      sync.Mutex
}

// StartKafka starts a dedicated real broker for a test that will stop,
// restart or freeze it. extra lines are appended to server.properties.
func StartKafka(t testing.TB, extra ...string) *Kafka {
	t.Helper()
	dir, err := os.MkdirTemp("", "outbox-kafka-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kafka{Dir: dir, extra: extra}
	t.Cleanup(func() {
		k.Stop()
		os.RemoveAll(dir)
	})
	if err := k.start(); err != nil {
		Unavailable(t, "start Kafka: %v", err)
	}
	t.Logf("dedicated Kafka broker on %s (%s)", k.Brokers, dir)
	return k
}

func (k *Kafka) start() error {
	args := append([]string{"start", k.Dir}, k.extra...)
	cmd := exec.Command(filepath.Join(RepoRoot(), "scripts", "kafka.sh"), args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("scripts/kafka.sh start: %w", err)
	}
	k.mu.Lock()
	k.Brokers = strings.TrimSpace(string(out))
	pid, _ := os.ReadFile(filepath.Join(k.Dir, "pid"))
	k.Pid, _ = strconv.Atoi(strings.TrimSpace(string(pid)))
	k.mu.Unlock()
	return WaitKafka(context.Background(), k.Brokers, 60*time.Second)
}

// Stop stops the broker (SIGTERM, then SIGKILL), keeping its data.
func (k *Kafka) Stop() {
	_ = exec.Command(filepath.Join(RepoRoot(), "scripts", "kafka.sh"), "stop", k.Dir).Run()
}

// Restart starts the broker again on its data and its original port.
func (k *Kafka) Restart() error {
	cp := exec.Command("setsid", "sh", "-c", "exec java -cp \"$LIBS/*\" -Xmx768m -XX:+UseG1GC -Dkafka.logs.dir=\"$DIR/logs\" -Dlog4j2.configurationFile=\"$LOG4J\" kafka.Kafka \"$DIR/server.properties\" >>\"$DIR/logs/stdout.log\" 2>&1 </dev/null")
	cp.Env = append(os.Environ(),
		"LIBS="+KafkaLibs(), "DIR="+k.Dir,
		"LOG4J="+filepath.Join(RepoRoot(), "scripts", "kafka", "log4j2.properties"))
	if err := cp.Start(); err != nil {
		return err
	}
	k.mu.Lock()
	k.Pid = cp.Process.Pid
	k.mu.Unlock()
	_ = os.WriteFile(filepath.Join(k.Dir, "pid"), []byte(strconv.Itoa(cp.Process.Pid)), 0o644)
	go func() { _ = cp.Wait() }()
	return WaitKafka(context.Background(), k.Brokers, 90*time.Second)
}

// Freeze sends SIGSTOP to the broker; Thaw sends SIGCONT.
func (k *Kafka) Freeze() error { return syscall.Kill(k.Pid, syscall.SIGSTOP) }

// Thaw resumes a frozen broker.
func (k *Kafka) Thaw() error { return syscall.Kill(k.Pid, syscall.SIGCONT) }

// KafkaLibs is the folder of jars scripts/kafka.sh resolved.
func KafkaLibs() string {
	out, err := exec.Command(filepath.Join(RepoRoot(), "scripts", "kafka.sh"), "version").Output()
	v := strings.TrimSpace(string(out))
	if err != nil || v == "" {
		v = "unknown"
	}
	cache := os.Getenv("OUTBOX_CACHE_DIR")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "pgoutbox")
	}
	return filepath.Join(cache, "kafka-"+v, "libs")
}
