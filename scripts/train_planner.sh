#!/usr/bin/env bash
# Stage 2 of training: Planner GRPO against the frozen Executor behind the serve service
# (scripts/serve.sh) and memory_serve (reward of docs/reference.md §7.2).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

train_defaults

usage() {
  cat <<USAGE
usage: scripts/train_planner.sh [hydra overrides...]

Runs: python -m planner_train [--config-name CONFIG_NAME] [overrides...]
$(train_vars)
Needs the Executor service (scripts/serve.sh) and, for memories, scripts/memory_serve.sh.
The config and its overrides: python -m planner_train --help (Hydra). Reward weights:
configs/reward/planner.yaml.
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m planner_train ${CONFIG_NAME:+--config-name "$CONFIG_NAME"} "$@"
