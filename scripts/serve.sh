#!/usr/bin/env bash
# The Executor service (POST /execute, /continue) on :5001: runs the Executor loop on a plan.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5001}"
CONFIG="${CONFIG:-$ROOT/configs/serve/default.yaml}"  # configs/serve/vllm.yaml: Executor on vLLM :8000
AGENT_CONFIG="${AGENT_CONFIG:-}"                       # e.g. configs/agent/web.yaml (online search)

usage() {
  cat <<USAGE
usage: scripts/serve.sh [key=value config overrides...]

Runs: python -m serve --config CONFIG [--agent-config AGENT_CONFIG] --host HOST --port PORT
Variables (environment overrides; current values):
  HOST=$HOST PORT=$PORT CONFIG=$CONFIG AGENT_CONFIG=${AGENT_CONFIG:-<none>} PYTHON=$PYTHON
  SERVE_TOKEN (optional bearer token); DRY_RUN=1 prints the command.
Example: CONFIG=configs/serve/vllm.yaml scripts/serve.sh agent.max_turns=10
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m serve --config "$CONFIG" ${AGENT_CONFIG:+--agent-config "$AGENT_CONFIG"} \
  --host "$HOST" --port "$PORT" "$@"
