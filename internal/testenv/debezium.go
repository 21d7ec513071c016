package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DebeziumServer is Debezium Server 3.6.1 from Maven Central, installed into
// the cache by bench/debezium/install.sh (~780 MB once), and a Java new
// enough to run it. The soak tests compare against it.
type DebeziumServer struct {
	Home string // the unpacked distribution
	Java string // a java binary, version 21 or later
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
	LogPath string        // its stdout and stderr
	Exited  chan struct{} // closed when the process has exited
}

// Start writes properties to dir/config/application.properties and runs
// Debezium Server from dir the way the distribution's run.sh runs it,
// without JMX and agents, its output in dir/debezium.log. It is killed when
// the test ends.
func (d DebeziumServer) Start(t testing.TB, dir, properties string) *DebeziumRun {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config", "application.properties"), []byte(properties), 0o644); err != nil {
		t.Fatal(err)
	}
	runners, _ := filepath.Glob(filepath.Join(d.Home, "debezium-server-*-runner.jar"))
	if len(runners) == 0 {
		t.Fatalf("no runner jar in %s", d.Home)
	}
	run := &DebeziumRun{LogPath: filepath.Join(dir, "debezium.log"), Exited: make(chan struct{})}
	logf, err := os.Create(run.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	cp := strings.Join([]string{runners[0], filepath.Join(d.Home, "config", "lib"), filepath.Join(d.Home, "lib", "*")}, ":")
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
