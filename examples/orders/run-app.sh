#!/usr/bin/env bash
# Runs the example order service and fulfillment consumer against the local
# stack (`eval "$(make -s up)"`), with the
# connector between them: places APP_ORDERS orders over HTTP (default 20),
# waits until each is fulfilled and prints the counts. Ctrl-C stops all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
: "${OUTBOX_PG_DSN:?set it (make up prints it; see README, A local stack)}"
: "${OUTBOX_KAFKA_BROKERS:?set it (make up prints it; see README, A local stack)}"
orders="${APP_ORDERS:-20}"
listen="${ORDERS_LISTEN:-127.0.0.1:8080}"
bin="$(mktemp -d -t pgoutbox-app-XXXXXX)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$bin"
}
trap cleanup EXIT
(cd "$root" && go build -o "$bin/" ./connector ./examples/orders ./examples/fulfillment)

"$bin/connector" >"$bin/connector.log" 2>&1 & pids+=($!)
ORDERS_LISTEN="$listen" "$bin/orders" >"$bin/orders.out" 2>"$bin/orders.log" & pids+=($!)
"$bin/fulfillment" 2>"$bin/fulfillment.log" & pids+=($!)
for _ in $(seq 100); do curl -fsS "http://$listen/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

for i in $(seq "$orders"); do
	curl -fsS -d "{\"customer\":\"customer-$i\",\"amount_cents\":$((1000 + i))}" "http://$listen/orders" >/dev/null
done
echo "placed $orders orders; waiting for fulfillment..." >&2
q="SELECT (SELECT count(*) FROM orders), (SELECT count(DISTINCT order_id) FROM charges), (SELECT count(*) FROM charges)"
for _ in $(seq 120); do
	read -r placed fulfilled charges < <(psql -X -At -F' ' "$OUTBOX_PG_DSN" -c "$q")
	[[ "$fulfilled" -ge "$placed" ]] && break
	sleep 0.5
done
echo "orders: $placed, fulfilled: $fulfilled, charges: $charges (logs in $bin until exit)"
