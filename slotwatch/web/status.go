package web

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/slotwatch/alert"
	"github.com/pgoutbox/pgoutbox/slotwatch/watch"
)

// Sparkline geometry, in CSS pixels.
const (
	sparkW = 140
	sparkH = 28
)

// statusRow is one row of the status page: a slot, or a server that cannot
// be reached (Slot empty).
type statusRow struct {
	Server     string
	Slot       string
	Database   string
	Kind       string // slot_type and plugin
	Level      string // ok, warn, crit, down
	State      string // active, inactive 12m, invalidated (reason)
	WALStatus  string
	Lag        string
	LagTime    string
	Retained   string
	TTI        string
	Spark      template.HTML
	SparkTitle string
	Alerts     []string
	Err        string
}

type statusPage struct {
	Refresh  int
	Now      string
	Servers  int
	Down     int
	SlotN    int
	Firing   []alert.Status
	Pending  int
	Rows     []statusRow
	Interval string
}

// RenderStatus writes the status page.
func RenderStatus(w io.Writer, reports []watch.Report, alerts []alert.Status, interval time.Duration, now time.Time) error {
	p := statusPage{
		Refresh:  max(1, int(math.Ceil(interval.Seconds()))),
		Now:      now.UTC().Format("2006-01-02 15:04:05 UTC"),
		Servers:  len(reports),
		Interval: interval.String(),
	}
	for _, a := range alerts {
		if a.State == "firing" {
			p.Firing = append(p.Firing, a)
		} else {
			p.Pending++
		}
	}
	for _, r := range reports {
		if !r.Up {
			p.Down++
			p.Rows = append(p.Rows, statusRow{
				Server: r.Server, Database: r.Database, Level: "down", State: "unreachable",
				Err:    fmt.Sprintf("unreachable since %s: %s", r.DownSince.UTC().Format("15:04:05"), r.Err),
				Alerts: alertNames(alerts, r.Server, ""),
			})
			continue
		}
		if len(r.Slots) == 0 {
			p.Rows = append(p.Rows, statusRow{Server: r.Server, Database: r.Database, Level: "ok", State: "no replication slots",
				Alerts: alertNames(alerts, r.Server, "")})
		}
		for _, s := range r.Slots {
			p.SlotN++
			p.Rows = append(p.Rows, slotRow(r, s, alerts))
		}
	}
	return statusTmpl.Execute(w, p)
}

func slotRow(r watch.Report, s watch.SlotReport, alerts []alert.Status) statusRow {
	row := statusRow{
		Server: r.Server, Slot: s.Name, Database: s.Database,
		Kind:      s.Type,
		WALStatus: s.WALStatus,
		Lag:       "–", LagTime: "–", Retained: "–", TTI: "–",
		Alerts: alertNames(alerts, r.Server, s.Name),
	}
	if s.Plugin != "" {
		row.Kind += " · " + s.Plugin
	}
	if row.WALStatus == "" {
		row.WALStatus = "–"
	}
	if s.LagBytesOK {
		row.Lag = alert.Bytes(s.LagBytes)
	}
	if s.LagSecondsOK {
		row.LagTime = alert.Duration(s.LagSeconds)
		if s.LagSecondsLowerBound {
			row.LagTime = "≥ " + row.LagTime
		}
	}
	if s.RetainedOK {
		row.Retained = alert.Bytes(s.RetainedBytes)
	}
	if s.TimeToInvalidationOK {
		row.TTI = alert.Duration(s.TimeToInvalidation)
	} else if r.Settings.MaxSlotWALKeepSize != nil && *r.Settings.MaxSlotWALKeepSize < 0 {
		row.TTI = "no limit"
	}
	bad, reason := s.Invalidated()
	switch {
	case bad:
		row.State = "invalidated (" + reason + ")"
	case s.Active:
		row.State = "active"
	default:
		row.State = "inactive " + alert.Duration(s.InactiveSeconds)
	}
	row.Level = "ok"
	if !s.Active && !bad {
		row.Level = "warn"
	}
	for _, a := range alerts {
		if a.State != "firing" || a.Labels["server"] != r.Server || a.Labels["slot"] != s.Name {
			continue
		}
		if a.Severity == alert.Critical {
			row.Level = "crit"
		} else if row.Level == "ok" {
			row.Level = "warn"
		}
	}
	if bad || s.WALStatus == "unreserved" {
		row.Level = "crit"
	}
	row.Spark, row.SparkTitle = sparkline(s.Spark)
	return row
}

func alertNames(alerts []alert.Status, server, slot string) []string {
	var out []string
	for _, a := range alerts {
		if a.Labels["server"] == server && a.Labels["slot"] == slot {
			name := a.Name
			if a.State != "firing" {
				name += " (pending)"
			}
			out = append(out, name)
		}
	}
	return out
}

// sparkline draws points as an inline SVG polyline scaled to its maximum.
// Only numbers reach the markup, so it is safe to mark as HTML.
func sparkline(pts []watch.Point) (template.HTML, string) {
	if len(pts) == 0 {
		return "", "no samples yet"
	}
	hi := 0.0
	for _, p := range pts {
		hi = math.Max(hi, p.Value)
	}
	var b strings.Builder
	n := len(pts)
	for i, p := range pts {
		x := float64(sparkW)
		if n > 1 {
			x = float64(i) * float64(sparkW) / float64(n-1)
		}
		y := float64(sparkH) - 2
		if hi > 0 {
			y = 2 + (1-p.Value/hi)*(float64(sparkH)-4)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	span := pts[n-1].Time.Sub(pts[0].Time).Round(time.Second)
	title := fmt.Sprintf("lag over the last %s, peak %s, now %s", span, alert.Bytes(int64(hi)), alert.Bytes(int64(pts[n-1].Value)))
	svg := fmt.Sprintf(`<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img"><polyline fill="none" stroke="currentColor" stroke-width="1.5" points="%s"/></svg>`,
		sparkW, sparkH, sparkW, sparkH, b.String())
	return template.HTML(svg), title //nolint:gosec // built from numbers only
}

var statusTmpl = template.Must(template.New("status").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<meta http-equiv="refresh" content="{{.Refresh}}"/>
<title>slotwatch{{if .Firing}} ({{len .Firing}} firing){{end}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem;color:#1d2230;background:#fafbfc}
h1{font-size:1.4rem;margin:0 0 .25rem}
.sum{color:#555;margin:0 0 1rem}
table{border-collapse:collapse;width:100%;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.08)}
th,td{padding:.45rem .6rem;text-align:left;border-bottom:1px solid #e6e8eb;vertical-align:middle;white-space:nowrap}
th{font-size:.78rem;text-transform:uppercase;letter-spacing:.04em;color:#666;background:#f3f4f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.ok td.state{color:#17803d}
tr.warn{background:#fff8e6}tr.warn td.state{color:#9a6700}
tr.crit{background:#ffecec}tr.crit td.state{color:#c0262d;font-weight:600}
tr.down{background:#f1f1f1;color:#666}tr.down td.state{color:#c0262d;font-weight:600}
.dot{display:inline-block;width:.6rem;height:.6rem;border-radius:50%;margin-right:.4rem;background:#17803d}
tr.warn .dot{background:#d4a72c}tr.crit .dot,tr.down .dot{background:#c0262d}
.spark{color:#3b6fd4;display:block}tr.crit .spark{color:#c0262d}
.alerts{list-style:none;padding:0;margin:0 0 1rem}
.alerts li{padding:.4rem .6rem;margin-bottom:.3rem;border-left:4px solid #d4a72c;background:#fff}
.alerts li.critical{border-color:#c0262d}
.tag{font-size:.75rem;padding:.05rem .35rem;border-radius:3px;background:#eef;color:#334;margin-right:.25rem}
.err{white-space:normal;color:#8a1c1c}
td:last-child{white-space:normal}
footer{margin-top:1rem;color:#777;font-size:.85rem}
a{color:#3b6fd4}
</style>
</head>
<body>
<h1>slotwatch</h1>
<p class="sum" id="summary">{{.Servers}} server{{if ne .Servers 1}}s{{end}}{{if .Down}} ({{.Down}} unreachable){{end}} · {{.SlotN}} slot{{if ne .SlotN 1}}s{{end}} · {{len .Firing}} alert{{if ne (len .Firing) 1}}s{{end}} firing{{if .Pending}}, {{.Pending}} pending{{end}} · updated {{.Now}}, every {{.Interval}}</p>
{{- if .Firing}}
<ul class="alerts" id="firing">
{{- range .Firing}}
<li class="{{.Severity}}"><strong>{{.Name}}</strong> <span class="tag">{{.Severity}}</span>{{index .Annotations "summary"}}</li>
{{- end}}
</ul>
{{- end}}
<table id="slots">
<thead><tr><th>Server</th><th>Slot</th><th>Type</th><th>State</th><th>WAL status</th><th>Lag</th><th>Lag time</th><th>Retained WAL</th><th>Time to invalidation</th><th>Lag trend</th><th>Alerts</th></tr></thead>
<tbody>
{{- range .Rows}}
{{- if eq .Level "down"}}
<tr class="down" data-server="{{.Server}}" data-level="down"><td>{{.Server}}</td><td colspan="2">–</td><td class="state"><span class="dot"></span>unreachable</td><td colspan="6" class="err">{{.Err}}</td><td>{{range .Alerts}}<span class="tag">{{.}}</span>{{end}}</td></tr>
{{- else if not .Slot}}
<tr class="ok" data-server="{{.Server}}" data-level="ok"><td>{{.Server}}</td><td colspan="9">{{.State}}</td><td>{{range .Alerts}}<span class="tag">{{.}}</span>{{end}}</td></tr>
{{- else}}
<tr class="{{.Level}}" data-server="{{.Server}}" data-slot="{{.Slot}}" data-level="{{.Level}}"><td>{{.Server}}</td><td><strong>{{.Slot}}</strong>{{if .Database}}<br/><small>{{.Database}}</small>{{end}}</td><td>{{.Kind}}</td><td class="state"><span class="dot"></span>{{.State}}</td><td>{{.WALStatus}}</td><td class="num lag">{{.Lag}}</td><td class="num lagtime">{{.LagTime}}</td><td class="num retained">{{.Retained}}</td><td class="num tti">{{.TTI}}</td><td title="{{.SparkTitle}}">{{.Spark}}</td><td>{{range .Alerts}}<span class="tag">{{.}}</span>{{end}}</td></tr>
{{- end}}
{{- end}}
</tbody>
</table>
<footer><a href="/slots">/slots</a> (JSON) · <a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a></footer>
</body>
</html>
`))
