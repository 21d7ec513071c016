#!/usr/bin/env bash
# `make up` / `make down`: a native local stack for manual use (no Docker
# here): one PostgreSQL cluster with sql/ applied and one Kafka broker.
#
#   scripts/stack.sh up      install what is missing (PostgreSQL, Kafka's jars), start
#                            both, apply sql/; prints the environment to export on
#                            stdout (eval "$(make -s up)"), and writes it to STATE/env
#   scripts/stack.sh down    stop what runs; says what it stopped, or that nothing ran
#   scripts/stack.sh reset   down, then remove the state directory (a fresh database next time)
#
# State (the cluster's data, Kafka's log, the env file) lives in one directory
# that up and down agree on: OUTBOX_STACK_DIR, default /var/tmp/pgoutbox-stack-USER.
# Not under $HOME: as root, PostgreSQL runs as the postgres user (initdb
# refuses root), which cannot reach into root's drwx------ home; /var/tmp
# every user can traverse, and unlike /tmp it survives a reboot. Kafka's log is
# formatted afresh at each up; the database is kept until reset.
# Environment: OUTBOX_STACK_DIR, OUTBOX_STACK_PG_PORT (default 55432),
# OUTBOX_CACHE_DIR (where install.sh keeps the downloads).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/common.sh"
dir="${OUTBOX_STACK_DIR:-/var/tmp/pgoutbox-stack-$(id -un)}"
port="${OUTBOX_STACK_PG_PORT:-55432}"
data="$dir/pg/data"
asuser=()
if [[ $(id -u) -eq 0 ]]; then asuser=(runuser -u postgres --); fi

die() { echo "stack.sh: $*" >&2; exit 1; }

pgbin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

pg_running() {
	local bin
	bin="$(pgbin)"
	[[ -n "$bin" && -f "$data/postmaster.pid" ]] && "${asuser[@]}" "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

# kafka_running: the pid kafka.sh recorded is alive and is a broker (a stale
# pid file may name a process that reused the number).
kafka_running() {
	[[ -f "$dir/kafka/pid" ]] || return 1
	local pid
	pid="$(cat "$dir/kafka/pid")"
	kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $dir/kafka/server.properties"
}

# The state directory is only ever changed (chmod, rm) when it is this
# script's: made by it, or found empty, owned by the user and marked. A
# directory named by mistake (OUTBOX_STACK_DIR=/var/tmp, or $HOME) is
# refused, and a directory another user made in /var/tmp beforehand (with
# links planted in it) is never written through.
marker=".pgoutbox-stack"
own_dir() {
	[[ -d "$dir" && ! -L "$dir" && -O "$dir" && -f "$dir/$marker" && ! -L "$dir/$marker" ]]
}
claim_dir() {
	if [[ ! -e "$dir" && ! -L "$dir" ]]; then
		mkdir -p -- "$(dirname -- "$dir")"
		mkdir -m 700 -- "$dir"
		touch -- "$dir/$marker"
	elif [[ -d "$dir" && ! -L "$dir" && -O "$dir" && -z "$(ls -A -- "$dir")" ]]; then
		touch -- "$dir/$marker"
	fi
	own_dir || die "$dir is not a stack directory of $(id -un) (it must be one this script made: owned by you, not a link, marked with $marker); set OUTBOX_STACK_DIR to a new path such as /var/tmp/pgoutbox-stack-$(id -un)"
}

psql_() {
	PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"
}

print_env() {
	own_dir || die "$dir is not a stack directory of $(id -un)"
	cat "$dir/env"
	echo "stack.sh: PostgreSQL on 127.0.0.1:$port (database outbox), Kafka on $(cat "$dir/kafka/brokers"); state in $dir" >&2
	echo "stack.sh: export the lines above (eval \"\$(make -s up)\", or source $dir/env); make down stops both" >&2
}

up() {
	"$here/install.sh" pg kafka
	if pg_running && kafka_running && [[ -f "$dir/env" ]]; then
		echo "stack.sh: the stack was already up" >&2
		print_env
		return 0
	fi
	# Whatever this run starts or creates is undone if a later step fails,
	# so that a failed up leaves nothing running and no half-made cluster.
	# (Globals: the EXIT trap runs after up's locals are gone.)
	started_pg=false started_kafka=false created=false
	undo() {
		local rc=$?
		[[ $rc -eq 0 ]] && return 0
		echo "stack.sh: up failed; undoing what it did" >&2
		if $started_kafka; then "$here/kafka.sh" stop "$dir/kafka" || true; fi
		if $started_pg; then "${asuser[@]}" "$(pgbin)/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true; fi
		if [[ -f "$dir/pg/server.log" ]]; then
			echo "stack.sh: the end of PostgreSQL's log ($dir/pg/server.log):" >&2
			tail -5 "$dir/pg/server.log" >&2
		fi
		if $created; then rm -rf "$dir/pg"; fi
		rm -f "$dir/env"
	}
	trap undo EXIT
	local bin
	bin="$(pgbin)"
	claim_dir
	if [[ $(id -u) -eq 0 ]]; then
		chmod 755 "$dir"
		runuser -u postgres -- test -x "$dir" ||
			die "$dir: the postgres user cannot reach it (a parent directory is private); set OUTBOX_STACK_DIR to a directory under /var/tmp"
	fi
	if [[ ! -f "$data/PG_VERSION" ]]; then
		rm -rf "$dir/pg"
		mkdir -p "$dir/pg"
		created=true
		if [[ $(id -u) -eq 0 ]]; then chown -h postgres "$dir/pg"; fi
		quiet "stack.sh: initdb" "${asuser[@]}" "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C
		cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/pg'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
CONF
	fi
	if ! pg_running; then
		quiet "stack.sh: pg_ctl start (log: $dir/pg/server.log)" "${asuser[@]}" "$bin/pg_ctl" -D "$data" -l "$dir/pg/server.log" -w start
		started_pg=true
	fi
	psql_ -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='outbox'" | grep -q 1 ||
		psql_ -d postgres -c "CREATE DATABASE outbox"
	for f in "$root"/sql/*.sql; do
		psql_ -d outbox -f "$f"
	done
	if ! kafka_running; then
		rm -f "$dir/kafka/pid"
		mkdir -p "$dir/kafka"
		started_kafka=true
		"$here/kafka.sh" start "$dir/kafka" >/dev/null 2>"$dir/kafka.start.log" ||
			{ cat "$dir/kafka.start.log" >&2; die "Kafka did not start"; }
	fi
	local envtmp
	envtmp="$(mktemp "$dir/env.XXXXXX")"
	cat >"$envtmp" <<ENV
export OUTBOX_PG_DSN='postgres://postgres@127.0.0.1:$port/outbox?sslmode=disable'
export SLOTWATCH_PG_DSN='postgres://postgres@127.0.0.1:$port/outbox?sslmode=disable'
export OUTBOX_KAFKA_BROKERS='$(cat "$dir/kafka/brokers")'
ENV
	chmod 644 "$envtmp"
	mv -f -- "$envtmp" "$dir/env"
	trap - EXIT
	print_env
}

down() {
	local stopped=()
	if [[ -e "$dir" ]] && ! own_dir; then
		die "$dir is not a stack directory of $(id -un) (no $marker marker owned by you); nothing stopped"
	fi
	if kafka_running; then
		"$here/kafka.sh" stop "$dir/kafka"
		stopped+=("Kafka")
	fi
	rm -f "$dir/kafka/pid"
	if pg_running; then
		quiet "stack.sh: pg_ctl stop" "${asuser[@]}" "$(pgbin)/pg_ctl" -D "$data" -m fast -w stop
		stopped+=("PostgreSQL")
	fi
	rm -f "$dir/env"
	if [[ ${#stopped[@]} -eq 0 ]]; then
		echo "stack.sh: nothing was running (state in $dir)" >&2
	else
		local kept=" (database kept in $dir; scripts/stack.sh reset removes it)"
		[[ "${1:-}" == reset ]] && kept=""
		echo "stack.sh: stopped $(IFS=,; echo "${stopped[*]}" | sed "s/,/ and /")$kept" >&2
	fi
}

case "${1:-}" in
up) up ;;
down) down ;;
reset)
	down reset
	if own_dir; then rm -rf -- "$dir"; echo "stack.sh: removed $dir" >&2; else echo "stack.sh: $dir does not exist" >&2; fi
	;;
*) echo "usage: stack.sh up|down|reset" >&2; exit 2 ;;
esac
