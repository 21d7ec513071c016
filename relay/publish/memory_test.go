package publish

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, tc := range []struct {
		gomemlimit string
		maxMessage int
		want       int64 // 0: left alone
	}{
		{"", 1 << 20, 40 << 20},
		{"", 8 << 20, (24 + 32) << 20},
		{"100MiB", 1 << 20, 0},
		{"off", 1 << 20, 0},
	} {
		debug.SetMemoryLimit(math.MaxInt64)
		getenv := func(k string) string {
			if k == "GOMEMLIMIT" {
				return tc.gomemlimit
			}
			return ""
		}
		got := SetMemoryLimit(getenv, tc.maxMessage)
		now := debug.SetMemoryLimit(-1)
		if got != tc.want {
			t.Errorf("GOMEMLIMIT=%q, max message %d: SetMemoryLimit = %d; want %d", tc.gomemlimit, tc.maxMessage, got, tc.want)
		}
		if tc.want == 0 && now != math.MaxInt64 || tc.want != 0 && now != tc.want {
			t.Errorf("GOMEMLIMIT=%q: runtime limit %d after the call; want %d", tc.gomemlimit, now, tc.want)
		}
	}
}
