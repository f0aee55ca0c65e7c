#!/usr/bin/env bash
# The streaming TTRL client: reads a dataset, registers ground truths at the reward server and
# pushes samples to the streaming server (scripts/streaming_server.sh) chunk by chunk.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

export STREAMING_URL="${STREAMING_URL:-http://127.0.0.1:8765}"
export GT_REWARD_URL="${GT_REWARD_URL:-http://127.0.0.1:6000}"

usage() {
  cat <<USAGE
usage: scripts/streaming_client.sh [client args...]

Runs: python -m ttrl_streaming.client [args...]
Variables (environment overrides; current values):
  STREAMING_URL=$STREAMING_URL GT_REWARD_URL=$GT_REWARD_URL PYTHON=$PYTHON
  DRY_RUN=1 prints the command instead of running it.
Options: python -m ttrl_streaming.client --help
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m ttrl_streaming.client "$@"
