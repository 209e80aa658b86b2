#!/usr/bin/env bash
# Runs the TypeScript examples against a live daemon at $OSTLER_ADDR (sessions in
# $OSTLER_EXAMPLE_CWD): installs the npm dependencies (./node_modules) when missing,
# type-checks with tsc, then runs health.ts and client.ts with tsx. Non-zero on failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${OSTLER_ADDR:?set OSTLER_ADDR to the daemon address (host:port)}"
cwd="${OSTLER_EXAMPLE_CWD:-$PWD}"
command -v node >/dev/null || { echo "run.sh: node not found (the TypeScript examples need Node.js 18+)" >&2; exit 2; }
command -v npm >/dev/null || { echo "run.sh: npm not found" >&2; exit 2; }
cd "$here"
if [ ! -x node_modules/.bin/tsx ] || [ ! -d node_modules/@grpc/grpc-js ]; then
  npm install --no-audit --no-fund --loglevel=error
fi
node_modules/.bin/tsc --noEmit -p .
node_modules/.bin/tsx health.ts --addr "$OSTLER_ADDR"
node_modules/.bin/tsx health.ts --addr "$OSTLER_ADDR" --service ostler.v1.SessionService
node_modules/.bin/tsx client.ts --addr "$OSTLER_ADDR" --cwd "$cwd" "${OSTLER_EXAMPLE_PROMPT:-Create the file please}"
