#!/usr/bin/env bash
# Stage 1 of training: Executor GRPO (plans from a fixed Planner, reward of docs/reference.md §7.1).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

train_defaults

usage() {
  cat <<USAGE
usage: scripts/train_executor.sh [hydra overrides...]

Runs: python -m executor_train [--config-name CONFIG_NAME] [overrides...]
$(train_vars)
The config and its overrides: python -m executor_train --help (Hydra). Reward weights:
configs/reward/executor.yaml. Merge a checkpoint afterwards with scripts/merge.sh.
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m executor_train ${CONFIG_NAME:+--config-name "$CONFIG_NAME"} "$@"
