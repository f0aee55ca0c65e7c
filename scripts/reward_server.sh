#!/usr/bin/env bash
# The pluggable reward server (POST /register_gts, /compute_gt_reward; GET /health) on :6000.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-6000}"
DB="${DB:-}"                        # SQLite file; empty = $MIA_HOME/reward_server/gts.sqlite
REWARD_FN="${REWARD_FN:-mia.rewards.hooks:planner_gt_reward}"   # package.module:function
REWARD_CONFIG="${REWARD_CONFIG:-}"  # planner | nogt (configs/reward/) or a YAML file
JUDGE="${JUDGE:-rules}"             # rules | llm | panel (configs/judge/) or a YAML file
LLM_CONFIG="${LLM_CONFIG:-embedded}" # for llm/panel judges: embedded | vllm | a YAML file

usage() {
  cat <<USAGE
usage: scripts/reward_server.sh [extra args for python -m ttrl_streaming.reward_server...]

Runs: python -m ttrl_streaming.reward_server --host HOST --port PORT --reward-fn REWARD_FN
      --judge JUDGE --llm LLM_CONFIG [--db DB] [--reward-config REWARD_CONFIG]
Variables (environment overrides; current values):
  HOST=$HOST PORT=$PORT DB=${DB:-<default>} REWARD_FN=$REWARD_FN
  REWARD_CONFIG=${REWARD_CONFIG:-<function defaults>} JUDGE=$JUDGE LLM_CONFIG=$LLM_CONFIG
  PYTHON=$PYTHON REWARD_SERVER_TOKEN (optional bearer token); DRY_RUN=1 prints the command.
Example (LLM judge on vLLM :8002): JUDGE=llm LLM_CONFIG=vllm scripts/reward_server.sh
Example (no ground truth): REWARD_FN=mia.rewards.hooks:nogt_panel_reward JUDGE=panel \\
  REWARD_CONFIG=nogt scripts/reward_server.sh
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m ttrl_streaming.reward_server --host "$HOST" --port "$PORT" \
  --reward-fn "$REWARD_FN" --judge "$JUDGE" --llm "$LLM_CONFIG" \
  ${DB:+--db "$DB"} ${REWARD_CONFIG:+--reward-config "$REWARD_CONFIG"} "$@"
