// Package chart draws the benchmark report's bar charts as PNG with the
// standard library only: grouped bars, a linear or logarithmic value axis,
// a legend and value labels, in a built-in bitmap font.
package chart

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
)

// Series is one bar per group.
type Series struct {
	Name string
	// Values has one value per group; NaN draws no bar and an "n/a" label.
	Values []float64
}

// Bars is a grouped bar chart.
type Bars struct {
	Title  string
	YLabel string
	// Groups label the x axis.
	Groups []string
	Series []Series
	// LogY draws the value axis in decades (values must be positive).
	LogY bool
	// Format labels the bars (default %.3g).
	Format func(float64) string
	// Width and Height in pixels (default 1000x560).
	Width, Height int
	// Lines are horizontal reference lines (goals), drawn dashed.
	Lines []Line
}

// Line is a labelled horizontal reference line.
type Line struct {
	Value float64
	Label string
}

// Palette is the series colors, in order.
var Palette = []color.RGBA{
	{0x4c, 0x72, 0xb0, 0xff}, {0xdd, 0x84, 0x52, 0xff}, {0x55, 0xa8, 0x68, 0xff},
	{0xc4, 0x4e, 0x52, 0xff}, {0x81, 0x72, 0xb3, 0xff}, {0x93, 0x78, 0x60, 0xff},
	{0xda, 0x8b, 0xc3, 0xff}, {0x8c, 0x8c, 0x8c, 0xff}, {0xcc, 0xb9, 0x74, 0xff},
}

var (
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grey  = color.RGBA{0xd8, 0xd8, 0xd8, 0xff}
	red   = color.RGBA{0xb0, 0x20, 0x20, 0xff}
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

// WriteFile renders the chart to a PNG file.
func (b *Bars) WriteFile(path string) error {
	var buf bytes.Buffer
	if err := png.Encode(&buf, b.Render()); err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// Render draws the chart.
func (b *Bars) Render() image.Image {
	w, h := b.Width, b.Height
	if w == 0 {
		w = 1000
	}
	if h == 0 {
		h = 560
	}
	format := b.Format
	if format == nil {
		format = func(v float64) string { return fmt.Sprintf("%.3g", v) }
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fillRect(img, 0, 0, w, h, white)

	// Layout: title on top, legend under it, plot, group labels below.
	const scale = 2
	left, right := 110, 30
	top := 20 + textHeight(scale) + 16
	legendRows := (len(b.Series) + 2) / 3
	top += legendRows * (textHeight(1) + 10)
	bottom := h - 50
	drawText(img, (w-textWidth(b.Title, scale))/2, 16, b.Title, scale, black)
	for i, s := range b.Series {
		col, row := i%3, i/3
		x := left + col*((w-left-right)/3)
		y := 20 + textHeight(scale) + 12 + row*(textHeight(1)+10)
		fillRect(img, x, y-1, 12, 9, Palette[i%len(Palette)])
		drawText(img, x+18, y, s.Name, 1, black)
	}
	drawTextVertical(img, 16, (top+bottom)/2+textWidth(b.YLabel, 1)/2, b.YLabel, 1, black)

	lo, hi := b.bounds()
	ticks := b.ticks(lo, hi)
	yOf := func(v float64) int {
		var f float64
		if b.LogY {
			f = (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		} else {
			f = (v - lo) / (hi - lo)
		}
		return bottom - int(f*float64(bottom-top))
	}
	for _, t := range ticks {
		y := yOf(t)
		fillRect(img, left, y, w-left-right, 1, grey)
		lbl := tickLabel(t)
		drawText(img, left-8-textWidth(lbl, 1), y-3, lbl, 1, black)
	}
	fillRect(img, left, top, 1, bottom-top+1, black)
	fillRect(img, left, bottom, w-left-right, 1, black)

	groups := len(b.Groups)
	if groups == 0 {
		return img
	}
	gw := float64(w-left-right) / float64(groups)
	// Group labels at double size when they all fit, else at normal size.
	labelScale := scale
	for _, name := range b.Groups {
		if float64(textWidth(name, scale)) > gw-8 {
			labelScale = 1
		}
	}
	n := len(b.Series)
	bw := int(gw * 0.8 / float64(max(n, 1)))
	for g, name := range b.Groups {
		gx := left + int(float64(g)*gw+gw*0.1)
		for i, s := range b.Series {
			x := gx + i*bw
			var v float64 = math.NaN()
			if g < len(s.Values) {
				v = s.Values[g]
			}
			if math.IsNaN(v) || (b.LogY && v <= 0) {
				drawText(img, x+(bw-textWidth("n/a", 1))/2, bottom-12, "n/a", 1, black)
				continue
			}
			y := yOf(math.Max(math.Min(v, hi), lo))
			fillRect(img, x+1, y, bw-2, bottom-y, Palette[i%len(Palette)])
			lbl := format(v)
			lx := x + (bw-textWidth(lbl, 1))/2
			if textWidth(lbl, 1) > bw-2 {
				// Too wide for the bar: write it vertically above it.
				drawTextVertical(img, x+(bw-glyphH)/2, y-4, lbl, 1, black)
			} else {
				drawText(img, lx, y-12, lbl, 1, black)
			}
		}
		drawText(img, left+int(float64(g)*gw+(gw-float64(textWidth(name, labelScale)))/2), bottom+14, name, labelScale, black)
	}
	for _, l := range b.Lines {
		if l.Value < lo || l.Value > hi || (b.LogY && l.Value <= 0) {
			continue
		}
		y := yOf(l.Value)
		for x := left; x < w-right; x += 10 {
			fillRect(img, x, y, 6, 2, red)
		}
		drawText(img, w-right-textWidth(l.Label, 1)-2, y-11, l.Label, 1, red)
	}
	return img
}

// bounds is the value range the axis shows.
func (b *Bars) bounds() (lo, hi float64) {
	hi = math.Inf(-1)
	lo = math.Inf(1)
	for _, s := range b.Series {
		for _, v := range s.Values {
			if math.IsNaN(v) || (b.LogY && v <= 0) {
				continue
			}
			hi = math.Max(hi, v)
			lo = math.Min(lo, v)
		}
	}
	for _, l := range b.Lines {
		if !b.LogY || l.Value > 0 {
			hi = math.Max(hi, l.Value)
			lo = math.Min(lo, l.Value)
		}
	}
	if math.IsInf(hi, -1) {
		if b.LogY {
			return 1, 10
		}
		return 0, 1
	}
	if b.LogY {
		// A decade of room below the smallest bar keeps it visible.
		lo = math.Pow(10, math.Floor(math.Log10(lo/2)))
		hi = math.Pow(10, math.Ceil(math.Log10(hi*1.3)))
		if hi <= lo {
			hi = lo * 10
		}
		return lo, hi
	}
	step := niceStep(hi * 1.15 / 6)
	return 0, math.Ceil(hi*1.15/step) * step
}

func (b *Bars) ticks(lo, hi float64) []float64 {
	var out []float64
	if b.LogY {
		for v := lo; v <= hi*1.0001; v *= 10 {
			out = append(out, v)
		}
		return out
	}
	step := niceStep((hi - lo) / 6)
	for v := lo; v <= hi*1.0001; v += step {
		out = append(out, v)
	}
	return out
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1e6:
		return trim(fmt.Sprintf("%.1fM", v/1e6))
	case math.Abs(v) >= 1e4:
		return trim(fmt.Sprintf("%.1fk", v/1e3))
	case math.Abs(v) >= 1:
		return trim(fmt.Sprintf("%.2f", v))
	default:
		return trim(fmt.Sprintf("%.4f", v))
	}
}

// trim drops trailing zeros of a decimal: 2.50k -> 2.5k, 3.00 -> 3.
func trim(s string) string {
	suffix := ""
	if n := len(s); n > 0 && (s[n-1] == 'k' || s[n-1] == 'M') {
		suffix, s = s[n-1:], s[:n-1]
	}
	if bytes.ContainsRune([]byte(s), '.') {
		for len(s) > 0 && s[len(s)-1] == '0' {
			s = s[:len(s)-1]
		}
		s = string(bytes.TrimSuffix([]byte(s), []byte(".")))
	}
	return s + suffix
}
