# Developer commands. `make demo` runs the pipeline on embedded defaults;
# `make test` runs the suite against real PostgreSQL and a real Kafka broker.
GO ?= go

.PHONY: all build test demo bench soak lint fmt up down install clean app mutation

all: build

build:
	@mkdir -p bin
	$(GO) build -trimpath -o bin/ ./connector ./outbox-router ./slotwatch ./maintain

install:
	scripts/install.sh

test:
	scripts/test.sh

demo:
	@scripts/install.sh pg
	$(GO) run ./examples/demo

bench:
	scripts/install.sh
	$(GO) run ./bench

soak:
	scripts/install.sh
	OUTBOX_SOAK=1 scripts/test.sh

# Mutation testing of the tracker, the WAL package and the producer
# (gremlins, built into the cache if missing); prints each one's efficacy.
mutation:
	scripts/mutation.sh

lint:
	$(GO) vet ./...
	@if command -v golangci-lint >/dev/null; then golangci-lint run ./...; else echo "golangci-lint not installed; ran go vet only"; fi

fmt:
	gofmt -s -w $$(git ls-files '*.go')

up:
	@scripts/stack.sh up

down:
	@scripts/stack.sh down

clean:
	rm -rf bin

# The order service, the fulfillment consumer and the connector against the
# local stack (run `make up` first and source the environment it prints).
app:
	examples/orders/run-app.sh
