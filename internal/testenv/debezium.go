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

// Command is Debezium Server run from dir (which holds
// config/application.properties) the way the distribution's run.sh runs it,
// without JMX and agents, its output appended to log.
func (d DebeziumServer) Command(t testing.TB, dir string, log *os.File) *exec.Cmd {
	t.Helper()
	runners, _ := filepath.Glob(filepath.Join(d.Home, "debezium-server-*-runner.jar"))
	if len(runners) == 0 {
		t.Fatalf("no runner jar in %s", d.Home)
	}
	cp := strings.Join([]string{runners[0], filepath.Join(d.Home, "config", "lib"), filepath.Join(d.Home, "lib", "*")}, ":")
	cmd := exec.Command(d.Java, "-cp", cp, "io.debezium.server.Main")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "JAVA_HOME="+filepath.Dir(filepath.Dir(d.Java)))
	return cmd
}
