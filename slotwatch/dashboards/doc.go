// Package dashboards holds the Grafana dashboard slotwatch ships
// (slotwatch.json): lag in bytes and seconds per slot, retained WAL, time to
// invalidation, WAL status and the alerts. Its test checks the JSON and that
// every query uses only metrics slotwatch exports.
package dashboards
