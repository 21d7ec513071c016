// Package tracing starts the OpenTelemetry SDK of a binary when, and only
// when, the standard environment names an OTLP endpoint
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT): spans
// go out over OTLP/HTTP (protobuf) through a batching span processor, which
// exports on its own goroutine and drops spans rather than block when its
// queue is full. The exporter reads the rest of the OTEL_EXPORTER_OTLP_*
// settings itself (headers, timeout, compression, TLS); the SDK reads
// OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. Nothing configured: no provider, no cost.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Endpoint is the OTLP endpoint the environment names for traces ("" when
// none, or when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn
// tracing off).
func Endpoint(getenv func(string) string) string {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return ""
	}
	if e := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")); e != "" {
		return e
	}
	return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

// Start returns a TracerProvider exporting to the configured OTLP/HTTP
// endpoint, with service.name service unless OTEL_SERVICE_NAME says
// otherwise, or nil when no endpoint is configured. The caller calls
// Shutdown (which flushes what is buffered) before it exits. getenv
// decides whether tracing is on; the exporter and the SDK read the process
// environment themselves, as OpenTelemetry specifies.
func Start(ctx context.Context, getenv func(string) string, service string, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	endpoint := Endpoint(getenv)
	if endpoint == "" {
		return nil, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT %s: start the OTLP/HTTP trace exporter: %w", endpoint, err)
	}
	// Attributes first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (WithFromEnv, later) win.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		// A typo in the resource attributes must not stop the relay: the
		// partial resource (what did parse) is used, and it is said.
		if !errors.Is(err, resource.ErrPartialResource) || res == nil {
			log.Warn("tracing: the resource attributes do not parse; spans carry the service name only", "err", err)
			res = resource.NewSchemaless(attribute.String("service.name", service))
		} else {
			log.Warn("tracing: some resource attributes (OTEL_RESOURCE_ATTRIBUTES) do not parse; the others are used", "err", err)
		}
	}
	// An export that fails is the collector's problem, never the relay's:
	// logged, the spans dropped.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry export failed; spans dropped", "err", err)
	}))
	if u, err := url.Parse(endpoint); err == nil && u.User != nil {
		u.User = url.User("xxxxx") // never log a password
		endpoint = u.String()
	}
	log.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", endpoint, "service", service)
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Shutdown flushes and stops tp (nil: nothing), waiting at most timeout.
func Shutdown(tp *sdktrace.TracerProvider, timeout time.Duration, log *slog.Logger) {
	if tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: flushing the last spans failed", "err", err)
	}
}
