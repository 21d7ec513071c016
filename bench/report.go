package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/bench/chart"
)

// settingsJSON is how Settings read in run.json: durations as Go strings.
type settingsJSON struct {
	Events                  int    `json:"events"`
	TxSizes                 []int  `json:"tx_sizes"`
	Repeats                 int    `json:"repeats"`
	Rates                   []int  `json:"rates_events_per_sec"`
	PerTx                   []int  `json:"events_per_tx"`
	Warmup                  string `json:"warmup"`
	Measure                 string `json:"measure"`
	Writers                 int    `json:"writers"`
	ConnectorStatusInterval string `json:"connector_status_interval"`
	Debezium                bool   `json:"debezium"`
	Profile                 bool   `json:"profile"`
	Only                    string `json:"only"`
}

// MarshalJSON writes the settings readably (durations as Go strings).
func (s Settings) MarshalJSON() ([]byte, error) {
	return jsonMarshal(settingsJSON{s.Events, s.TxSizes, s.Repeats, s.Rates, s.PerTx, s.Warmup.String(), s.Measure.String(),
		s.Writers, s.StatusInterval.String(), s.Debezium, s.Profile, s.only})
}

// UnmarshalJSON reads what MarshalJSON wrote (to re-render a report).
func (s *Settings) UnmarshalJSON(b []byte) error {
	var in settingsJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	s.Events, s.TxSizes, s.Repeats, s.Rates, s.PerTx = in.Events, in.TxSizes, in.Repeats, in.Rates, in.PerTx
	s.Warmup, _ = time.ParseDuration(in.Warmup)
	s.Measure, _ = time.ParseDuration(in.Measure)
	s.StatusInterval, _ = time.ParseDuration(in.ConnectorStatusInterval)
	s.Writers, s.Debezium, s.Profile, s.only = in.Writers, in.Debezium, in.Profile, in.Only
	return nil
}

func findSummary(res *Results, system string, tx int) *DrainSummary {
	for i := range res.DrainSummary {
		s := &res.DrainSummary[i]
		if s.System == system && s.TxSize == tx && s.Runs > 0 {
			return s
		}
	}
	return nil
}

func findLatency(res *Results, system string, rate int) *LatencyRun {
	for i := range res.Latency {
		l := &res.Latency[i]
		if l.System == system && l.Rate == rate && l.CommitToConsumer.Count > 0 {
			return l
		}
	}
	return nil
}

// systems lists the measured systems in report order.
func systems(res *Results) []string {
	out := []string{sysRecv}
	for _, v := range res.Variants {
		out = append(out, v.Name)
	}
	return append(out, sysDebezium)
}

func connectorSystems(res *Results) []string {
	var out []string
	for _, v := range res.Variants {
		out = append(out, v.Name)
	}
	return out
}

func boolp(v bool) *bool { return &v }

// alsoVariants says how the other connector variants fare on a goal.
func alsoVariants(res *Results, f func(sys string) string) string {
	var parts []string
	for _, v := range res.Variants[min(1, len(res.Variants)):] {
		if m := f(v.Name); m != "" {
			parts = append(parts, v.Name+": "+m)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " — " + strings.Join(parts, "; ")
}

// goals compares the run with the goals. The verdict is the
// connector's defaults'; other variants are shown beside it.
func goals(res *Results) []Goal {
	var out []Goal
	for _, tx := range res.Settings.TxSizes {
		g := Goal{Name: fmt.Sprintf("drain rate, transactions of %d", tx), Target: ">= 0.9x pg_recvlogical"}
		ratio := func(sys string) (float64, string) {
			c, r := findSummary(res, sys, tx), findSummary(res, sysRecv, tx)
			if c == nil || r == nil {
				return 0, ""
			}
			x := c.EventsPerSec / r.EventsPerSec
			return x, fmt.Sprintf("%.2fx (%.0f vs %.0f events/s)", x, c.EventsPerSec, r.EventsPerSec)
		}
		if x, m := ratio(sysConnector); m != "" {
			g.Measured = m + alsoVariants(res, func(s string) string { _, m := ratio(s); return m })
			g.Met = boolp(x >= 0.9)
		} else {
			g.Measured = "not measured"
		}
		out = append(out, g)
	}
	for _, tx := range res.Settings.TxSizes {
		g := Goal{Name: fmt.Sprintf("drain rate vs Debezium Server, transactions of %d", tx), Target: ">= 5x"}
		ratio := func(sys string) (float64, string) {
			c, d := findSummary(res, sys, tx), findSummary(res, sysDebezium, tx)
			if c == nil || d == nil {
				return 0, ""
			}
			x := c.EventsPerSec / d.EventsPerSec
			m := fmt.Sprintf("%.1fx (%.0f vs %.0f events/s", x, c.EventsPerSec, d.EventsPerSec)
			if c.SteadyPerSec > 0 && d.SteadyPerSec > 0 {
				m += fmt.Sprintf("; without start-up, first to last event in Kafka: %.1fx, %.0f vs %.0f", c.SteadyPerSec/d.SteadyPerSec, c.SteadyPerSec, d.SteadyPerSec)
			}
			return x, m + ")"
		}
		if x, m := ratio(sysConnector); m != "" {
			g.Measured = m + alsoVariants(res, func(s string) string { _, m := ratio(s); return m })
			g.Met = boolp(x >= 5)
		} else {
			g.Measured = "not measured (Debezium Server did not run)"
		}
		out = append(out, g)
	}
	for _, tx := range res.Settings.TxSizes {
		g := Goal{Name: fmt.Sprintf("CPU per event vs Debezium Server (drain, transactions of %d)", tx), Target: "<= 1/5"}
		// Steady state: the JVM's start-up is not held against Debezium.
		ratio := func(sys string) (float64, string) {
			c, d := findSummary(res, sys, tx), findSummary(res, sysDebezium, tx)
			if c == nil || d == nil || d.SteadyCPU <= 0 || c.SteadyCPU <= 0 {
				return 0, ""
			}
			x := c.SteadyCPU / d.SteadyCPU
			return x, fmt.Sprintf("1/%.1f (%.2f vs %.2f CPU s per 100k events after the first event; with start-up %.2f vs %.2f)",
				1/x, c.SteadyCPU, d.SteadyCPU, c.CPUPer100k, d.CPUPer100k)
		}
		if x, m := ratio(sysConnector); m != "" {
			g.Measured = m + alsoVariants(res, func(s string) string { _, m := ratio(s); return m })
			g.Met = boolp(x <= 0.2)
		} else {
			g.Measured = "not measured (Debezium Server did not run)"
		}
		out = append(out, g)
	}
	{
		g := Goal{Name: "commit-to-ack p99 at 5,000 events/s", Target: "< 10 ms"}
		measure := func(sys string) (*bool, string) {
			l := findLatency(res, sys, 5000)
			if l == nil {
				return nil, ""
			}
			if h := l.ConnectorHistogram; h != nil && h.Within10ms != nil {
				return boolp(*h.Within10ms >= 0.99), fmt.Sprintf("%.1f%% of events acked within 10 ms (the connector's histogram; p99 ≈ %.1f ms); commit→consumer p99 %.1f ms",
					*h.Within10ms*100, h.P99, l.CommitToConsumer.P99)
			}
			return boolp(l.CommitToConsumer.P99 < 10), fmt.Sprintf("commit→consumer p99 %.1f ms", l.CommitToConsumer.P99)
		}
		if met, m := measure(sysConnector); m != "" {
			g.Measured = m + alsoVariants(res, func(s string) string { _, m := measure(s); return m })
			if l := findLatency(res, sysFloor, 5000); l != nil {
				g.Measured += fmt.Sprintf(" — floor (bare relay) on this machine: commit→in Kafka p99 %.1f ms, commit→consumer p99 %.1f ms", l.CommitToAck.P99, l.CommitToConsumer.P99)
			}
			g.Met = met
		} else {
			g.Measured = "not measured"
		}
		out = append(out, g)
	}
	{
		// What exactly-once costs in latency: the default (Kafka
		// transactions carrying the position) against the idempotent
		// producer, end to end, in the same run.
		g := Goal{Name: "exactly-once latency cost: commit→consumer p99 at 5,000 events/s, default vs idempotent", Target: "<= 3x"}
		c, i := findLatency(res, sysConnector, 5000), findLatency(res, sysConnectorIdem, 5000)
		if c != nil && i != nil && i.CommitToConsumer.P99 > 0 {
			x := c.CommitToConsumer.P99 / i.CommitToConsumer.P99
			g.Measured = fmt.Sprintf("%.1fx (p99 %.1f vs %.1f ms; p50 %.1f vs %.1f ms)", x, c.CommitToConsumer.P99, i.CommitToConsumer.P99, c.CommitToConsumer.P50, i.CommitToConsumer.P50)
			g.Met = boolp(x <= 3)
		} else {
			g.Measured = "not measured"
		}
		out = append(out, g)
	}
	{
		g := Goal{Name: "connector peak RSS during the drain", Target: "< 64 MiB"}
		peakOf := func(sys string) int64 {
			var peak int64
			for _, d := range res.Drains {
				if d.System == sys && d.Error == "" {
					peak = max(peak, d.PeakRSSBytes)
				}
			}
			return peak
		}
		if peak := peakOf(sysConnector); peak > 0 {
			g.Measured = mib(peak) + alsoVariants(res, func(s string) string {
				if p := peakOf(s); p > 0 {
					return mib(p)
				}
				return ""
			})
			g.Met = boolp(peak < 64<<20)
		} else {
			g.Measured = "not measured"
		}
		out = append(out, g)
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func (b *bench) write() error {
	res := &b.res
	for name, v := range map[string]any{
		"drain.json":   map[string]any{"summary": res.DrainSummary, "runs": res.Drains},
		"latency.json": res.Latency,
		"profile.json": res.Profiles,
		"poll.json":    map[string]any{"levels": res.Poll, "idle": res.PollIdle},
		"run.json":     res,
	} {
		if err := writeJSON(b.out, name, v); err != nil {
			return err
		}
	}
	charts, err := b.charts()
	if err != nil {
		return err
	}
	report := b.markdown(charts)
	return os.WriteFile(abs(b.root, b.cfg.Report), []byte(report), 0o644)
}

func (b *bench) charts() (map[string]string, error) {
	res := &b.res
	out := map[string]string{}
	rel := func(name string) string {
		r, err := filepath.Rel(filepath.Dir(abs(b.root, b.cfg.Report)), filepath.Join(b.out, name))
		if err != nil {
			return filepath.Join(b.out, name)
		}
		return r
	}
	nan := math.NaN()
	orNaN := func(v float64) float64 {
		if v <= 0 {
			return nan
		}
		return v
	}
	save := func(key string, c *chart.Bars) error {
		name := key + ".png"
		if err := c.WriteFile(filepath.Join(b.out, name)); err != nil {
			return err
		}
		out[key] = rel(name)
		return nil
	}
	if err := b.pollCharts(save); err != nil {
		return nil, err
	}
	// Drain throughput.
	{
		c := &chart.Bars{Title: "Backlog drain: events per second (median of the runs)", YLabel: "events/s",
			Format: func(v float64) string { return fmt.Sprintf("%.0f", v) }}
		for _, tx := range res.Settings.TxSizes {
			c.Groups = append(c.Groups, fmt.Sprintf("%d event(s)/tx", tx))
		}
		for _, sys := range systems(res) {
			s := chart.Series{Name: sys}
			for _, tx := range res.Settings.TxSizes {
				if d := findSummary(res, sys, tx); d != nil {
					s.Values = append(s.Values, d.EventsPerSec)
				} else {
					s.Values = append(s.Values, nan)
				}
			}
			c.Series = append(c.Series, s)
		}
		if err := save("drain", c); err != nil {
			return nil, err
		}
	}
	// Latency percentiles per rate.
	latSystems := append(append([]string{sysFloor}, connectorSystems(res)...), sysDebezium)
	for _, kind := range []string{"ack", "consumer"} {
		title := "Commit to record in Kafka (broker append time), ms, log scale"
		if kind == "consumer" {
			title = "Commit to consumer (read_committed), ms, log scale"
		}
		c := &chart.Bars{Title: title, YLabel: "milliseconds", LogY: true, Format: fmtMS, Width: 1400, Height: 600,
			Lines: []chart.Line{{Value: 10, Label: "10 ms"}}}
		type pq struct {
			rate int
			q    string
		}
		var groups []pq
		for i, rate := range res.Settings.Rates {
			for _, q := range []string{"p50", "p99", "p99.9"} {
				groups = append(groups, pq{rate, q})
				c.Groups = append(c.Groups, fmt.Sprintf("%d/s %s", rate, q))
				_ = i
			}
		}
		for _, sys := range latSystems {
			s := chart.Series{Name: sys}
			for _, g := range groups {
				l := findLatency(res, sys, g.rate)
				if l == nil {
					s.Values = append(s.Values, nan)
					continue
				}
				p := l.CommitToAck
				if kind == "consumer" {
					p = l.CommitToConsumer
				}
				if p.Count == 0 {
					s.Values = append(s.Values, nan)
					continue
				}
				v := map[string]float64{"p50": p.P50, "p99": p.P99, "p99.9": p.P999}[g.q]
				s.Values = append(s.Values, math.Max(v, 0.1))
			}
			c.Series = append(c.Series, s)
		}
		if err := save("latency_"+kind, c); err != nil {
			return nil, err
		}
	}
	// Cost: CPU seconds per 100k events.
	{
		c := &chart.Bars{Title: "CPU seconds per 100,000 events (the process alone), log scale", YLabel: "CPU seconds", LogY: true, Width: 1200,
			Format: func(v float64) string { return fmt.Sprintf("%.2f", v) }}
		for _, tx := range res.Settings.TxSizes {
			c.Groups = append(c.Groups, fmt.Sprintf("drain %d/tx", tx))
		}
		for _, rate := range res.Settings.Rates {
			c.Groups = append(c.Groups, fmt.Sprintf("%d/s", rate))
		}
		for _, sys := range systems(res) {
			s := chart.Series{Name: sys}
			for _, tx := range res.Settings.TxSizes {
				if d := findSummary(res, sys, tx); d != nil {
					s.Values = append(s.Values, orNaN(d.CPUPer100k))
				} else {
					s.Values = append(s.Values, nan)
				}
			}
			for _, rate := range res.Settings.Rates {
				if l := findLatency(res, sys, rate); l != nil {
					s.Values = append(s.Values, orNaN(l.CPUPer100k))
				} else {
					s.Values = append(s.Values, nan)
				}
			}
			c.Series = append(c.Series, s)
		}
		if err := save("cost_cpu", c); err != nil {
			return nil, err
		}
	}
	// Cost: peak RSS.
	{
		c := &chart.Bars{Title: "Peak RSS (VmHWM), MiB, log scale", YLabel: "MiB", LogY: true,
			Format: func(v float64) string { return fmt.Sprintf("%.0f", v) },
			Lines:  []chart.Line{{Value: 64, Label: "goal < 64 MiB (drain)"}}}
		c.Groups = []string{"drain", "latency"}
		for _, sys := range systems(res) {
			drain, lat := peakRSS(res, sys)
			c.Series = append(c.Series, chart.Series{Name: sys, Values: []float64{orNaN(float64(drain) / (1 << 20)), orNaN(float64(lat) / (1 << 20))}})
		}
		if err := save("cost_rss", c); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func peakRSS(res *Results, sys string) (drain, lat int64) {
	for _, d := range res.Drains {
		if d.System == sys && d.Error == "" {
			drain = max(drain, d.PeakRSSBytes)
		}
	}
	for _, l := range res.Latency {
		if l.System == sys && l.CommitToConsumer.Count > 0 {
			lat = max(lat, l.PeakRSSBytes)
		}
	}
	return drain, lat
}

func (b *bench) markdown(charts map[string]string) string {
	res := &b.res
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	took := res.FinishedAt.Sub(res.StartedAt).Round(time.Second)
	s := res.Settings
	m := res.Machine
	p("# Benchmark report\n\n")
	p("Written by `make bench` (`go run ./bench`) on %s; the run took %s. Every number below was measured in that run, side by side on the same machine; the raw results are in `bench/results/` (`run.json` holds everything, `drain.json`, `latency.json`, `poll.json` and `profile.json` its parts). Regenerate with `make bench`; `go run ./bench -help` lists the settings.\n\n",
		res.FinishedAt.Format("2006-01-02 15:04 MST"), took)

	p("## Goals\n\n| goal | target | this run | met |\n| --- | --- | --- | --- |\n")
	for _, g := range res.Goals {
		met := "n/a"
		if g.Met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*g.Met]
		}
		p("| %s | %s | %s | %s |\n", g.Name, g.Target, g.Measured, met)
	}
	p("\nThe verdict is the connector's defaults' (`%s`)", sysConnector)
	if len(res.Variants) > 1 {
		p("; the other connector configurations measured are shown after a dash")
	}
	p(". Summary of what limits each goal: see [Findings](#findings).\n\n")

	p("## Machine, versions, settings\n\n")
	p("- Machine: %d CPUs (%s), %.1f GiB RAM, %s, kernel %s. Load average %s at the start, %s at the end: the machine is shared with other work, so absolute figures are noisy; the side-by-side ratios are the point.\n",
		m.CPUs, m.CPUModel, float64(m.MemBytes)/(1<<30), m.OS, m.Kernel, m.LoadAvg, m.LoadEnd)
	keys := make([]string, 0, len(res.Versions))
	for k := range res.Versions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	p("- Versions:\n")
	for _, k := range keys {
		p("  - %s: %s\n", k, res.Versions[k])
	}
	p("- Connector source: %s\n", res.Source)
	p("- PostgreSQL: a throwaway cluster (initdb), `fsync=on`, `synchronous_commit=on`, `full_page_writes=on`, `wal_level=logical`, `shared_buffers=128MB`, otherwise the defaults. Output plugin `pgoutput`, `proto_version=1`, publication `outbox_pub` (inserts into `public.outbox`).\n")
	p("- Kafka: one KRaft node (broker and controller) started by `scripts/kafka.sh` (heap 768 MiB); topics created by the bench with %d partitions and `message.timestamp.type=LogAppendTime`.\n", topicPartitions)
	p("- Connector: the binary built from the source above without `-race`, run as a child process with `OUTBOX_STATUS_INTERVAL=%s` (see Method) and otherwise these configurations:\n", s.StatusInterval)
	for _, v := range res.Variants {
		p("  - `%s`: %s\n", v.Name, v.Note)
	}
	p("- Debezium Server: see [its section](#debezium-server).\n")
	p("- Events: %d per drain backlog; the payload is an order of about 330 bytes of JSON (`bench_payload` in `bench/env.go`), in rows of the Debezium-compatible outbox table.\n", s.Events)
	p("- Drains: %d repeats each for pg_recvlogical and each connector configuration, interleaved, the median reported; then a profiled drain per configuration and one Debezium Server drain. Latency: %s warm-up then %s measured per level, %d writer connections.\n\n", s.Repeats, s.Warmup, s.Measure, s.Writers)
	for _, n := range res.Notes {
		p("> Note: %s\n\n", n)
	}

	p("## 1. Backlog drain\n\n")
	p("%d outbox events already in the WAL, in transactions of %s events, drained from slots created before the writes: every reader decodes exactly the same WAL. pg_recvlogical is PostgreSQL's decoder and walsender alone, writing to /dev/null: the ceiling. A relay is done when every event is in Kafka (the topic's end offsets) and its slot's `confirmed_flush_lsn` reached the backlog's end. Times include the process start.\n\n", s.Events, joinInts(s.TxSizes, " and "))
	p("| system | events/tx | events/s (median) | min–max | vs pg_recvlogical | CPU s per 100k events | same, after the first event | CPU use (CPU s / wall s) | walsender CPU s per 100k | peak RSS | runs |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var drainSystems []string
	for _, sys := range systems(res) {
		drainSystems = append(drainSystems, sys)
		if sys != sysRecv && sys != sysDebezium {
			drainSystems = append(drainSystems, sys+profiledSuffix)
		}
	}
	for _, tx := range s.TxSizes {
		recv := findSummary(res, sysRecv, tx)
		for _, sys := range drainSystems {
			d := findSummary(res, sys, tx)
			if d == nil {
				if e := summaryError(res, sys, tx); e != "" {
					p("| %s | %d | failed: %s | | | | | | | | 0 |\n", sys, tx, oneLine(e, 300))
				}
				continue
			}
			ratio := "—"
			if recv != nil && sys != sysRecv {
				ratio = fmt.Sprintf("%.2fx", d.EventsPerSec/recv.EventsPerSec)
			}
			p("| %s | %d | %.0f | %.0f–%.0f | %s | %.2f | %s | %.2f | %.2f | %s | %d |\n", sys, tx, d.EventsPerSec, d.MinPerSec, d.MaxPerSec, ratio,
				d.CPUPer100k, dash(d.SteadyCPU), d.CPUUtil, d.WalsenderCPU, mib(d.PeakRSSBytes), d.Runs)
		}
	}
	p("\n![drain throughput](%s)\n\n", charts["drain"])
	p("<details><summary>Every drain run</summary>\n\n| system | events/tx | repeat | seconds | events/s | first event s | in Kafka s | confirmed s | steady events/s | CPU s | walsender CPU s | broker CPU s | peak RSS | WAL bytes | slot confirmed at the end | Kafka transactions (events each; time committing) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, d := range res.Drains {
		if d.Error != "" {
			p("| %s | %d | %d | failed: %s | | | | | | | | | | | | |\n", d.System, d.TxSize, d.Repeat, oneLine(d.Error, 300))
			continue
		}
		conf := "—"
		if d.System != sysRecv {
			conf = "not within 10 s"
			if d.Confirmed {
				conf = fmt.Sprintf("%.2f", d.ConfirmedSeconds)
			}
		}
		txns := "—"
		if d.KafkaTxns > 0 {
			txns = fmt.Sprintf("%.0f (%.1f; %.2f s)", d.KafkaTxns, float64(d.Events)/d.KafkaTxns, d.KafkaTxnCommitSeconds)
		}
		p("| %s | %d | %d | %.2f | %.0f | %s | %s | %s | %s | %.2f | %.2f | %.2f | %s | %d | %s (end %s) | %s |\n", d.System, d.TxSize, d.Repeat, d.Seconds, d.EventsPerSec,
			dash(d.FirstEventSeconds), dash(d.KafkaSeconds), conf, dash0(d.SteadyEventsPerSec), d.CPUSeconds, d.WalsenderCPUSeconds, d.BrokerCPUSeconds, mib(d.PeakRSSBytes), d.WALBytes,
			orDash(d.ConfirmedLSN), d.EndLSN, txns)
	}
	p("\n</details>\n\n")

	p("## 2. Latency under load\n\n")
	p("Steady load written by %d connections, open loop: a dispatcher hands out one transaction slot per 1/(transactions per second), the writers take them (a slot started more than 5 ms late is counted). Each transaction is one `INSERT … SELECT` of k events, so its statement and its COMMIT travel in one round trip; every event's payload carries the writer's clock read just before it was sent (`bench_t`). PostgreSQL on this machine commits on the order of 2,000 single-row transactions/s with fsync on (the issue's figure; the COMMIT column shows what the writers saw), so every level keeps 1,000 transactions/s and puts more events in each; k is the same for every system:\n\n", s.Writers)
	p("| level | events/s | events per transaction | transactions/s |\n| --- | ---: | ---: | ---: |\n")
	for i, rate := range s.Rates {
		p("| %d | %d | %d | %.0f |\n", i+1, rate, s.PerTx[i], float64(rate)/float64(s.PerTx[i]))
	}
	p("\n- **commit → in Kafka**: the record's broker append time (`LogAppendTime`: millisecond precision, truncated, so up to 1 ms low) minus `bench_t`. For a producer without transactions the acknowledgement leaves right after the append (acks=all, one broker): this is commit-to-ack, measured the same way for every system. For a transactional producer the records count as acknowledged only when their Kafka transaction commits, later.\n")
	p("- **commit → consumer**: when a franz-go consumer in the bench process (isolation `read_committed`, as an application relying on transactions reads) got the record, minus `bench_t`: the end-to-end figure, an upper bound of commit-to-ack for every system.\n")
	p("- **own view**: for the connector, its `outbox_connector_commit_to_ack_seconds` histogram (PostgreSQL's commit timestamp to the acknowledgement the connector waits for; quantiles interpolated in its buckets 1, 2.5, 5, 10, 25 ms …; the share within 10 ms is exact); for the bare relay, when its pgoutput reader got the change: PostgreSQL's own delivery.\n")
	p("- **%s** is the floor on this machine: a minimal relay in the bench process that reads pgoutput with pglogrepl and produces every inserted tuple as it is with franz-go and the connector's producer settings (acks=all, idempotent, lz4, linger 0), measured the same way. What a relay adds is its latency minus the floor's.\n", sysFloor)
	p("- All clocks are the same machine's: no skew. The writers and the consumer share the %d CPUs with the systems under test.\n\n", m.CPUs)
	p("| system | events/s | /tx | achieved events/s | late tx starts | received / sent | commit→in Kafka p50 / p99 / p99.9 (ms) | commit→consumer p50 / p99 / p99.9 (ms) | own view p50 / p99 (ms) | COMMIT p50 / p99 (ms) | CPU s per 100k | peak RSS |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, l := range res.Latency {
		if l.CommitToConsumer.Count == 0 {
			p("| %s | %d | %d | failed: %s | | | | | | | | |\n", l.System, l.Rate, l.EventsPerTx, oneLine(l.Error, 300))
			continue
		}
		own := "—"
		if h := l.ConnectorHistogram; h != nil {
			own = fmt.Sprintf("%.1f / %.1f (histogram", h.P50, h.P99)
			if h.Within10ms != nil {
				own += fmt.Sprintf("; %.1f%% ≤ 10 ms", *h.Within10ms*100)
			}
			own += ")"
		}
		if l.CommitToReceived != nil {
			own = fmt.Sprintf("%.1f / %.1f (change received)", l.CommitToReceived.P50, l.CommitToReceived.P99)
		}
		cpu, rss := "—", "—"
		if l.System != sysFloor {
			cpu, rss = fmt.Sprintf("%.2f", l.CPUPer100k), mib(l.PeakRSSBytes)
		}
		p("| %s | %d | %d | %.0f | %d | %d / %d | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | %s | %.1f / %.1f | %s | %s |\n",
			l.System, l.Rate, l.EventsPerTx, l.AchievedRate, l.LateStarts, l.Received, l.Sent,
			l.CommitToAck.P50, l.CommitToAck.P99, l.CommitToAck.P999,
			l.CommitToConsumer.P50, l.CommitToConsumer.P99, l.CommitToConsumer.P999,
			own, l.CommitDuration.P50, l.CommitDuration.P99, cpu, rss)
	}
	for _, l := range res.Latency {
		if l.Error != "" && l.CommitToConsumer.Count > 0 {
			p("\n> %s at %d events/s: %s\n", l.System, l.Rate, oneLine(l.Error, 400))
		}
	}
	p("\n![commit to record in Kafka](%s)\n\n![commit to consumer](%s)\n\n", charts["latency_ack"], charts["latency_consumer"])

	p("## 3. Cost\n\n")
	p("CPU is the process's user+system time (`/proc/<pid>/stat`, all threads; pg_recvlogical's from its rusage), over a drain from the process start to done, or over a latency level's measured window. PostgreSQL's walsender (the decoding, the same work for every reader of a slot) is reported apart in the drain table. Peak RSS is `VmHWM` (for the JVM, with its default heap sizing).\n\n")
	p("| system | ")
	for _, tx := range s.TxSizes {
		p("drain %d/tx: CPU s per 100k | ", tx)
	}
	for _, rate := range s.Rates {
		p("%d/s: CPU s per 100k | ", rate)
	}
	p("peak RSS, drain | peak RSS, latency |\n|---|")
	for range len(s.TxSizes) + len(s.Rates) + 2 {
		p("---:|")
	}
	p("\n")
	for _, sys := range systems(res) {
		p("| %s | ", sys)
		for _, tx := range s.TxSizes {
			if d := findSummary(res, sys, tx); d != nil {
				p("%.2f (after the first event: %s) | ", d.CPUPer100k, dash(d.SteadyCPU))
			} else {
				p("— | ")
			}
		}
		for _, rate := range s.Rates {
			if l := findLatency(res, sys, rate); l != nil {
				p("%.2f | ", l.CPUPer100k)
			} else {
				p("— | ")
			}
		}
		drain, lat := peakRSS(res, sys)
		p("%s | %s |\n", mibOrDash(drain), mibOrDash(lat))
	}
	p("\n![CPU per 100k events](%s)\n\n![peak RSS](%s)\n\n", charts["cost_cpu"], charts["cost_rss"])

	p("## 4. Profiles of connector drains\n\n")
	if len(res.Profiles) == 0 {
		p("Not run.\n\n")
	}
	for i, pr := range res.Profiles {
		p("### %s, transactions of %d\n\n", pr.Variant, pr.TxSize)
		if pr.Error != "" {
			p("Failed: %s\n\n", oneLine(pr.Error, 600))
			continue
		}
		p("`bench/pprofrelay` (the same `relay` with a CPU profile from the start to the end of the drain) drained the backlog at %.0f events/s using %.2f CPU s over %.2f s (%.0f%% of one CPU). Allocations over the process's life per event published: **%.1f allocations, %.0f bytes**. Profiles: `bench/results/%s`, `bench/results/%s` (`go tool pprof -top …`).\n\n",
			pr.Drain.EventsPerSec, pr.Drain.CPUSeconds, pr.Drain.Seconds, 100*pr.Drain.CPUSeconds/pr.Drain.Seconds, pr.AllocsPerEv, pr.BytesPerEv, pr.CPUProfile, pr.HeapProfile)
		open := ""
		if i == 0 {
			open = " open"
		}
		p("<details%s><summary>CPU, flat</summary>\n\n```\n%s\n```\n</details>\n\n", open, pr.TopCPU)
		p("<details><summary>CPU, cumulative</summary>\n\n```\n%s\n```\n</details>\n\n", pr.TopCPUCum)
		p("<details><summary>Allocated bytes</summary>\n\n```\n%s\n```\n</details>\n\n", pr.TopAlloc)
		p("<details><summary>Allocated objects</summary>\n\n```\n%s\n```\n</details>\n\n", pr.TopAllocObj)
	}
	p("### Hot paths, `go test -bench`\n\n`go test -run '^$' -bench . -benchmem -benchtime 500ms ./relay/wal ./relay/tracker ./route`, run by the bench at the end (same machine, same load):\n\n")
	if len(res.Micro) == 0 {
		p("Not run.\n\n")
	} else {
		p("| package | benchmark | ns/op | MB/s | B/op | allocs/op |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
		for _, m := range res.Micro {
			p("| %s | %s | %.0f | %s | %.0f | %.0f |\n", m.Package, m.Name, m.NsPerOp, dash0(m.MBPerSec), m.BytesOp, m.AllocsOp)
		}
		p("\n")
	}

	b.pollMarkdown(&w, charts)
	p("## Debezium Server\n\n")
	d := res.Debezium
	switch {
	case !d.Enabled:
		p("Disabled in this run (`BENCH_DEBEZIUM=false`).\n\n")
	case d.Error != "" && !d.Ran:
		p("**Did not run.** %s\n\n", d.Error)
	default:
		p("Debezium Server %s (`io.debezium:debezium-server-dist`, the tar.gz from Maven Central, resolved by `bench/debezium/install.sh` into `~/.cache/pgoutbox`, without its optional connectors), run with %s as `java -cp <runner jar>:config/lib:lib/* io.debezium.server.Main` (the distribution's `run.sh` without JMX and agents) and the JVM's default heap. Source: the PostgreSQL connector with `pgoutput` on a slot created before the writes, `snapshot.mode=no_data`; transform: the outbox `EventRouter` with its defaults (topic `outbox.event.<aggregatetype>`, key `aggregateid`, value the payload); sink: Kafka, the producer given acks=all, idempotence and lz4 like the connector's. Everything else is Debezium's default, notably `max.batch.size=2048`, `max.queue.size=8192`, `poll.interval.ms=500`, the Kafka client's `linger.ms=5`, and `offset.flush.interval.ms=0`.\n\n", d.Version, d.Java)
		if d.Error != "" {
			p("> A Debezium Server run failed: %s\n\n", oneLine(d.Error, 600))
		}
		if d.Config != "" {
			p("<details><summary>application.properties (the last run's)</summary>\n\n```properties\n%s```\n</details>\n\n", d.Config)
		}
	}

	p("## Published figures, for context\n\n")
	p("Measured elsewhere, on other machines and workloads: not comparable in absolute terms, which is why this bench measures ratios on one machine.\n\n")
	p("| system | published |\n| --- | --- |\n")
	p("| Debezium Server | ~20–23k events/s, p99 ~440 ms, 16 vCPU |\n| Debezium on Kafka Connect | 6k events/s, p99 ~500 ms |\n| Sequin | 50k events/s, p99 253 ms |\n| Trendyol go-pq-cdc-kafka (Go) | 10 M inserts in 2.5 min (~67k/s), 130 MB; Debezium 21 min, 1.07 GB |\n\n")
	var this []string
	for _, sys := range append(connectorSystems(res), sysDebezium) {
		for _, tx := range s.TxSizes {
			if d := findSummary(res, sys, tx); d != nil {
				this = append(this, fmt.Sprintf("%s %.0f events/s (%d/tx)", sys, d.EventsPerSec, tx))
			}
		}
	}
	if len(this) > 0 {
		p("This run, on %d shared CPUs: %s.\n\n", m.CPUs, strings.Join(this, ", "))
	}

	p("## Method and caveats\n\n")
	p("- The backlog is written by one server-side `DO` loop that commits every k events with `synchronous_commit=off` for that session only, so that 200,000 single-event transactions take seconds rather than minutes; the WAL the readers decode is the same as with synchronous commits (one commit record per transaction). The readers start once that WAL is flushed and a CHECKPOINT is done.\n")
	p("- The connector runs as the built binary in a child process. `OUTBOX_STATUS_INTERVAL=%s`: the connector writes its state row and sends a status update at most once per interval, so with the default (1s) a drain of a few seconds would carry up to 2 s of confirmation delay that says nothing about throughput; the \"in Kafka\" column of the run table shows each drain without the confirmation.\n", s.StatusInterval)
	p("- Debezium confirms an LSN to PostgreSQL when it commits offsets, and it confirms the last event's LSN rather than the commit's end: when its slot's confirmed position did not reach the backlog's end within 10 s of the last event reaching Kafka, its drain time is the time to the last event in Kafka (the run table shows the position it did confirm).\n")
	p("- The CPU-per-event goal compares CPU after the first event reached Kafka (steady state), so that the JVM's start-up is not held against Debezium Server; the table shows both.\n")
	p("- Everything (PostgreSQL, Kafka, the system under test, the writers and the consumer) shares %d CPUs, with other work on the machine; the load average is above. Latency tails in particular move with that load: compare each system with the floor measured in the same run.\n", m.CPUs)
	p("\n## Findings\n\n%s\n", findings(res))
	return w.String()
}

// fmtMS labels a latency bar.
func fmtMS(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func joinInts(v []int, sep string) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = fmt.Sprint(n)
	}
	return strings.Join(parts, sep)
}

func summaryError(res *Results, sys string, tx int) string {
	for _, s := range res.DrainSummary {
		if s.System == sys && s.TxSize == tx {
			return s.Error
		}
	}
	return ""
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func dash(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", v)
}

func dash0(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", v)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func mibOrDash(b int64) string {
	if b == 0 {
		return "—"
	}
	return mib(b)
}
