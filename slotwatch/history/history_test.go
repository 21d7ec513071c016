package history

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// steady writes 1000 bytes/s, one sample every 10 s, from 0 to 100 s.
func steady() *WAL {
	h := New(time.Hour, 0)
	for s := 0; s <= 100; s += 10 {
		h.Add(at(float64(s)), uint64(1_000_000+s*1000))
	}
	return h
}

func TestLag(t *testing.T) {
	h := steady()
	tests := []struct {
		name       string
		now        float64
		lsn        uint64
		want       float64
		lowerBound bool
	}{
		{"caught up", 100, 1_100_000, 0, false},
		{"ahead of the last sample", 100, 1_200_000, 0, false},
		{"on a sample", 100, 1_050_000, 50, false},
		{"between samples", 100, 1_055_000, 45, false},
		{"later now", 130, 1_090_000, 40, false},
		{"older than the history", 100, 900_000, 100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, lb, ok := h.Lag(at(tt.now), tt.lsn)
			if !ok || lb != tt.lowerBound || math.Abs(got-tt.want) > 1e-6 {
				t.Fatalf("Lag = %v, %v, %v; want %v, %v", got, lb, ok, tt.want, tt.lowerBound)
			}
		})
	}
	if _, _, ok := New(time.Hour, 0).Lag(t0, 1); ok {
		t.Fatal("empty history answered")
	}
}

func TestLagIdleServer(t *testing.T) {
	// WAL stops at 1_000_500; a slot at 1_000_000 has not confirmed WAL that
	// was written between the first two samples, however long ago.
	h := New(time.Hour, 0)
	h.Add(at(0), 1_000_000)
	h.Add(at(10), 1_000_500)
	h.Add(at(20), 1_000_500)
	h.Add(at(30), 1_000_500)
	got, lb, _ := h.Lag(at(30), 1_000_000)
	if lb || got != 30 {
		t.Fatalf("Lag = %v (lower bound %v), want 30", got, lb)
	}
}

func TestRate(t *testing.T) {
	h := steady()
	tests := []struct {
		window time.Duration
		want   float64
	}{
		{30 * time.Second, 1000},
		{time.Hour, 1000}, // longer than the history: all of it
		{5 * time.Second, 1000},
	}
	for _, tt := range tests {
		got, ok := h.Rate(tt.window)
		if !ok || math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Rate(%s) = %v, %v; want %v", tt.window, got, ok, tt.want)
		}
	}
	// A burst at the end shows in a short window only.
	h.Add(at(110), 1_100_000+100_000)
	if r, _ := h.Rate(10 * time.Second); r != 10_000 {
		t.Errorf("short window rate %v, want 10000", r)
	}
	if _, ok := New(time.Hour, 0).Rate(time.Minute); ok {
		t.Error("rate from no samples")
	}
}

func TestResetOnRewind(t *testing.T) {
	h := steady()
	h.Add(at(110), 5) // a different server now answers at this address
	if h.Len() != 1 {
		t.Fatalf("history kept %d samples across a rewind", h.Len())
	}
}

func TestBounded(t *testing.T) {
	h := New(time.Hour, 64)
	for s := 0; s < 10_000; s++ {
		h.Add(at(float64(s)/10), uint64(s*100))
	}
	if n := h.Len(); n > 64 {
		t.Fatalf("%d samples kept, limit 64", n)
	}
	// Thinned history still answers sensibly: 1000 bytes/s.
	if r, ok := h.Rate(10 * time.Second); !ok || math.Abs(r-1000) > 1 {
		t.Fatalf("Rate after thinning = %v", r)
	}
	got, _, _ := h.Lag(at(999.9), 500_000) // written at 500 s
	if math.Abs(got-499.9) > 20 {
		t.Fatalf("Lag after thinning = %v, want about 499.9", got)
	}
	// The horizon drops old samples.
	h2 := New(time.Minute, 0)
	for s := 0; s <= 600; s += 10 {
		h2.Add(at(float64(s)), uint64(s))
	}
	if first := h2.Samples()[0].Time; first.Before(at(540)) {
		t.Fatalf("oldest sample %v is beyond the horizon", first.Sub(t0))
	}
}
