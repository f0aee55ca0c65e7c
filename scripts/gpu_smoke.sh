#!/usr/bin/env bash
# GPU smoke checks for the RL engine, one PASS/FAIL/SKIP line per check:
#   vllm  the vLLM generator (tiny Qwen2, float32): greedy rollouts match transformers before and
#         after a weight update through update_weights(state_dict=...) (the trainer's sync path)
#   fsdp  a 2-process NCCL FSDP2 GRPO step on a randomly initialised Qwen2.5-VL-7B-sized model
#         (built from its config on the meta device; needs 2 GPUs with ~70 GB free each: fp32
#         master weights, gradients and AdamW state sharded over the two; SKIP otherwise)
#   rollout_vl  image-question rollouts through vLLM on a Qwen2.5-VL-7B-shaped model (tokens/s)
#   verl  one step of each recipes/verl recipe (executor_grpo, planner_grpo, ttrl) with veRL
#         (VERL_PYTHON: a Python with veRL 0.9 + vLLM; default .venv-verl/bin/python) and the same
#         step with mia.rl, on a random-initialised small Qwen2.5-VL-shaped model and local
#         services; prints step time and tokens/s for both (SKIP without a GPU or veRL)
# Nothing is downloaded. Exit status 1 if a check failed.
#
# Usage: bash scripts/gpu_smoke.sh                     # every check
#        bash scripts/gpu_smoke.sh --checks fsdp       # one check
#        bash scripts/gpu_smoke.sh --tiny --device cpu --checks fsdp   # the same code on a CPU
#        bash scripts/gpu_smoke.sh --checks verl       # veRL vs mia.rl, one line per recipe
# Env:   PYTHON (default .venv/bin/python, else python3), VERL_PYTHON (the verl check)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | sed 's/^/gpu: /'
else
  echo "gpu: none visible (nvidia-smi not found)"
fi
exec "$PY" scripts/gpu_smoke.py "$@"
