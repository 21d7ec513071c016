package main

import (
	"math"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/bench/chart"
)

func TestBenchT(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		want  int64
		ok    bool
	}{
		{"payload as stored", `{"items": [], "bench_t": 1764490000123456789, "orderId": 1}`, 1764490000123456789, true},
		{"json string (Debezium)", `"{\"bench_t\": 1764490000123456789, \"orderId\": 1}"`, 1764490000123456789, true},
		{"pgoutput tuple bytes", "I\x00\x00@\x01N\x00\x06t\x00\x00\x00\x10{\"bench_t\": 42}", 42, true},
		{"missing", `{"orderId": 1}`, 0, false},
		{"no digits", `{"bench_t": null}`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := benchT([]byte(tc.value))
			if got != tc.want || ok != tc.ok {
				t.Fatalf("benchT = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPercentiles(t *testing.T) {
	var s []float64
	for i := 1000; i >= 1; i-- {
		s = append(s, float64(i))
	}
	p := percentiles(s)
	if p.Count != 1000 || p.P50 != 500 || p.P99 != 990 || p.P999 != 999 || p.Max != 1000 || p.Mean != 500.5 {
		t.Fatalf("percentiles = %+v", p)
	}
	if got := percentiles(nil); got.Count != 0 {
		t.Fatalf("percentiles(nil) = %+v", got)
	}
}

func TestHistogramPercentiles(t *testing.T) {
	text := `# HELP x
outbox_connector_commit_to_ack_seconds_bucket{le="0.001"} 10
outbox_connector_commit_to_ack_seconds_bucket{le="0.005"} 50
outbox_connector_commit_to_ack_seconds_bucket{le="0.01"} 99
outbox_connector_commit_to_ack_seconds_bucket{le="+Inf"} 100
outbox_connector_commit_to_ack_seconds_sum 1
outbox_connector_commit_to_ack_seconds_count 100
`
	after, err := parseHistogram(strings.NewReader(text), "outbox_connector_commit_to_ack_seconds")
	if err != nil {
		t.Fatal(err)
	}
	before := map[float64]float64{}
	p := histogramPercentiles(before, after)
	if p.Count != 100 {
		t.Fatalf("count = %d", p.Count)
	}
	// 50 observations at or under 5 ms: the median is the 5 ms bound.
	if math.Abs(p.P50-5) > 1e-9 {
		t.Fatalf("p50 = %v ms; want 5", p.P50)
	}
	if p.Within10ms == nil || math.Abs(*p.Within10ms-0.99) > 1e-9 {
		t.Fatalf("within 10 ms = %v; want 0.99", p.Within10ms)
	}
	if p.P99 > 10 || p.P99 < 5 {
		t.Fatalf("p99 = %v ms; want in (5, 10]", p.P99)
	}
}

func TestSummarizeMedian(t *testing.T) {
	runs := []DrainRun{
		{System: sysRecv, TxSize: 1, Events: 100, Seconds: 1, EventsPerSec: 100, CPUSeconds: 0.5},
		{System: sysRecv, TxSize: 1, Events: 100, Seconds: 1, EventsPerSec: 300, CPUSeconds: 0.5},
		{System: sysRecv, TxSize: 1, Events: 100, Seconds: 1, EventsPerSec: 200, CPUSeconds: 0.5},
		{System: sysConnector, TxSize: 1, Error: "boom"},
	}
	s := summarize(runs)
	if len(s) != 2 || s[0].EventsPerSec != 200 || s[0].MinPerSec != 100 || s[0].MaxPerSec != 300 || s[0].Runs != 3 {
		t.Fatalf("summary = %+v", s)
	}
	if s[1].Runs != 0 || s[1].Error != "boom" {
		t.Fatalf("failed system = %+v", s[1])
	}
}

func TestChartRenders(t *testing.T) {
	c := &chart.Bars{Title: "Drain: events/s", YLabel: "events/s", Groups: []string{"1/tx", "100/tx"},
		Series: []chart.Series{{Name: "a", Values: []float64{1, 2}}, {Name: "b", Values: []float64{math.NaN(), 3}}}}
	if img := c.Render(); img.Bounds().Dx() != 1000 {
		t.Fatalf("width = %d", img.Bounds().Dx())
	}
	log := &chart.Bars{Title: "ms", LogY: true, Groups: []string{"x"}, Series: []chart.Series{{Name: "a", Values: []float64{0.5}}, {Name: "b", Values: []float64{2000}}}}
	log.Render()
	for _, s := range []string{"Backlog drain: events per second (median of the runs)", "Commit to consumer (read_committed), ms, log scale", "1000/s p99.9"} {
		if !chart.Supported(s) {
			t.Errorf("the chart font cannot draw %q", s)
		}
	}
}
