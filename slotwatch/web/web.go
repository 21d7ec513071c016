// Package web serves slotwatch over HTTP: /metrics (Prometheus text),
// /healthz, /slots (JSON) and, at /, a status page rendered by the binary
// itself with no external assets: one row per slot, its state and a lag
// sparkline drawn as inline SVG.
package web

import (
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// Source is what the pages show.
type Source struct {
	// Reports returns the latest report of every server.
	Reports func() []watch.Report
	// Alerts returns the pending and firing alerts (may be nil).
	Alerts func() []alert.Status
	// Interval is the collection interval; the status page refreshes at it.
	Interval time.Duration
}

// Handler routes the endpoints; gatherer serves /metrics.
func Handler(src Source, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	if src.Alerts == nil {
		src.Alerts = func() []alert.Status { return nil }
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: false,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		healthz(w, src)
	})
	mux.HandleFunc("GET /slots", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, SlotsView(src.Reports(), src.Alerts()))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := RenderStatus(w, src.Reports(), src.Alerts(), src.Interval, time.Now()); err != nil {
			log.Error("render status page", "err", err)
		}
	})
	return mux
}

// healthz answers 200 while slotwatch serves, whatever the databases' state
// (that is slotwatch_up's and DatabaseUnreachable's job): restarting
// slotwatch does not bring a database back.
func healthz(w http.ResponseWriter, src Source) {
	type server struct {
		Server string `json:"server"`
		Up     bool   `json:"up"`
		Error  string `json:"error,omitempty"`
	}
	out := struct {
		Status  string   `json:"status"`
		Servers []server `json:"servers"`
	}{Status: "ok", Servers: []server{}}
	for _, r := range src.Reports() {
		out.Servers = append(out.Servers, server{Server: r.Server, Up: r.Up, Error: r.Err})
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ServerView is one server in /slots.
type ServerView struct {
	watch.Report
	// WALRate is null until two samples exist.
	WALRate *float64   `json:"wal_bytes_per_second"`
	Slots   []SlotView `json:"slots"`
	// Alerts are the server-wide alerts (DatabaseUnreachable, RiskyConfiguration).
	Alerts []alert.Status `json:"alerts,omitempty"`
}

// SlotView is one slot in /slots.
type SlotView struct {
	watch.SlotReport
	LagBytes      *int64   `json:"lag_bytes"`
	RetainedBytes *int64   `json:"retained_wal_bytes"`
	LagSeconds    *float64 `json:"lag_seconds"`
	// TimeToInvalidation is null when unknown (no limit, no rate yet) or
	// infinite (no WAL being written).
	TimeToInvalidation *float64       `json:"time_to_invalidation_seconds"`
	Invalidated        bool           `json:"invalidated"`
	InvalidationCause  string         `json:"invalidation_cause,omitempty"`
	Alerts             []alert.Status `json:"alerts,omitempty"`
}

// SlotsView is the /slots document.
func SlotsView(reports []watch.Report, alerts []alert.Status) []ServerView {
	out := make([]ServerView, 0, len(reports))
	for _, r := range reports {
		sv := ServerView{Report: r, Slots: []SlotView{}}
		if r.WALRateOK {
			sv.WALRate = &r.WALRate
		}
		for _, a := range alerts {
			if a.Labels["server"] == r.Server && a.Labels["slot"] == "" {
				sv.Alerts = append(sv.Alerts, a)
			}
		}
		for _, s := range r.Slots {
			v := SlotView{SlotReport: s}
			if s.LagBytesOK {
				v.LagBytes = &s.LagBytes
			}
			if s.RetainedOK {
				v.RetainedBytes = &s.RetainedBytes
			}
			if s.LagSecondsOK {
				v.LagSeconds = &s.LagSeconds
			}
			if s.TimeToInvalidationOK && !math.IsInf(s.TimeToInvalidation, 0) {
				v.TimeToInvalidation = &s.TimeToInvalidation
			}
			v.Invalidated, v.InvalidationCause = s.Invalidated()
			for _, a := range alerts {
				if a.Labels["server"] == r.Server && a.Labels["slot"] == s.Name {
					v.Alerts = append(v.Alerts, a)
				}
			}
			sv.Slots = append(sv.Slots, v)
		}
		out = append(out, sv)
	}
	return out
}
