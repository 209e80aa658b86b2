#!/usr/bin/env bash
# Runs the Python examples against a live daemon at $OSTLER_ADDR (sessions in
# $OSTLER_EXAMPLE_CWD). Creates a virtual environment (./.venv, or $OSTLER_PY_VENV) and
# installs requirements.txt into it first. Exits non-zero when any example fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${OSTLER_ADDR:?set OSTLER_ADDR to the daemon address (host:port)}"
cwd="${OSTLER_EXAMPLE_CWD:-$PWD}"
venv="${OSTLER_PY_VENV:-$here/.venv}"
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "run.sh: $python not found (the Python examples need Python 3.9+)" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
"$venv/bin/python" "$here/health.py" --addr "$OSTLER_ADDR"
"$venv/bin/python" "$here/health.py" --addr "$OSTLER_ADDR" --service ostler.v1.SessionService
"$venv/bin/python" "$here/client.py" --addr "$OSTLER_ADDR" --cwd "$cwd" "${OSTLER_EXAMPLE_PROMPT:-Create the file please}"
"$venv/bin/python" "$here/tools.py" --addr "$OSTLER_ADDR" --cwd "$cwd"
