#!/usr/bin/env bash
# Installs what the tests, the demo and the benchmarks need on a fresh
# machine of this kind: PostgreSQL server binaries (Debian's package) and the
# Kafka broker's jars (Maven Central, cached outside the repository).
# Idempotent; run as root or with sudo available for apt-get.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need_pg=true
for d in /usr/lib/postgresql/*/bin; do
	if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]]; then need_pg=false; fi
done
if $need_pg || ! command -v psql >/dev/null; then
	echo "install.sh: installing PostgreSQL server binaries (apt-get install postgresql)" >&2
	SUDO=""
	if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql postgresql-contrib >/dev/null
fi
# initdb refuses to run as root: the tests run the server as this user.
if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
	useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi
command -v java >/dev/null || { echo "install.sh: Java 17+ is required for the Kafka broker" >&2; exit 1; }
command -v mvn >/dev/null || { echo "install.sh: Maven is required to resolve Kafka from Maven Central" >&2; exit 1; }
"$here/kafka.sh" install
"$here/registry.sh" install

# PostgreSQL 13 to 18 beside Debian's, for slotwatch's version-gated queries
# (TestQueriesOnRealVersions): zonky's builds from Maven Central, unpacked
# once per machine into the cache; their archives are xz-compressed.
if ! command -v xz >/dev/null; then
	SUDO=""
	if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq xz-utils >/dev/null
fi
"$here/pgversions.sh" install

# promtool checks slotwatch's shipped alert rules. Built once per machine from
# the Go module proxy into the cache (never into our go.mod); the version is
# the one slotwatch/rules/rules_test.go pins.
promtool_version="$(sed -n 's/^const promtoolVersion = "\(.*\)"/\1/p' "$here/../slotwatch/rules/rules_test.go")"
promtool_dir="${XDG_CACHE_HOME:-$HOME/.cache}/pgoutbox/promtool-$promtool_version"
if [[ -n "$promtool_version" && ! -x "$promtool_dir/promtool" ]]; then
	echo "install.sh: building promtool $promtool_version (once per machine, a few minutes)" >&2
	(cd /tmp && GOWORK=off GOBIN="$promtool_dir" go install "github.com/prometheus/prometheus/cmd/promtool@$promtool_version") ||
		{ echo "install.sh: building promtool failed" >&2; exit 1; }
fi
