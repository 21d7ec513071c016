package main

import (
	"context"
	"os/exec"
	"strings"
	"time"
)

// Micro is one `go test -bench` result of a hot path.
type Micro struct {
	Package   string  `json:"package"`
	Name      string  `json:"name"`
	NsPerOp   float64 `json:"ns_per_op"`
	MBPerSec  float64 `json:"mb_per_sec,omitempty"`
	BytesOp   float64 `json:"bytes_per_op"`
	AllocsOp  float64 `json:"allocs_per_op"`
	Iteration int64   `json:"iterations"`
}

// microPackages hold the hot paths' benchmarks: the decoder and the stream's
// per-event path, the tracker, the router.
var microPackages = []string{"./relay/wal", "./relay/tracker", "./route"}

// micro runs the hot paths' go test benchmarks, package by package (one
// that does not compile does not hide the others).
func (b *bench) micro(ctx context.Context) ([]Micro, []string) {
	var out []Micro
	var notes []string
	for _, pkg := range microPackages {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", "500ms", pkg)
		cmd.Dir = b.root
		body, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			notes = append(notes, "go test -bench "+pkg+": "+oneLine(tailString(string(body), 600), 600))
			continue
		}
		out = append(out, parseBench(pkg, string(body))...)
	}
	return out, notes
}

// parseBench reads `go test -bench -benchmem` output.
func parseBench(pkg, text string) []Micro {
	var out []Micro
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		m := Micro{Package: strings.TrimPrefix(pkg, "./"), Name: f[0]}
		m.Iteration = int64(parseFloat(f[1]))
		for i := 2; i+1 < len(f); i += 2 {
			v := parseFloat(f[i])
			switch f[i+1] {
			case "ns/op":
				m.NsPerOp = v
			case "MB/s":
				m.MBPerSec = v
			case "B/op":
				m.BytesOp = v
			case "allocs/op":
				m.AllocsOp = v
			}
		}
		out = append(out, m)
	}
	return out
}
