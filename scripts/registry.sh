#!/usr/bin/env bash
# Starts and stops a real schema registry for the Avro tests: Apicurio Registry
# (Quarkus, in-memory storage) from Maven Central, which serves the
# Confluent-compatible API under /apis/ccompat/v7. The application is resolved
# by Maven into a cache outside the repository, on first use.
#
#   scripts/registry.sh install     resolve and unpack the registry (idempotent)
#   scripts/registry.sh start DIR   start a registry on a free port with DIR as its
#                                   working directory, wait until the API answers;
#                                   prints the Confluent API's base URL
#                                   (http://127.0.0.1:PORT/apis/ccompat/v7)
#   scripts/registry.sh stop DIR    stop the registry started in DIR
#   scripts/registry.sh version     the Apicurio Registry version this script runs
#
# Environment: OUTBOX_CACHE_DIR (default ~/.cache/pgoutbox), REGISTRY_JAVA (java
# binary, Java 17 or newer), REGISTRY_HEAP (default -Xmx256m).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"
pom="$here/registry/pom.xml"
version="$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$pom")"
cache="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}"
home="$cache/apicurio-registry-$version"
jar="$home/apicurio-registry-app-$version-runner.jar"
java="${REGISTRY_JAVA:-java}"

die() { echo "registry.sh: $*" >&2; exit 1; }

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# answers URL: the URL answers 200 within a second.
answers() {
	python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=1) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

install() {
	if [[ -f "$home/.complete" ]]; then return 0; fi
	command -v mvn >/dev/null || die "Maven (mvn) is required to resolve Apicurio Registry from Maven Central"
	# Test packages run in parallel and each may be first to need the
	# registry: one installs, the others wait for it. The lock's descriptor is
	# closed afterwards, so that a registry started next does not inherit it.
	mkdir -p "$cache"
	exec 9>"$cache/.apicurio-registry-$version.lock"
	if command -v flock >/dev/null; then flock 9; fi
	if [[ ! -f "$home/.complete" ]]; then
		rm -rf "$home"
		mkdir -p "$home"
		echo "registry.sh: resolving io.apicurio:apicurio-registry-app:$version:zip:all from Maven Central into $home" >&2
		quiet "registry.sh: mvn" mvn -q -B -Dstyle.color=never -f "$pom" dependency:unpack -Dregistry.home="$home" ||
			die "could not resolve apicurio-registry-app:$version (classifier all, zip) with Maven; check Maven Central access"
		[[ -f "$jar" ]] || die "the unpacked archive has no $(basename "$jar")"
		touch "$home/.complete"
	fi
	exec 9>&-
}

start() {
	local dir="${1:?start needs a directory}"
	install
	rm -rf "$dir/logs" "$dir/tmp" "$dir/config"
	mkdir -p "$dir/logs" "$dir/tmp" "$dir/config"
	cp "$here/registry/application.properties" "$dir/config/application.properties"
	local port
	port="$(free_port)"
	local jopts=(${REGISTRY_HEAP:--Xmx256m} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
		-Djava.io.tmpdir="$dir/tmp" -Dquarkus.http.port="$port"
		-Dapicurio.import.work-dir="$dir/tmp" -Dapicurio.storage.snapshot.location="$dir/tmp")
	# setsid: the registry gets its own process group, so a stop kills it and
	# nothing else. The working directory holds config/application.properties.
	(cd "$dir" && exec setsid "$java" "${jopts[@]}" -jar "$jar" >"$dir/logs/stdout.log" 2>&1 </dev/null) &
	echo $! >"$dir/pid"
	local base="http://127.0.0.1:$port/apis/ccompat/v7"
	echo "$base" >"$dir/url"
	local deadline=$((SECONDS + 90))
	until answers "$base/subjects"; do
		if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
			tail -50 "$dir/logs/stdout.log" >&2 2>/dev/null || true
			die "registry exited during start (logs in $dir/logs)"
		fi
		((SECONDS < deadline)) || { tail -50 "$dir/logs/stdout.log" >&2 2>/dev/null || true; die "registry did not answer within 90s (logs in $dir/logs)"; }
		sleep 0.2
	done
	echo "registry.sh: Apicurio Registry $version (in-memory) on 127.0.0.1:$port, pid $(cat "$dir/pid")" >&2
	echo "$base"
}

stop() {
	local dir="${1:?stop needs a directory}"
	[[ -f "$dir/pid" ]] || return 0
	local pid
	pid="$(cat "$dir/pid")"
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
*) die "usage: registry.sh install|start DIR|stop DIR|version" ;;
esac
