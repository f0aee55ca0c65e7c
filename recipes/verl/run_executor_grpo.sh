#!/usr/bin/env bash
# Executor GRPO on veRL (recipes/verl/config/executor_grpo.yaml; the reference's Executor-Train
# run script). Needs a GPU node with veRL + vLLM (VERL_PYTHON), and the services: local_search
# (:8001, SERVICE_URL), memory_serve with the Planner for /replan_train (:5000, REPLAN_URL) and
# the judge LLM (:8002, configs/llm/$MIA_LLM_CONFIG.yaml).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}"
TRAIN_FILES="${TRAIN_FILES:-data/verl/executor_train.parquet}"
VAL_FILES="${VAL_FILES:-data/verl/executor_val.parquet}"
N_GPUS="${N_GPUS:-8}"
REPLAN_URL="${REPLAN_URL:-http://127.0.0.1:5000/replan_train}"
SERVICE_URL="${SERVICE_URL:-http://127.0.0.1:8001}"
TEST_CACHE_DIR="${TEST_CACHE_DIR:-}"          # image-search caches, comma-separated
MODEL_MAX_LEN="${MODEL_MAX_LEN:-32768}"
CKPT_DIR="${CKPT_DIR:-checkpoints/mia/executor_grpo}"
export MIA_LLM_CONFIG="${MIA_LLM_CONFIG:-vllm}"

usage() {
  cat <<USAGE
usage: recipes/verl/run_executor_grpo.sh [hydra overrides...]

Runs: $VERL_PYTHON -m verl.trainer.main_ppo --config-path=recipes/verl/config \\
        --config-name=executor_grpo [the variables below as overrides] [overrides...]
Variables (environment; current values):
  MODEL_PATH=$MODEL_PATH TRAIN_FILES=$TRAIN_FILES VAL_FILES=$VAL_FILES
  N_GPUS=$N_GPUS NNODES=$NNODES REPLAN_URL=$REPLAN_URL SERVICE_URL=$SERVICE_URL
  TEST_CACHE_DIR=${TEST_CACHE_DIR:-<none>} MODEL_MAX_LEN=$MODEL_MAX_LEN CKPT_DIR=$CKPT_DIR
  RESUME_MODE=$RESUME_MODE RESUME_FROM_PATH=${RESUME_FROM_PATH:-<none>} MIA_LLM_CONFIG=$MIA_LLM_CONFIG
  WANDB_MODE=$WANDB_MODE VERL_PYTHON=$VERL_PYTHON; DRY_RUN=1 prints the command.
Data: recipes/verl/prepare_data.sh executor IN OUT. Merge: scripts/merge.sh CKPT_DIR/global_step_K/actor OUT.
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

resume_overrides
caches=()
if [ -n "$TEST_CACHE_DIR" ]; then
  caches=("mia.agent.tools.web_image_to_image_search.params.cache_roots=[${TEST_CACHE_DIR}]")
fi
run_verl executor_grpo \
  "actor_rollout_ref.model.path=$MODEL_PATH" \
  "data.train_files=$TRAIN_FILES" "data.val_files=$VAL_FILES" \
  "trainer.n_gpus_per_node=$N_GPUS" "trainer.nnodes=$NNODES" \
  "trainer.default_local_dir=$CKPT_DIR" \
  "actor_rollout_ref.rollout.max_model_len=$MODEL_MAX_LEN" \
  "mia.services.memory_url=$(base_url "$REPLAN_URL")" \
  "mia.agent.tools.search.params.url=$SERVICE_URL" \
  "${caches[@]}" "${RESUME[@]}" "$@"
