#!/usr/bin/env bash
# Starts and stops a real Apache Kafka broker (KRaft, one node acting as
# broker and controller) from Maven Central jars, for tests, benchmarks and
# `make up`. The jars are resolved by Maven into a cache outside the repository.
#
#   scripts/kafka.sh install              resolve the jars (idempotent)
#   scripts/kafka.sh start DIR [k=v ...]  format DIR, start a broker on a free port,
#                                         wait until it is up; prints the bootstrap address;
#                                         extra k=v lines are appended to server.properties
#                                         (@PORT@ and @CONTROLLER_PORT@ in them become the ports chosen)
#   scripts/kafka.sh stop DIR             stop the broker started in DIR
#   scripts/kafka.sh version              the Kafka version this script runs
#
# Environment: OUTBOX_CACHE_DIR (default ~/.cache/pgoutbox), KAFKA_JAVA (java binary),
# KAFKA_HEAP (default -Xmx768m).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"
pom="$here/kafka/pom.xml"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")"
cache="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}"
libs="$cache/kafka-$version/libs"
java="${KAFKA_JAVA:-java}"

die() { echo "kafka.sh: $*" >&2; exit 1; }

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

install() {
	if [[ -f "$libs/.complete" ]]; then return 0; fi
	command -v mvn >/dev/null || die "Maven (mvn) is required to resolve Kafka from Maven Central"
	mkdir -p "$libs"
	echo "kafka.sh: resolving org.apache.kafka:kafka_2.13:$version from Maven Central into $libs" >&2
	quiet "kafka.sh: mvn" mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs" ||
		die "could not resolve kafka_2.13:$version with Maven; check Maven Central access"
	touch "$libs/.complete"
}

start() {
	local dir="${1:?start needs a directory}"
	shift
	install
	rm -rf "$dir/data" "$dir/logs"
	mkdir -p "$dir/data" "$dir/logs"
	local port cport
	port="$(free_port)"
	cport="$(free_port)"
	while [[ "$cport" == "$port" ]]; do cport="$(free_port)"; done
	cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=9223372036854775807
EOF
	for kv in "$@"; do
		kv="${kv//@PORT@/$port}"
		echo "${kv//@CONTROLLER_PORT@/$cport}" >>"$dir/server.properties"
	done
	local cp="$libs/*"
	local jopts=(-cp "$cp" ${KAFKA_HEAP:--Xmx768m} -XX:+UseG1GC -Djava.awt.headless=true
		-Dkafka.logs.dir="$dir/logs" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties")
	"$java" "${jopts[@]}" kafka.tools.StorageTool format -t "$(cat /proc/sys/kernel/random/uuid | tr -d '-' | head -c 22)" \
		-c "$dir/server.properties" >"$dir/logs/format.log" 2>&1 ||
		{ cat "$dir/logs/format.log" >&2; die "formatting storage in $dir failed"; }
	# setsid: the broker gets its own process group, so a test can SIGSTOP it
	# and a stop kills it and nothing else.
	setsid "$java" "${jopts[@]}" kafka.Kafka "$dir/server.properties" >"$dir/logs/stdout.log" 2>&1 </dev/null &
	echo $! >"$dir/pid"
	echo "127.0.0.1:$port" >"$dir/brokers"
	local deadline=$((SECONDS + 90))
	until grep -q "Kafka Server started" "$dir/logs/server.log" 2>/dev/null; do
		if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
			tail -50 "$dir/logs/stdout.log" "$dir/logs/server.log" >&2 2>/dev/null || true
			die "broker exited during start (logs in $dir/logs)"
		fi
		((SECONDS < deadline)) || die "broker did not start within 90s (logs in $dir/logs)"
		sleep 0.2
	done
	echo "kafka.sh: Apache Kafka $version (KRaft, broker+controller) on 127.0.0.1:$port, pid $(cat "$dir/pid")" >&2
	echo "127.0.0.1:$port"
}

stop() {
	local dir="${1:?stop needs a directory}"
	[[ -f "$dir/pid" ]] || return 0
	local pid
	pid="$(cat "$dir/pid")"
	kill -CONT "$pid" 2>/dev/null || true
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/pid"
}

case "${1:-}" in
install) install ;;
start) shift; start "$@" ;;
stop) shift; stop "$@" ;;
version) echo "$version" ;;
*) die "usage: kafka.sh install|start DIR|stop DIR|version" ;;
esac
