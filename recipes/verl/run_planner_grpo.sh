#!/usr/bin/env bash
# Planner GRPO on veRL (recipes/verl/config/planner_grpo.yaml; the reference's Planner-Train run
# script). Needs a GPU node with veRL + vLLM (VERL_PYTHON), the trained Executor frozen behind
# serve (:5001; PLAN_URL / REPLAN_URL, the reference's names for its /plan and /replan),
# memory_serve (:5000, MEMORY_URL) and the judge LLM (:8002).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-8B}"
TRAIN_FILES="${TRAIN_FILES:-data/verl/planner_train.parquet}"
VAL_FILES="${VAL_FILES:-data/verl/planner_val.parquet}"
N_GPUS="${N_GPUS:-4}"
PLAN_URL="${PLAN_URL:-http://127.0.0.1:5001/execute}"
REPLAN_URL="${REPLAN_URL:-http://127.0.0.1:5001/continue}"
MEMORY_URL="${MEMORY_URL:-http://127.0.0.1:5000}"
MODEL_MAX_LEN="${MODEL_MAX_LEN:-32768}"
CKPT_DIR="${CKPT_DIR:-checkpoints/mia/planner_grpo}"
export MIA_LLM_CONFIG="${MIA_LLM_CONFIG:-vllm}"

usage() {
  cat <<USAGE
usage: recipes/verl/run_planner_grpo.sh [hydra overrides...]

Runs: $VERL_PYTHON -m verl.trainer.main_ppo --config-path=recipes/verl/config \\
        --config-name=planner_grpo [the variables below as overrides] [overrides...]
Variables (environment; current values):
  MODEL_PATH=$MODEL_PATH TRAIN_FILES=$TRAIN_FILES VAL_FILES=$VAL_FILES
  N_GPUS=$N_GPUS NNODES=$NNODES PLAN_URL=$PLAN_URL REPLAN_URL=$REPLAN_URL MEMORY_URL=$MEMORY_URL
  MODEL_MAX_LEN=$MODEL_MAX_LEN CKPT_DIR=$CKPT_DIR RESUME_MODE=$RESUME_MODE
  RESUME_FROM_PATH=${RESUME_FROM_PATH:-<none>} MIA_LLM_CONFIG=$MIA_LLM_CONFIG
  WANDB_MODE=$WANDB_MODE VERL_PYTHON=$VERL_PYTHON; DRY_RUN=1 prints the command.
PLAN_URL and REPLAN_URL must name one serve service (its /execute and /continue).
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

executor="$(base_url "$PLAN_URL")"
if [ "$executor" != "$(base_url "$REPLAN_URL")" ]; then
  echo "run_planner_grpo.sh: PLAN_URL and REPLAN_URL must be one serve service" >&2; exit 2
fi
resume_overrides
run_verl planner_grpo \
  "actor_rollout_ref.model.path=$MODEL_PATH" \
  "data.train_files=$TRAIN_FILES" "data.val_files=$VAL_FILES" \
  "trainer.n_gpus_per_node=$N_GPUS" "trainer.nnodes=$NNODES" \
  "trainer.default_local_dir=$CKPT_DIR" \
  "actor_rollout_ref.rollout.max_model_len=$MODEL_MAX_LEN" \
  "mia.services.executor_url=$executor" "mia.services.memory_url=$(base_url "$MEMORY_URL")" \
  "${RESUME[@]}" "$@"
