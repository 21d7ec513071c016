package web

import (
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatusPageScreenshot renders the status page in headless Chromium,
// when Chromium is installed (Debian's chromium package; optional — the
// HTML test above is the one that must pass), and checks the picture shows
// the critical rows in red. SLOTWATCH_SCREENSHOT_DIR keeps the PNG.
func TestStatusPageScreenshot(t *testing.T) {
	var browser string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		t.Skip("no Chromium installed (apt-get install chromium); the status page is checked by TestStatusPage")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "status.html")
	reports, alerts := fixture()
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := RenderStatus(f, reports, alerts, 10*time.Second, now); err != nil {
		t.Fatal(err)
	}
	f.Close()
	shot := filepath.Join(dir, "status.png")
	if d := os.Getenv("SLOTWATCH_SCREENSHOT_DIR"); d != "" {
		shot = filepath.Join(d, "slotwatch-status.png")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--window-size=1500,520", "--screenshot="+shot, "file://"+page)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	r, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	// The critical rows' background (#ffecec) must be on the picture.
	if n := countColor(img, 0xff, 0xec, 0xec); n < 1000 {
		t.Errorf("only %d pixels of the critical rows' colour: the page did not render as designed", n)
	}
	if !strings.HasSuffix(shot, ".png") {
		t.Fatal(shot)
	}
	t.Logf("screenshot %s (%dx%d)", shot, img.Bounds().Dx(), img.Bounds().Dy())
}

func countColor(img image.Image, r8, g8, b8 uint32) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, _ := img.At(x, y).RGBA()
			if r>>8 == r8 && g>>8 == g8 && bb>>8 == b8 {
				n++
			}
		}
	}
	return n
}
