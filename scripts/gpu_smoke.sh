#!/usr/bin/env bash
# GPU smoke checks for the RL engine, one PASS/FAIL/SKIP line per check:
#   vllm  the vLLM generator (tiny Qwen2, float32): greedy rollouts match transformers before and
#         after a weight update through update_weights(state_dict=...) (the trainer's sync path)
#   fsdp  a 2-process NCCL FSDP2 GRPO step on a randomly initialised Qwen2.5-VL-7B-sized model
#         (built from its config on the meta device; needs 2 GPUs with ~70 GB free each: fp32
#         master weights, gradients and AdamW state sharded over the two; SKIP otherwise)
# Nothing is downloaded. Exit status 1 if a check failed.
#
# Usage: bash scripts/gpu_smoke.sh                     # both checks
#        bash scripts/gpu_smoke.sh --checks fsdp       # one check
#        bash scripts/gpu_smoke.sh --tiny --device cpu --checks fsdp   # the same code on a CPU
# Env:   PYTHON (default .venv/bin/python, else python3)
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
