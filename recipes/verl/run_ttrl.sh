#!/usr/bin/env bash
# TTRL on veRL (recipes/verl/config/ttrl.yaml | ttrl_nogt.yaml; the reference's TTRL run
# scripts): one pass over the test stream; memory_serve (:5000, MEMORY_URL) buffers every rollout
# and consolidates after each step; the frozen Executor behind serve (PLAN_URL / REPLAN_URL).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

MODE="${MODE:-supervised}"                   # supervised | nogt
MODEL_PATH="${MODEL_PATH:-checkpoints/mia/planner_grpo/merged}"
TEST_FILES="${TEST_FILES:-data/verl/ttrl_test.parquet}"
N_GPUS="${N_GPUS:-4}"
PLAN_URL="${PLAN_URL:-http://127.0.0.1:5001/execute}"
REPLAN_URL="${REPLAN_URL:-http://127.0.0.1:5001/continue}"
MEMORY_URL="${MEMORY_URL:-http://127.0.0.1:5000}"
TTRL_SAVE="${TTRL_SAVE:-runs/ttrl}"          # /batch_evaluate files and the saved memory
MODEL_MAX_LEN="${MODEL_MAX_LEN:-32768}"
CKPT_DIR="${CKPT_DIR:-checkpoints/mia/ttrl}"
export MIA_LLM_CONFIG="${MIA_LLM_CONFIG:-vllm}"

usage() {
  cat <<USAGE
usage: recipes/verl/run_ttrl.sh [hydra overrides...]

Runs: $VERL_PYTHON -m verl.trainer.main_ppo --config-path=recipes/verl/config \\
        --config-name=ttrl (MODE=nogt: ttrl_nogt) [the variables below as overrides] [overrides...]
Variables (environment; current values):
  MODE=$MODE MODEL_PATH=$MODEL_PATH TEST_FILES=$TEST_FILES N_GPUS=$N_GPUS NNODES=$NNODES
  PLAN_URL=$PLAN_URL REPLAN_URL=$REPLAN_URL MEMORY_URL=$MEMORY_URL TTRL_SAVE=$TTRL_SAVE
  MODEL_MAX_LEN=$MODEL_MAX_LEN CKPT_DIR=$CKPT_DIR RESUME_MODE=$RESUME_MODE
  RESUME_FROM_PATH=${RESUME_FROM_PATH:-<none>} MIA_LLM_CONFIG=$MIA_LLM_CONFIG
  WANDB_MODE=$WANDB_MODE VERL_PYTHON=$VERL_PYTHON; DRY_RUN=1 prints the command.
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

case "$MODE" in
  supervised) name=ttrl ;;
  nogt) name=ttrl_nogt ;;
  *) echo "run_ttrl.sh: MODE must be supervised or nogt, got $MODE" >&2; exit 2 ;;
esac
executor="$(base_url "$PLAN_URL")"
if [ "$executor" != "$(base_url "$REPLAN_URL")" ]; then
  echo "run_ttrl.sh: PLAN_URL and REPLAN_URL must be one serve service" >&2; exit 2
fi
resume_overrides
run_verl "$name" \
  "actor_rollout_ref.model.path=$MODEL_PATH" \
  "data.train_files=$TEST_FILES" "data.val_files=$TEST_FILES" \
  "trainer.n_gpus_per_node=$N_GPUS" "trainer.nnodes=$NNODES" \
  "trainer.default_local_dir=$CKPT_DIR" \
  "actor_rollout_ref.rollout.max_model_len=$MODEL_MAX_LEN" \
  "mia.services.executor_url=$executor" "mia.services.memory_url=$(base_url "$MEMORY_URL")" \
  "mia.ttrl.eval_dir=$TTRL_SAVE/eval" "mia.ttrl.save_path=$TTRL_SAVE/memory" \
  "${RESUME[@]}" "$@"
