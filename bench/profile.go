package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profileDrain drains the backlog with the connector built with profiling
// (bench/pprofrelay: the same relay) and keeps its CPU and allocation
// profiles, their top entries, and the allocations per event.
func (b *bench) profileDrain(ctx context.Context, bl backlog, v variant, slot string) ProfileResult {
	name := map[string]string{sysConnector: "connector", sysConnectorIdem: "connector-idempotent", sysConnectorLinger: "connector-linger", sysConnectorLinger0: "connector-linger0"}[v.Name]
	if name == "" {
		name = "connector-variant"
	}
	base := fmt.Sprintf("%s-drain-tx%d", name, bl.TxSize)
	pr := ProfileResult{
		Variant:     v.Name,
		TxSize:      bl.TxSize,
		CPUProfile:  base + ".cpu.pprof",
		HeapProfile: base + ".allocs.pprof",
	}
	cpuPath := filepath.Join(b.out, pr.CPUProfile)
	heapPath := filepath.Join(b.out, pr.HeapProfile)
	statsPath := filepath.Join(b.env.tmp, base+".stats.json")
	env := append([]string{"BENCH_CPU_PROFILE=" + cpuPath, "BENCH_HEAP_PROFILE=" + heapPath, "BENCH_STATS=" + statsPath}, v.Env...)
	start := b.startConnector(b.env.pprofBin, env...)
	// drainRelay stops the process when it returns, which writes the profiles.
	pr.Drain = b.drainRelay(ctx, bl, v.Name+profiledSuffix, slot, 1, start, 5*time.Minute)
	if pr.Drain.Error != "" {
		pr.Error = pr.Drain.Error
		return pr
	}
	var st struct {
		Mallocs    uint64 `json:"mallocs"`
		TotalAlloc uint64 `json:"total_alloc_bytes"`
		Published  int64  `json:"published"`
	}
	body, err := os.ReadFile(statsPath)
	if err == nil {
		err = json.Unmarshal(body, &st)
	}
	if err != nil {
		pr.Error = fmt.Sprintf("read profile stats: %v", err)
		return pr
	}
	if st.Published > 0 {
		pr.AllocsPerEv = float64(st.Mallocs) / float64(st.Published)
		pr.BytesPerEv = float64(st.TotalAlloc) / float64(st.Published)
	}
	top := func(args ...string) string {
		cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "pprof"}, args...)...)
		cmd.Dir = b.root
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Sprintf("go tool pprof %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	pr.TopCPU = top("-top", "-nodecount=30", cpuPath)
	pr.TopCPUCum = top("-top", "-cum", "-nodecount=80", cpuPath)
	pr.TopAlloc = top("-top", "-sample_index=alloc_space", "-nodecount=20", heapPath)
	pr.TopAllocObj = top("-top", "-sample_index=alloc_objects", "-nodecount=20", heapPath)
	return pr
}
