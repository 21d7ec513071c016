#!/usr/bin/env bash
# `make up` / `make down`: a native local stack for manual use (no Docker
# here): one PostgreSQL cluster with sql/ applied and one Kafka broker, in
# $OUTBOX_CACHE_DIR/stack. `up` prints the environment to export.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
dir="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}/stack"
pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
asuser=()
if [[ $(id -u) -eq 0 ]]; then asuser=(runuser -u postgres --); fi

up() {
	"$here/install.sh"
	pgbin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
	mkdir -p "$dir"
	local port=${OUTBOX_STACK_PG_PORT:-55432}
	if [[ ! -d "$dir/pg/data" ]]; then
		mkdir -p "$dir/pg"
		[[ $(id -u) -eq 0 ]] && chown -R postgres "$dir/pg"
		"${asuser[@]}" "$pgbin/initdb" -D "$dir/pg/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
		cat >>"$dir/pg/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/pg'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
CONF
	fi
	"${asuser[@]}" "$pgbin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w start >/dev/null
	psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -tc "SELECT 1 FROM pg_database WHERE datname='outbox'" | grep -q 1 ||
		psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "CREATE DATABASE outbox"
	for f in "$root"/sql/*.sql; do
		psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d outbox -f "$f"
	done
	local brokers
	brokers="$("$here/kafka.sh" start "$dir/kafka")"
	cat <<ENV | tee "$dir/env"
export OUTBOX_PG_DSN='postgres://postgres@127.0.0.1:$port/outbox?sslmode=disable'
export SLOTWATCH_PG_DSN='postgres://postgres@127.0.0.1:$port/outbox?sslmode=disable'
export OUTBOX_KAFKA_BROKERS='$brokers'
ENV
	echo "stack is up; source $dir/env" >&2
}

down() {
	"$here/kafka.sh" stop "$dir/kafka" || true
	if [[ -d "$dir/pg/data" ]]; then "${asuser[@]}" "$pgbin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null || true; fi
	echo "stack is down (data kept in $dir; rm -rf it to start afresh)" >&2
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: stack.sh up|down" >&2; exit 2 ;;
esac
