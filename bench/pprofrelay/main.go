// Command pprofrelay is the connector with profiling, for the bench: it runs
// the same relay (relay) from the same OUTBOX_* settings, serves
// /metrics and /debug/pprof/ on OUTBOX_HTTP_ADDR, records a CPU profile from
// its start and, when told to stop (SIGTERM, SIGINT), writes the CPU profile
// to BENCH_CPU_PROFILE, the allocation profile to BENCH_HEAP_PROFILE and
// the allocation counters with the count of published events to
// BENCH_STATS (JSON) before it stops the relay.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	rpprof "runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/config"
	"github.com/pgoutbox/pgoutbox/relay/metrics"
	"github.com/pgoutbox/pgoutbox/relay/publish"
	"github.com/pgoutbox/pgoutbox/route"
)

func main() { cli.Main("pprofrelay", iconfig.EnvRule{}, run) }

// Stats are the allocation counters at the stop.
type Stats struct {
	Mallocs    uint64  `json:"mallocs"`
	TotalAlloc uint64  `json:"total_alloc_bytes"`
	NumGC      uint32  `json:"num_gc"`
	Published  int64   `json:"published"`
	Seconds    float64 `json:"seconds"`
}

func run(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("pprofrelay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config.Config
	b := cfg.Bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := errors.Join(b.Err(), cfg.Validate()); err != nil {
		return err
	}
	// The same soft memory limit as the connector's.
	publish.SetMemoryLimit(getenv, cfg.MaxMessageBytes)
	cpuPath, heapPath, statsPath := getenv("BENCH_CPU_PROFILE"), getenv("BENCH_HEAP_PROFILE"), getenv("BENCH_STATS")
	if cpuPath == "" || heapPath == "" || statsPath == "" {
		return errors.New("BENCH_CPU_PROFILE, BENCH_HEAP_PROFILE and BENCH_STATS: set all three to file paths")
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "connector")
	m := metrics.New()
	router, err := route.New(route.DefaultConfig())
	if err != nil {
		return fmt.Errorf("router settings: %w", err)
	}
	r := relay.New(cfg, router, log, m)

	cpuFile, err := os.Create(cpuPath)
	if err != nil {
		return err
	}
	started := time.Now()
	if err := rpprof.StartCPUProfile(cpuFile); err != nil {
		return err
	}
	profiled := make(chan error, 1)
	stopProfiles := context.AfterFunc(ctx, func() {
		// The stop request ends the measured drain: profile what came
		// before it, not the graceful shutdown.
		rpprof.StopCPUProfile()
		err := cpuFile.Close()
		if herr := writeHeap(heapPath); err == nil {
			err = herr
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st := Stats{Mallocs: ms.Mallocs, TotalAlloc: ms.TotalAlloc, NumGC: ms.NumGC, Published: r.Published(), Seconds: time.Since(started).Seconds()}
		body, _ := json.Marshal(st)
		if werr := os.WriteFile(statsPath, body, 0o644); err == nil {
			err = werr
		}
		profiled <- err
	})
	defer stopProfiles()

	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("OUTBOX_HTTP_ADDR: listen on %s: %w", cfg.HTTPAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	runErr := r.Run(ctx)
	if ctx.Err() != nil {
		if err := <-profiled; err != nil {
			return fmt.Errorf("write profiles: %w", err)
		}
	}
	return runErr
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rpprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
