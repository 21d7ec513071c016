#!/usr/bin/env bash
# `make test`: installs what is missing, starts the real Kafka broker once for
# the whole run, runs vet and the suite (-race) against it and throwaway
# PostgreSQL clusters, and stops the broker.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

"$here/install.sh"
# The outside clients some tests read records with (confluent-kafka for
# Python): only the suite needs them.
"$here/pyclients.sh" >/dev/null

pgbin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
echo "test.sh: PostgreSQL server: $("$pgbin/postgres" --version)"
echo "test.sh: Kafka broker: Apache Kafka $("$here/kafka.sh" version) (KRaft, from Maven Central)"
echo "test.sh: $(go version)"

kdir="$(mktemp -d -t outbox-kafka-shared-XXXXXX)"
rdir="$(mktemp -d -t outbox-registry-shared-XXXXXX)"
cleanup() {
	"$here/kafka.sh" stop "$kdir" || true
	"$here/registry.sh" stop "$rdir" || true
	rm -rf "$kdir" "$rdir"
}
trap cleanup EXIT
brokers="$("$here/kafka.sh" start "$kdir")"
export OUTBOX_TEST_KAFKA_BROKERS="$brokers"
echo "test.sh: shared Kafka broker at $brokers"
# One real Confluent-API-compatible schema registry (Apicurio Registry, from
# Maven Central) for the Avro tests of the whole run.
OUTBOX_TEST_REGISTRY_URL="$("$here/registry.sh" start "$rdir")"
export OUTBOX_TEST_REGISTRY_URL
echo "test.sh: schema registry: Apicurio Registry $("$here/registry.sh" version) at $OUTBOX_TEST_REGISTRY_URL"

go vet ./...
go build -o bin/ ./connector ./outbox-router ./slotwatch
# -p 2: two packages at a time on this 2-core machine; each integration test
# starts its own PostgreSQL cluster, the broker is shared.
go test -race -p 2 -timeout 40m -count=1 ${GOTESTFLAGS:-} ./... 2>&1 | tee "${TEST_LOG:-/dev/null}"
