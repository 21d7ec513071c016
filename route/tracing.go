package route

import (
	"bytes"

	"github.com/pgoutbox/pgoutbox/route/properties"
)

// traceContext reads the W3C trace context from the span context column,
// which holds a java.util.Properties text (as Debezium's outbox extensions
// write it with Properties.store). It returns the traceparent and the
// tracestate (maybe empty), and false when there is no valid traceparent.
//
// Debezium, with OpenTelemetry on its class path, extracts this context as
// the parent of a "db-log-write" span and injects that new span's context;
// the router has no span of its own, so the application's context goes out
// as is: same trace id and flags, the application's span id as parent. The
// connector, when it traces, makes its relay span a child of it and points
// the header at that span (relay/publish, trace.go).
func traceContext(text []byte) (traceparent, tracestate []byte, ok bool) {
	props := properties.Parse(text)
	tp, found := props.Get("traceparent")
	if !found || !validTraceparent(tp) {
		return nil, nil, false
	}
	ts, _ := props.Get("tracestate")
	return []byte(tp), []byte(ts), true
}

// validTraceparent checks the W3C form version-traceid-parentid-flags, as
// OpenTelemetry's W3CTraceContextPropagator does before using it.
func validTraceparent(s string) bool {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if s[:2] == "ff" || s[:2] == "00" && len(s) != 55 || len(s) > 55 && s[55] != '-' {
		return false
	}
	for _, part := range []string{s[:2], s[3:35], s[36:52], s[53:55]} {
		for i := 0; i < len(part); i++ {
			c := part[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	zero := func(p string) bool { return p == string(bytes.Repeat([]byte{'0'}, len(p))) }
	return !zero(s[3:35]) && !zero(s[36:52])
}
