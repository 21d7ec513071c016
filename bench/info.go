package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), LoadAvg: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				f := strings.Fields(line)
				if len(f) >= 2 {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					m.MemBytes = kb * 1024
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func (b *bench) versions(ctx context.Context) map[string]string {
	v := map[string]string{"go": runtime.Version()}
	if b.env != nil && b.env.pg != nil {
		v["postgresql"] = b.env.pg.Version
		if out, err := exec.CommandContext(ctx, filepath.Join(b.env.pg.BinDir, "pg_recvlogical"), "--version").Output(); err == nil {
			v["pg_recvlogical"] = strings.TrimSpace(string(out))
		}
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(b.root, "scripts", "kafka.sh"), "version").Output(); err == nil {
		v["kafka"] = "Apache Kafka " + strings.TrimSpace(string(out)) + " (KRaft, one node)"
	}
	if out, err := exec.CommandContext(ctx, "java", "-version").CombinedOutput(); err == nil {
		v["kafka_java"] = strings.TrimSpace(string(bytes.SplitN(out, []byte("\n"), 2)[0]))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/twmb/franz-go", "github.com/jackc/pglogrepl", "github.com/jackc/pgx/v5":
				v[d.Path] = d.Version
			}
		}
	}
	if b.dbz != nil {
		if b.dbz.version != "" {
			v["debezium_server"] = b.dbz.version
		}
		if b.dbz.javaVer != "" {
			v["debezium_java"] = b.dbz.javaVer
		}
	}
	return v
}
