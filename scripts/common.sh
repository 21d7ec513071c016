# Sourced by the scripts beside it: what they do the same way.

# quiet WHAT CMD...: runs CMD with its output kept aside, and shows that
# output (without terminal colour codes) only when CMD fails. Maven 3.8
# writes colour resets (ESC[0m) even with -B -q and -Dstyle.color=never,
# and apt-get's progress is noise when nothing goes wrong.
quiet() {
	local what="$1"
	shift
	local log
	log="$(mktemp -t pgoutbox-quiet-XXXXXX)"
	"$@" >"$log" 2>&1 && { rm -f "$log"; return 0; }
	local rc=$?
	echo "$what failed (exit $rc): $*" >&2
	sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$log" | tail -80 >&2
	rm -f "$log"
	return "$rc"
}
