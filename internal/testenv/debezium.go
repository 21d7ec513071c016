package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// DebeziumServer is Debezium Server 3.6.1 from Maven Central, installed into
// the cache by bench/debezium/install.sh (~780 MB once), and a Java new
// enough to run it. The soak tests compare against it.
type DebeziumServer struct {
	Home string // the unpacked distribution
	Java string // a java binary, version 21 or later
	// ClassPath are more class path entries, after the distribution's
	// (a directory of jars as dir/*).
	ClassPath []string
}

// InstallDebeziumServer installs Debezium Server if needed and finds a
// Java for it; either failing fails the test.
func InstallDebeziumServer(t testing.TB) DebeziumServer {
	t.Helper()
	out, err := exec.Command(filepath.Join(RepoRoot(), "bench", "debezium", "install.sh")).Output()
	if err != nil {
		t.Fatalf("install Debezium Server: %v", err)
	}
	java, _, err := FindJava("", 21)
	if err != nil {
		t.Fatal(err)
	}
	return DebeziumServer{Home: strings.TrimSpace(string(out)), Java: java}
}

// DebeziumRun is a started Debezium Server.
type DebeziumRun struct {
	Cmd     *exec.Cmd
	Dir     string        // its working directory: config/, data/
	LogPath string        // its stdout and stderr
	Exited  chan struct{} // closed when the process has exited
}

// Start runs Debezium Server in a new directory the way the distribution's
// run.sh runs it, without JMX and agents, its output in debezium.log. Its
// config/application.properties is properties with {{dir}} (the directory,
// whose data/ holds the offsets), {{http}} (a free port for Quarkus) and each
// pair of vars (placeholder, value) replaced. It is killed when the test
// ends.
func (d DebeziumServer) Start(t testing.TB, properties string, vars ...string) *DebeziumRun {
	t.Helper()
	dir := t.TempDir()
	for _, sub := range []string{"config", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	httpPort, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	properties = strings.NewReplacer(append([]string{"{{dir}}", dir, "{{http}}", strconv.Itoa(httpPort)}, vars...)...).Replace(properties)
	if err := os.WriteFile(filepath.Join(dir, "config", "application.properties"), []byte(properties), 0o644); err != nil {
		t.Fatal(err)
	}
	runners, _ := filepath.Glob(filepath.Join(d.Home, "debezium-server-*-runner.jar"))
	if len(runners) == 0 {
		t.Fatalf("no runner jar in %s", d.Home)
	}
	run := &DebeziumRun{Dir: dir, LogPath: filepath.Join(dir, "debezium.log"), Exited: make(chan struct{})}
	logf, err := os.Create(run.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	cp := strings.Join(append([]string{runners[0], filepath.Join(d.Home, "config", "lib"), filepath.Join(d.Home, "lib", "*")}, d.ClassPath...), ":")
	run.Cmd = exec.Command(d.Java, "-cp", cp, "io.debezium.server.Main")
	run.Cmd.Dir = dir
	run.Cmd.Stdout, run.Cmd.Stderr = logf, logf
	run.Cmd.Env = append(os.Environ(), "JAVA_HOME="+filepath.Dir(filepath.Dir(d.Java)))
	if err := run.Cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	go func() { _ = run.Cmd.Wait(); logf.Close(); close(run.Exited) }()
	t.Cleanup(func() {
		_ = run.Cmd.Process.Kill()
		<-run.Exited
	})
	return run
}
