package retry

import (
	"testing"
	"time"
)

// TestNew: exactly the first wait, doubled up to the cap, and again from
// the first after a Reset.
func TestNew(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := b.NextBackOff(); got != want*time.Millisecond {
			t.Fatalf("wait %d: %s, want %s", i+1, got, want*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.NextBackOff(); got != 100*time.Millisecond {
		t.Errorf("after Reset: %s, want 100ms", got)
	}
}

// TestJittered: each wait within [d/2, d] of its nominal d, and spread (not
// one value) over many draws.
func TestJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 200 {
		b := Jittered(100*time.Millisecond, 5*time.Second)
		for i, d := range []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000} {
			d *= time.Millisecond
			got := b.NextBackOff()
			if got < d/2 || got > d+time.Nanosecond {
				t.Fatalf("wait %d: %s, want within [%s, %s]", i+1, got, d/2, d)
			}
			if i == 0 {
				seen[got.Round(time.Millisecond)] = true
			}
		}
	}
	if len(seen) < 20 {
		t.Errorf("first waits took %d distinct values over 200 draws; want them spread", len(seen))
	}
}
