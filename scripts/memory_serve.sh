#!/usr/bin/env bash
# The Memory Manager service (memory, planning, TTRL memory hooks) on :5000.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
CONFIG="${CONFIG:-default}"          # a name in configs/memory/ or a YAML file
LLM_CONFIG="${LLM_CONFIG:-embedded}" # embedded (in-process SmolLM2) | vllm (Qwen3 on :8002) | a file
DB="${DB:-}"                         # SQLite file; empty = $MIA_HOME/memory/memory.sqlite

usage() {
  cat <<USAGE
usage: scripts/memory_serve.sh [key=value config overrides...]

Runs: python -m memory_serve --config CONFIG --host HOST --port PORT [--db DB] llm.config=LLM_CONFIG
Variables (environment overrides; current values):
  HOST=$HOST PORT=$PORT CONFIG=$CONFIG LLM_CONFIG=$LLM_CONFIG DB=${DB:-<default>} PYTHON=$PYTHON
  MEMORY_SERVE_TOKEN (optional bearer token); DRY_RUN=1 prints the command.
Example: LLM_CONFIG=vllm scripts/memory_serve.sh store.retrieval.top_k=3
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m memory_serve --config "$CONFIG" --host "$HOST" --port "$PORT" \
  ${DB:+--db "$DB"} "llm.config=$LLM_CONFIG" "$@"
