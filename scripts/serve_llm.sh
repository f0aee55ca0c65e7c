#!/usr/bin/env bash
# Serve a model with vLLM's OpenAI-compatible server: the Executor on :8000, or the
# Manager / Planner / Judge model on :8002, both as "qwen" (what configs/llm/vllm.yaml expects).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

ROLE="${ROLE:-executor}"
case "${1:-}" in executor|manager|judge|planner) ROLE="$1"; shift ;; esac
EXECUTOR_MODEL="${EXECUTOR_MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}"
MANAGER_MODEL="${MANAGER_MODEL:-Qwen/Qwen3-32B}"
if [ "$ROLE" = executor ]; then DEFAULT_MODEL="$EXECUTOR_MODEL"; DEFAULT_PORT=8000
else DEFAULT_MODEL="$MANAGER_MODEL"; DEFAULT_PORT=8002; fi
MODEL="${MODEL:-$DEFAULT_MODEL}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-$DEFAULT_PORT}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-qwen}"
TP="${TP:-1}"                                  # tensor parallel size (the reference used 4)
DEVICE="${DEVICE:-auto}"                       # auto | gpu | cpu (auto: gpu if nvidia-smi works)
if [ "$DEVICE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=gpu
  else DEVICE=cpu; fi
fi
if [ "$DEVICE" = cpu ]; then DEFAULT_MEM=0.2; else DEFAULT_MEM=0.8; fi
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-$DEFAULT_MEM}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-}"             # empty = the model's own
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-hermes}"
# vLLM's interpreter: .venv-vllm (scripts/install_vllm_cpu.sh) when present, else $PYTHON.
if [ -x "$ROOT/.venv-vllm/bin/python" ]; then DEFAULT_VLLM_PYTHON="$ROOT/.venv-vllm/bin/python"
else DEFAULT_VLLM_PYTHON="$PYTHON"; fi
VLLM_PYTHON="${VLLM_PYTHON:-$DEFAULT_VLLM_PYTHON}"
export VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-${MIA_HOME:-$HOME/.cache/mia}/vllm}"

usage() {
  cat <<USAGE
usage: scripts/serve_llm.sh [executor|manager] [extra vLLM server args...]

Starts python -m vllm.entrypoints.openai.api_server for one role:
  executor  the Executor (default $EXECUTOR_MODEL) on port 8000
  manager   the Manager/Planner/Judge model (default $MANAGER_MODEL) on port 8002
            (aliases: judge, planner)
On CPU (vllm-cpu) it adds --enforce-eager and a 0.2 memory share.

Variables (environment overrides; current values):
  ROLE=$ROLE MODEL=$MODEL
  HOST=$HOST PORT=$PORT SERVED_MODEL_NAME=$SERVED_MODEL_NAME TP=$TP
  DEVICE=$DEVICE GPU_MEMORY_UTILIZATION=$GPU_MEMORY_UTILIZATION MAX_MODEL_LEN=${MAX_MODEL_LEN:-<model>}
  TOOL_CALL_PARSER=$TOOL_CALL_PARSER VLLM_PYTHON=$VLLM_PYTHON HF_HUB_OFFLINE=$HF_HUB_OFFLINE
  DRY_RUN=1 prints the command instead of running it.
Examples:
  MODEL=runs/executor/hf scripts/serve_llm.sh executor
  HF_HUB_OFFLINE=0 TP=4 scripts/serve_llm.sh manager
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

CPU_ARGS=()
if [ "$DEVICE" = cpu ]; then CPU_ARGS=(--enforce-eager); fi
run "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" --served-model-name "$SERVED_MODEL_NAME" \
  --host "$HOST" --port "$PORT" \
  --tensor-parallel-size "$TP" --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION" \
  --enable-auto-tool-choice --tool-call-parser "$TOOL_CALL_PARSER" \
  ${MAX_MODEL_LEN:+--max-model-len "$MAX_MODEL_LEN"} \
  "${CPU_ARGS[@]}" "$@"
