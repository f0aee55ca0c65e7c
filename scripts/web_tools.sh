#!/usr/bin/env bash
# Online search gateway (Serper, SQLite-cached) on :8003. Needs SERPER_KEY_ID in the environment.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8003}"
CONFIG="${CONFIG:-$ROOT/configs/web_tools/serve.yaml}"

usage() {
  cat <<USAGE
usage: scripts/web_tools.sh [extra args for python -m web_tools serve...]

Runs: python -m web_tools serve --config CONFIG --host HOST --port PORT
Variables (environment overrides; current values):
  HOST=$HOST PORT=$PORT CONFIG=$CONFIG PYTHON=$PYTHON
  SERPER_KEY_ID (the Serper API key, required), WEB_TOOLS_TOKEN (optional bearer token)
  DRY_RUN=1 prints the command instead of running it.
See: python -m web_tools serve --help (cache, TTL, rate limit, retries)
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m web_tools serve --config "$CONFIG" --host "$HOST" --port "$PORT" "$@"
