package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// sysProc is a system under test run as a child process in its own process
// group, with its output in a log file.
type sysProc struct {
	name    string
	cmd     *exec.Cmd
	pid     int
	logPath string
	started time.Time
	done    chan struct{}
	err     error
	exitAt  time.Time
	// httpPort serves /metrics (the connector), 0 when none.
	httpPort int
}

var (
	procsMu sync.Mutex
	procs   = map[*sysProc]bool{}
)

// startProc starts bin; env is the whole environment.
func startProc(name, dir, logDir, bin string, args, env []string) (*sysProc, error) {
	logPath := filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &sysProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.pid = cmd.Process.Pid
	procsMu.Lock()
	procs[p] = true
	procsMu.Unlock()
	go func() {
		p.err = cmd.Wait()
		p.exitAt = time.Now()
		f.Close()
		procsMu.Lock()
		delete(procs, p)
		procsMu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *sysProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to grace, then kills the process group.
func (p *sysProc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.done
	}
}

// logTail is the end of the process's output, for error messages.
func (p *sysProc) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	return tailString(string(b), n)
}

// killAll ends every process the bench started and that still runs (each by
// its own process group id).
func killAll() {
	procsMu.Lock()
	list := make([]*sysProc, 0, len(procs))
	for p := range procs {
		list = append(list, p)
	}
	procsMu.Unlock()
	for _, p := range list {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.done
	}
}
