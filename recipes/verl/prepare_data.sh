#!/usr/bin/env bash
# veRL's RL parquet from MIA's data (python -m mia.verl.data): prompt as chat messages,
# data_source, reward_model.ground_truth, extra_info (question, plan, memories, data_id, ...),
# agent_name (mia_executor | mia_planner) and, for Executor rows, the images column.
#   recipes/verl/prepare_data.sh executor runs/world/train.jsonl data/verl/executor_train.parquet
#   PLAN_URL=http://127.0.0.1:5000 recipes/verl/prepare_data.sh executor IN OUT   # plan rows without one
set -euo pipefail
. "$(dirname "$0")/_common.sh"
PYTHON="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"

if wants_help "${1:-}" || [ $# -lt 3 ]; then
  cat <<USAGE
usage: recipes/verl/prepare_data.sh executor|planner|ttrl INPUT OUT [--limit N] [--text-only]
Runs: $PYTHON -m mia.verl.data KIND --input INPUT --out OUT [--plan-url \$PLAN_URL] [...]
Variables: PLAN_URL=${PLAN_URL:-<none>} (memory_serve: /plan Executor rows without a plan)
USAGE
  if wants_help "${1:-}"; then exit 0; fi
  exit 2
fi
kind="$1" input="$2" out="$3"; shift 3
cmd=("$PYTHON" -m mia.verl.data "$kind" --input "$input" --out "$out")
if [ -n "${PLAN_URL:-}" ]; then cmd+=(--plan-url "$(base_url "$PLAN_URL")"); fi
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${cmd[@]}" "$@"; printf '\n'; exit 0; fi
exec "${cmd[@]}" "$@"
