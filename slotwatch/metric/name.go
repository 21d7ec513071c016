package metric

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
)

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// descName extracts a descriptor's metric name; client_golang exposes it
// only through String.
func descName(d *prometheus.Desc) string {
	if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
		return m[1]
	}
	return ""
}
