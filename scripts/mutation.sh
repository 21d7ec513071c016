#!/usr/bin/env bash
# `make mutation`: mutation testing (gremlins) of the packages that decide
# what may be confirmed and what is poison: the LSN tracker, the WAL package
# (pgoutput decoder, state row and slot checks) and the producer (error
# classification, dead letters). Prints each package's figures and a summary.
#
# Each mutant is run against the package's own unit tests, without services:
# the tests of *_integration_test.go files (real PostgreSQL, real Kafka) are
# skipped by name, since gremlins runs the package's tests once per mutant.
#
# gremlins is built once per machine from the Go module proxy into the cache,
# never into our go.mod. Not part of `make test`: it takes minutes.
#
#	scripts/mutation.sh [package ...]     (default: the three below)
#	MUTATION_MIN_EFFICACY=85 scripts/mutation.sh   fail below that efficacy
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."

version=v0.6.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/pgoutbox/gremlins-$version"
gremlins="$dir/gremlins"
if [[ ! -x "$gremlins" ]]; then
	echo "mutation.sh: building gremlins $version (once per machine)" >&2
	(cd /tmp && GOWORK=off GOBIN="$dir" go install "github.com/go-gremlins/gremlins/cmd/gremlins@$version") ||
		{ echo "mutation.sh: building gremlins failed" >&2; exit 1; }
fi

pkgs=("$@")
if [[ ${#pkgs[@]} -eq 0 ]]; then
	pkgs=(./relay/tracker ./relay/checkpoint ./relay/wal ./relay/publish)
fi
min="${MUTATION_MIN_EFFICACY:-0}"

logdir="$(mktemp -d -t outbox-mutation-XXXXXX)"
trap 'rm -rf "$logdir"' EXIT
summary=()
status=0
for pkg in "${pkgs[@]}"; do
	# The integration tests of the package, by name.
	skip=""
	itests=("$pkg"/*_integration_test.go)
	if [[ -e "${itests[0]}" ]]; then
		skip="$(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/p' "${itests[@]}" | paste -sd '|' -)"
	fi
	# -count=1: a mutant must be tested, never answered from the test cache.
	flags="${GOFLAGS:-} -count=1"
	if [[ -n "$skip" ]]; then
		flags="$flags -skip=^($skip)\$"
	fi
	log="$logdir/$(echo "$pkg" | tr '/.' '__').txt"
	echo "mutation.sh: gremlins unleash $pkg" >&2
	# CI=true would turn a skipped service into a failure; no test here
	# needs one. A property test that a mutant fails need not spend rapid's
	# default 30 s shrinking it, nor leave a fail file behind.
	if ! env -u CI GOFLAGS="$flags" RAPID_SHRINKTIME=2s RAPID_NOFAILFILE=true "$gremlins" unleash ${MUTATION_FLAGS:-} "$pkg" >"$log" 2>&1; then
		cat "$log" >&2
		echo "mutation.sh: gremlins failed on $pkg" >&2
		exit 1
	fi
	grep -E '^ *(LIVED|TIMED OUT)' "$log" || true
	counts="$(grep -E '^(Killed|Timed out):' "$log" | paste -sd ' ' -)"
	efficacy="$(sed -n 's/^Test efficacy: \([0-9.]*\)%/\1/p' "$log")"
	coverage="$(sed -n 's/^Mutator coverage: \([0-9.]*\)%/\1/p' "$log")"
	summary+=("$(printf '%-22s efficacy %6s%%  mutator coverage %6s%%  %s' "$pkg" "${efficacy:-?}" "${coverage:-?}" "$counts")")
	if [[ -z "$efficacy" ]] || awk -v e="$efficacy" -v m="$min" 'BEGIN { exit !(e < m) }'; then
		status=1
	fi
done
echo
printf '%s\n' "${summary[@]}"
if [[ $status -ne 0 ]]; then
	echo "mutation.sh: test efficacy below ${min}% (MUTATION_MIN_EFFICACY)" >&2
fi
exit $status
