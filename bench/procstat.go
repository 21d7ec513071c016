package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports but alpha and ia64).
const clockTicks = 100

// procStat returns the fields of /proc/<pid>/stat after the command name:
// state(0), ppid(1), ... The name is in parentheses and may hold spaces, so
// fields are counted after the last ')'.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// procCPU is a process's user+system CPU time so far, all threads.
func procCPU(pid int) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	// utime is field 14 of stat, i.e. index 11 here; stime index 12.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed times in /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procParent is a process's parent pid (0 when unknown).
func procParent(pid int) int {
	f, err := procStat(pid)
	if err != nil || len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// procMem returns the resident set and its peak (VmRSS, VmHWM) in bytes.
func procMem(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var dst *int64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst = &rss
		case strings.HasPrefix(line, "VmHWM:"):
			dst = &hwm
		default:
			continue
		}
		f := strings.Fields(line)
		if len(f) >= 2 {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			*dst = kb * 1024
		}
	}
	return rss, hwm, nil
}

// cpuMeter follows one process's CPU time, keeping the last value read so
// that a process that exited still reports what it used up to the last read.
type cpuMeter struct {
	pid  int
	last time.Duration
}

func (m *cpuMeter) read() time.Duration {
	if m == nil || m.pid <= 0 {
		return 0
	}
	if d, err := procCPU(m.pid); err == nil {
		m.last = d
	}
	return m.last
}
