#!/usr/bin/env bash
# The streaming TTRL training server (POST /submit_sample, /save_checkpoint; GET /health) on
# :8765: updates the Planner whenever train_batch_size x n rollouts are buffered.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

export STREAMING_HOST="${STREAMING_HOST:-127.0.0.1}"
export STREAMING_PORT="${STREAMING_PORT:-8765}"
export GT_REWARD_URL="${GT_REWARD_URL:-http://127.0.0.1:6000}"   # scripts/reward_server.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export WANDB_MODE="${WANDB_MODE:-offline}"

usage() {
  cat <<USAGE
usage: scripts/streaming_server.sh [overrides...]

Runs: python -m ttrl_streaming.server [overrides...]
Variables (environment overrides; current values):
  STREAMING_HOST=$STREAMING_HOST STREAMING_PORT=$STREAMING_PORT GT_REWARD_URL=$GT_REWARD_URL
  PYTHON=$PYTHON RAY_AUTH_MODE=$RAY_AUTH_MODE WANDB_MODE=$WANDB_MODE; DRY_RUN=1 prints the command.
Needs scripts/reward_server.sh, scripts/serve.sh and scripts/memory_serve.sh running.
Options and overrides: python -m ttrl_streaming.server --help
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m ttrl_streaming.server "$@"
