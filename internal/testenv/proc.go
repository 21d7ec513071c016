package testenv

import (
	"bytes"
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
)

var (
	binMu    sync.Mutex
	binBuilt = map[string]string{}
	binDir   string
)

// Binary returns the path of a binary of this module (e.g. "connector"),
// built without -race once per test process, or taken from
// OUTBOX_TEST_BIN_DIR when set (make test builds bin/ first).
func Binary(t testing.TB, name string) string {
	t.Helper()
	if d := os.Getenv("OUTBOX_TEST_BIN_DIR"); d != "" {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binBuilt[name]; ok {
		return p
	}
	if binDir == "" {
		d, err := os.MkdirTemp("", "outbox-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = d
	}
	p := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", p, "./"+name)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./%s: %v\n%s", name, err, out)
	}
	binBuilt[name] = p
	return p
}

// Proc is a binary run by a test, with its output kept for the test log.
type Proc struct {
	Cmd  *exec.Cmd
	out  *SyncBuffer
	done chan struct{}
	err  error
}

// SyncBuffer is an output several goroutines or a child process's pipes
// write while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartProc starts bin with env (added to a minimal environment).
func StartProc(t testing.TB, bin string, env map[string]string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	p := &Proc{Cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Signal(syscall.SIGKILL)
		<-p.done
	})
	return p
}

// Output is what the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// Signal sends sig (ignoring a process that already exited).
func (p *Proc) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.Cmd.Process.Signal(sig)
	}
}

// Wait waits for the exit and returns the exit code (-1 when killed).
func (p *Proc) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %s; output:\n%s", timeout, tailString(p.Output(), 4000))
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// PeakRSS is the process's peak resident set (VmHWM) in bytes.
func (p *Proc) PeakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", p.Cmd.Process.Pid)
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
