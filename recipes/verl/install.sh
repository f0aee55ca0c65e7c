#!/usr/bin/env bash
# A GPU venv for the recipes (.venv-verl; the run scripts' default VERL_PYTHON): MIA with its GPU
# extra (vLLM, flash-attn), veRL 0.9.1 installed --no-deps, and the dependencies veRL's code
# imports. veRL 0.9.1 pins transformers <5.11 while MIA needs >=5.16.1: as in
# scripts/install_peers.sh (where veRL's agent-loop, dataset and reward code are tested beside
# transformers 5.19), veRL's pin is not followed. Its FSDP workers and vLLM server have not run
# with this stack yet (no GPU here; docs/benchmarks.md).
# Usage: bash recipes/verl/install.sh        (VENV=/path to choose the venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv-verl}"
PY="${PYTHON:-python3}"
VERL_VERSION="${VERL_VERSION:-0.9.1}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[gpu]'
"$VENV/bin/python" -m pip install -q --no-deps "verl==${VERL_VERSION}"
"$VENV/bin/python" -m pip install -q "TransferQueue>=0.1.10" pyzmq msgspec codetiming torchdata \
    pylatexenc dill pybind11 "tensordict>=0.8.0,<=0.10.0,!=0.9.0" tensorboard "ray[default]>=2.41.0"
# Smoke check from a neutral folder (a folder named like a package in the cwd would shadow it).
VPY="$(cd "$VENV" && pwd)/bin/python"
(cd /tmp && "$VPY" -c 'import verl, vllm, mia.verl.agent_loops
print("verl", verl.__version__, "vllm", vllm.__version__)')
