#!/usr/bin/env bash
# Test-time RL over a test set: per batch, n plans per question -> execute -> judge -> memory
# write -> GRPO step on the Planner. mode=supervised (ground truth) or nogt (review panel).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

MODE="${MODE:-supervised}"
case "${1:-}" in supervised|nogt) MODE="$1"; shift ;; esac
train_defaults

usage() {
  cat <<USAGE
usage: scripts/ttrl.sh [supervised|nogt] [hydra overrides...]

Runs: python -m ttrl mode=MODE [--config-name CONFIG_NAME] [overrides...]
$(train_vars "MODE=$MODE ")
Needs scripts/serve.sh and scripts/memory_serve.sh running. Reward weights:
configs/reward/planner.yaml (supervised), configs/reward/nogt.yaml (nogt).
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

run "$PYTHON" -m ttrl "mode=$MODE" ${CONFIG_NAME:+--config-name "$CONFIG_NAME"} "$@"
