#!/usr/bin/env bash
# Stage 2 of training: Planner GRPO against the frozen Executor behind the serve service
# (scripts/serve.sh) and memory_serve (reward of docs/reference.md §7.2).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

CONFIG_NAME="${CONFIG_NAME:-}"   # a Hydra config name of planner_train; empty = its default
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export WANDB_MODE="${WANDB_MODE:-offline}"

usage() {
  cat <<USAGE
usage: scripts/train_planner.sh [hydra overrides...]

Runs: python -m planner_train [--config-name CONFIG_NAME] [overrides...]
Variables (environment overrides; current values):
  CONFIG_NAME=${CONFIG_NAME:-<default>} PYTHON=$PYTHON RAY_AUTH_MODE=$RAY_AUTH_MODE
  WANDB_MODE=$WANDB_MODE HF_HUB_OFFLINE=$HF_HUB_OFFLINE; DRY_RUN=1 prints the command.
Needs the Executor service (scripts/serve.sh) and, for memories, scripts/memory_serve.sh.
The config and its overrides: python -m planner_train --help (Hydra). Reward weights:
configs/reward/planner.yaml.
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m planner_train ${CONFIG_NAME:+--config-name "$CONFIG_NAME"} "$@"
