// Package recipes holds the test of the README's recipes for writing an
// event without the Go package: plain SQL (write_event.sql) and Python
// with psycopg (write_event.py). The test runs both against a real
// PostgreSQL and connector and reads their events from Kafka.
package recipes
