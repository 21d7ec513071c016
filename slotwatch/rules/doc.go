// Package rules holds the Prometheus alerting rules slotwatch ships
// (slotwatch.rules.yml) and their promtool unit tests
// (slotwatch.rules.test.yml): the alerts slotwatch evaluates itself, for a
// Prometheus that scrapes it. The Go tests run promtool on them and check
// that names, severities, for-durations, thresholds and metrics agree with
// slotwatch's own.
package rules
