// Package rules holds the Prometheus alerting rules the connector ships
// (connector.rules.yml) and their promtool unit tests
// (connector.rules.test.yml), for a Prometheus that scrapes the connector's
// /metrics. The Go tests run promtool on them and check that every metric
// the rules read is one the connector exports.
package rules
