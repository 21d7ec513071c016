#!/usr/bin/env bash
# Installs what a command needs on a fresh machine of this kind, and nothing
# more; each part is idempotent and quiet unless it fails.
#
#   scripts/install.sh pg      PostgreSQL server binaries (Debian's package) and,
#                              as root, the postgres user initdb runs as
#                              (`make demo`: its Kafka is in-process)
#   scripts/install.sh kafka   the Kafka broker's jars (Maven Central, cached
#                              outside the repository)
#   scripts/install.sh         everything the test suite uses (`make test`): the two
#                              above, the schema registry, PostgreSQL 13 to 18 and promtool
#
# Run as root or with sudo available for apt-get. Environment: OUTBOX_CACHE_DIR
# (default ~/.cache/pgoutbox), where the downloads are kept.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/common.sh"

sudo_() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# apt_install PACKAGE...: Debian's packages, the index refreshed once.
apt_updated=false
apt_install() {
	echo "install.sh: installing $* (apt-get)" >&2
	if ! $apt_updated; then
		quiet "install.sh: apt-get update" sudo_ apt-get update -qq
		apt_updated=true
	fi
	quiet "install.sh: apt-get install $*" sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

install_pg() {
	local have=false
	for d in /usr/lib/postgresql/*/bin; do
		if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]]; then have=true; fi
	done
	if ! $have || ! command -v psql >/dev/null; then apt_install postgresql postgresql-contrib; fi
	# initdb refuses to run as root: as root, the servers run as this user.
	if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
		useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
	fi
}

install_kafka() {
	command -v java >/dev/null || { echo "install.sh: Java 17+ is required for the Kafka broker" >&2; exit 1; }
	command -v mvn >/dev/null || { echo "install.sh: Maven is required to resolve Kafka from Maven Central" >&2; exit 1; }
	"$here/kafka.sh" install
}

# install_suite: what only the test suite uses, beyond PostgreSQL and Kafka.
install_suite() {
	"$here/registry.sh" install
	# PostgreSQL 13 to 18 beside Debian's, for slotwatch's version-gated
	# queries (TestQueriesOnRealVersions): zonky's builds from Maven Central,
	# unpacked once per machine into the cache; their archives are
	# xz-compressed.
	command -v xz >/dev/null || apt_install xz-utils
	"$here/pgversions.sh" install
	# promtool checks slotwatch's shipped alert rules. Built once per machine
	# from the Go module proxy into the cache (never into our go.mod); the
	# version is the one slotwatch/rules/rules_test.go pins.
	local version dir
	version="$(sed -n 's/^const promtoolVersion = "\(.*\)"/\1/p' "$here/../slotwatch/rules/rules_test.go")"
	dir="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}/promtool-$version"
	if [[ -n "$version" && ! -x "$dir/promtool" ]]; then
		echo "install.sh: building promtool $version (once per machine, a few minutes)" >&2
		(cd /tmp && quiet "install.sh: go install promtool" env GOWORK=off GOBIN="$dir" go install "github.com/prometheus/prometheus/cmd/promtool@$version")
	fi
}

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(all)
for part in "${parts[@]}"; do
	case "$part" in
	pg) install_pg ;;
	kafka) install_kafka ;;
	all) install_pg; install_kafka; install_suite ;;
	*) echo "usage: install.sh [pg] [kafka] (no argument: everything the test suite uses)" >&2; exit 2 ;;
	esac
done
