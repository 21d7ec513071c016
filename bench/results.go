package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// Systems, as the results name them.
const (
	sysRecv      = "pg_recvlogical"
	sysConnector = "connector"
	sysDebezium  = "debezium-server"
)

// profiledSuffix names a connector variant's profiled drains.
const profiledSuffix = " (pprof)"

// DrainRun is one backlog drain by one system.
type DrainRun struct {
	System   string `json:"system"`
	TxSize   int    `json:"tx_size"`
	Events   int    `json:"events"`
	Repeat   int    `json:"repeat"`
	Slot     string `json:"slot"`
	StartLSN string `json:"start_lsn"`
	EndLSN   string `json:"end_lsn"`
	WALBytes int64  `json:"wal_bytes"`
	// Seconds is from process start to done: pg_recvlogical's exit at
	// --endpos; for the relays, every event in Kafka and the slot's
	// confirmed_flush_lsn at the backlog's end (or, when a relay never
	// confirms that far, the last event in Kafka; see Confirmed).
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// KafkaSeconds is from process start to the last event in Kafka.
	KafkaSeconds float64 `json:"kafka_seconds,omitempty"`
	// ConfirmedSeconds is from process start to confirmed_flush_lsn >= end.
	ConfirmedSeconds float64 `json:"confirmed_seconds,omitempty"`
	Confirmed        bool    `json:"confirmed"`
	// FirstEventSeconds is from process start to the first event in Kafka
	// (start-up: connect, JVM, slot checks).
	FirstEventSeconds float64 `json:"first_event_seconds,omitempty"`
	// SteadyEventsPerSec is events / (last event - first event in Kafka).
	SteadyEventsPerSec float64 `json:"steady_events_per_sec,omitempty"`

	// KafkaTxns is how many Kafka transactions the connector ended during
	// the drain (its outbox_connector_kafka_transactions_total), and
	// KafkaTxnCommitSeconds the time it spent committing them (flush and
	// EndTxn); zero without transactions.
	KafkaTxns             float64 `json:"kafka_transactions,omitempty"`
	KafkaTxnCommitSeconds float64 `json:"kafka_transaction_commit_seconds,omitempty"`
	// ConfirmedLSN is the slot's confirmed_flush_lsn when the drain ended.
	ConfirmedLSN string `json:"confirmed_lsn,omitempty"`

	CPUSeconds float64 `json:"cpu_seconds"`
	CPUPer100k float64 `json:"cpu_seconds_per_100k_events"`
	// SteadyCPUPer100k is the CPU from the first event in Kafka to the end,
	// per 100k events: without start-up (the JVM's, say).
	SteadyCPUPer100k    float64 `json:"steady_cpu_seconds_per_100k_events,omitempty"`
	WalsenderCPUSeconds float64 `json:"walsender_cpu_seconds"`
	BrokerCPUSeconds    float64 `json:"broker_cpu_seconds,omitempty"`
	PeakRSSBytes        int64   `json:"peak_rss_bytes"`
	Error               string  `json:"error,omitempty"`
}

// DrainSummary is the median of a system's drains of one backlog.
type DrainSummary struct {
	System       string  `json:"system"`
	TxSize       int     `json:"tx_size"`
	Runs         int     `json:"runs"`
	EventsPerSec float64 `json:"events_per_sec"`
	MinPerSec    float64 `json:"min_events_per_sec"`
	MaxPerSec    float64 `json:"max_events_per_sec"`
	CPUPer100k   float64 `json:"cpu_seconds_per_100k_events"`
	SteadyCPU    float64 `json:"steady_cpu_seconds_per_100k_events"`
	// SteadyPerSec is the median of events / (last - first event in Kafka).
	SteadyPerSec float64 `json:"steady_events_per_sec,omitempty"`
	WalsenderCPU float64 `json:"walsender_cpu_seconds_per_100k_events"`
	BrokerCPU    float64 `json:"broker_cpu_seconds_per_100k_events"`
	CPUUtil      float64 `json:"cpu_utilization"` // CPU seconds per wall second
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	Error        string  `json:"error,omitempty"`
}

// Percentiles of a latency distribution, in milliseconds.
type Percentiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
	Mean  float64 `json:"mean_ms"`
	// Within10ms is, for a histogram, the exact share of observations at or
	// under 10 ms (a bucket bound).
	Within10ms *float64 `json:"share_within_10ms,omitempty"`
}

// LatencyRun is one system under one steady load.
type LatencyRun struct {
	System       string  `json:"system"`
	Rate         int     `json:"rate_events_per_sec"`
	EventsPerTx  int     `json:"events_per_tx"`
	TxPerSec     float64 `json:"tx_per_sec"`
	Seconds      float64 `json:"measured_seconds"`
	Sent         int     `json:"events_sent"`
	Received     int     `json:"events_received"`
	AchievedRate float64 `json:"achieved_events_per_sec"`
	LateStarts   int     `json:"late_tx_starts"`
	// CommitToAck is the broker's append time (LogAppendTime, ms precision)
	// minus the writer's clock just before COMMIT.
	CommitToAck Percentiles `json:"commit_to_ack"`
	// CommitToConsumer is when the bench's consumer got the record minus the
	// same commit clock.
	CommitToConsumer Percentiles `json:"commit_to_consumer"`
	// CommitToReceived is, for the bare relay, when its pgoutput reader got
	// the change minus the commit clock: PostgreSQL's own delivery.
	CommitToReceived *Percentiles `json:"commit_to_received,omitempty"`
	// CommitDuration is how long COMMIT (the whole write) took the writer.
	CommitDuration Percentiles `json:"commit_duration"`
	// ConnectorHistogram is the connector's own outbox_connector_commit_to_ack_seconds
	// (PostgreSQL commit timestamp to ack), quantiles interpolated in its buckets.
	ConnectorHistogram *Percentiles `json:"connector_histogram,omitempty"`
	CPUSeconds         float64      `json:"cpu_seconds"`
	CPUPer100k         float64      `json:"cpu_seconds_per_100k_events"`
	PeakRSSBytes       int64        `json:"peak_rss_bytes"`
	Error              string       `json:"error,omitempty"`
}

// Results is everything one run measured.
type Results struct {
	StartedAt    time.Time         `json:"started_at"`
	FinishedAt   time.Time         `json:"finished_at"`
	Machine      Machine           `json:"machine"`
	Versions     map[string]string `json:"versions"`
	Settings     Settings          `json:"settings"`
	Drains       []DrainRun        `json:"drains"`
	DrainSummary []DrainSummary    `json:"drain_summary"`
	Latency      []LatencyRun      `json:"latency"`
	Poll         []PollRun         `json:"poll,omitempty"`
	PollIdle     []PollIdle        `json:"poll_idle,omitempty"`
	Profiles     []ProfileResult   `json:"profiles,omitempty"`
	Variants     []variant         `json:"connector_variants"`
	Source       string            `json:"connector_source"`
	Debezium     DebeziumStatus    `json:"debezium"`
	Goals        []Goal            `json:"goals"`
	Micro        []Micro           `json:"go_test_benchmarks,omitempty"`
	Notes        []string          `json:"notes,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	MemBytes int64  `json:"mem_bytes"`
	Kernel   string `json:"kernel"`
	OS       string `json:"os"`
	LoadAvg  string `json:"load_avg_at_start"`
	LoadEnd  string `json:"load_avg_at_end"`
}

// ProfileResult is the pprof of a connector drain.
type ProfileResult struct {
	Variant     string   `json:"variant"`
	TxSize      int      `json:"tx_size"`
	CPUProfile  string   `json:"cpu_profile"`
	HeapProfile string   `json:"heap_profile"`
	TopCPU      string   `json:"top_cpu"`
	TopCPUCum   string   `json:"top_cpu_cum"`
	TopAlloc    string   `json:"top_alloc_space"`
	TopAllocObj string   `json:"top_alloc_objects"`
	AllocsPerEv float64  `json:"allocs_per_event"`
	BytesPerEv  float64  `json:"alloc_bytes_per_event"`
	Drain       DrainRun `json:"drain"`
	Error       string   `json:"error,omitempty"`
}

// DebeziumStatus says whether Debezium Server ran, and if not, why.
type DebeziumStatus struct {
	Enabled bool   `json:"enabled"`
	Ran     bool   `json:"ran"`
	Version string `json:"version,omitempty"`
	Java    string `json:"java,omitempty"`
	Home    string `json:"home,omitempty"`
	Error   string `json:"error,omitempty"`
	Config  string `json:"config,omitempty"`
}

// Goal is one of the goals and how far this run is from it.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      *bool  `json:"met"` // nil: not measured
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func writeJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644)
}

// percentiles of samples (milliseconds); it sorts samples.
func percentiles(samples []float64) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	sort.Float64s(samples)
	q := func(p float64) float64 {
		// Nearest rank.
		i := int(math.Ceil(p*float64(len(samples)))) - 1
		i = max(0, min(i, len(samples)-1))
		return samples[i]
	}
	var sum float64
	for _, v := range samples {
		sum += v
	}
	return Percentiles{
		Count: len(samples), P50: q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999),
		Max: samples[len(samples)-1], Mean: sum / float64(len(samples)),
	}
}

func parseFloat(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
