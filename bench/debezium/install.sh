#!/usr/bin/env bash
# Resolves Debezium Server (io.debezium:debezium-server-dist, tar.gz) from
# Maven Central into a cache outside the repository, without the optional
# connectors (Cassandra, ...) and scripting jars the bench does not use, and
# prints the server's home directory. Idempotent.
#
# Environment: OUTBOX_CACHE_DIR (default ~/.cache/pgoutbox).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$here/pom.xml")"
cache="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}"
dest="$cache/debezium-server-$version"
avro_version="$(sed -n 's:.*<avro.version>\(.*\)</avro.version>.*:\1:p' "$here/pom.xml")"
# add_avro puts Apache Avro beside the distribution's Apicurio converter,
# which needs it for debezium.format.value=avro (the golden soak's Avro sets).
add_avro() {
	[[ -f "$dest/debezium-server/lib/avro-$avro_version.jar" ]] && return 0
	mvn -q -B -f "$here/pom.xml" dependency:copy -Dartifact="org.apache.avro:avro:$avro_version" -DoutputDirectory="$dest/debezium-server/lib" >&2 ||
		{ echo "debezium/install.sh: could not resolve org.apache.avro:avro:$avro_version from Maven Central" >&2; exit 1; }
}
if [[ -f "$dest/.complete" ]]; then
	add_avro
	echo "$dest/debezium-server"
	exit 0
fi
command -v mvn >/dev/null || { echo "debezium/install.sh: Maven (mvn) is required" >&2; exit 1; }
# Maven's unpack markers live in the pom's build directory: without them it
# unpacks again.
rm -rf "$dest" "$cache/debezium-maven-build"
mkdir -p "$dest"
echo "debezium/install.sh: resolving io.debezium:debezium-server-dist:$version (about 780 MB) into $dest" >&2
mvn -q -B -f "$here/pom.xml" dependency:unpack-dependencies -DoutputDirectory="$dest" \
	-Dmdep.unpack.excludes='debezium-server/connectors/**,debezium-server/lib_opt/**' >&2 ||
	{ echo "debezium/install.sh: could not resolve debezium-server-dist:$version from Maven Central" >&2; exit 1; }
[[ -f "$(ls "$dest"/debezium-server/debezium-server-*runner.jar 2>/dev/null | head -1)" ]] ||
	{ echo "debezium/install.sh: no runner jar in $dest/debezium-server" >&2; exit 1; }
add_avro
touch "$dest/.complete"
echo "$dest/debezium-server"
