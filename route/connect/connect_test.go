package connect

import (
	"math"
	"strconv"
	"testing"
)

func TestJavaDouble(t *testing.T) {
	for _, c := range []struct {
		f    float64
		bits int
		want string
	}{
		{1, 64, "1.0"}, {39.98, 64, "39.98"}, {1e7, 64, "1.0E7"}, {9999999, 64, "9999999.0"}, {0.001, 64, "0.001"},
		{0.0001, 64, "1.0E-4"}, {1e21, 64, "1.0E21"}, {123456789.125, 64, "1.23456789125E8"}, {math.SmallestNonzeroFloat64, 64, "4.9E-324"},
		{math.MaxFloat64, 64, "1.7976931348623157E308"}, {2e23, 64, "2.0E23"}, {-0.5, 64, "-0.5"}, {math.Copysign(0, -1), 64, "-0.0"},
		{math.Inf(1), 64, "Infinity"}, {math.NaN(), 64, "NaN"}, {float64(float32(0.1)), 32, "0.1"}, {float64(float32(3.4e38)), 32, "3.4E38"},
		{float64(math.SmallestNonzeroFloat32), 32, "1.4E-45"},
	} {
		if got := string(AppendJavaDouble(nil, c.f, c.bits)); got != c.want {
			t.Errorf("%v/%d: %s, want %s", c.f, c.bits, got, c.want)
		}
	}
}

func TestBigDecimal(t *testing.T) {
	for in, want := range map[string]string{"12.50": "12.50", "0.00": "0.00", "-0.0000001": "-1E-7", "0.000001": "0.000001", "100": "100", "-3.14": "-3.14"} {
		d, ok := ParseDecimal([]byte(in))
		if !ok || string(AppendJavaBigDecimal(nil, d)) != want {
			t.Errorf("%s: %s", in, AppendJavaBigDecimal(nil, d))
		}
	}
	for in, want := range map[int64]string{0: "00", 127: "7f", 128: "0080", -1: "ff", -128: "80", -129: "ff7f", 12345: "3039"} {
		d, _ := ParseDecimal([]byte(strconv.FormatInt(in, 10)))
		if got := hexs(TwosComplement(&d.Unscaled)); got != want {
			t.Errorf("%d: %s, want %s", in, got, want)
		}
	}
}

func hexs(b []byte) string {
	const h = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, h[c>>4], h[c&15])
	}
	return string(out)
}
