#!/usr/bin/env bash
# Installs the outside clients some tests read records with (confluent-kafka
# for Python, with its Avro deserializer) and the README's Python recipe
# writes events with (psycopg; scripts/pyclients/requirements.txt)
# into a virtual environment in the cache, once per machine and pin, and
# prints its python. Idempotent.
#
# Environment: OUTBOX_CACHE_DIR (default ~/.cache/pgoutbox), PYTHON (default
# python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/pyclients/requirements.txt"
cache="${OUTBOX_CACHE_DIR:-$HOME/.cache/pgoutbox}"
sum="$(sha256sum "$req" | cut -c1-12)"
venv="$cache/pyclients-$sum"
if [[ -f "$venv/.complete" ]]; then
	echo "$venv/bin/python"
	exit 0
fi
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "pyclients.sh: $python is required" >&2; exit 1; }
rm -rf "$venv"
echo "pyclients.sh: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv" >&2
"$python" -m venv "$venv" >&2 || { echo "pyclients.sh: python -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2 ||
	{ echo "pyclients.sh: pip install -r $req failed" >&2; exit 1; }
touch "$venv/.complete"
echo "$venv/bin/python"
