#!/usr/bin/env bash
# Merge a sharded RL checkpoint (one step folder) into a Hugging Face folder that transformers
# and vLLM load (scripts/serve_llm.sh with MODEL=TARGET_DIR).
set -euo pipefail
. "$(dirname "$0")/_common.sh"

LOCAL_DIR="${LOCAL_DIR:-}"
TARGET_DIR="${TARGET_DIR:-}"
if [ $# -ge 2 ] && [ "${1#-}" = "$1" ] && [ "${2#-}" = "$2" ]; then
  LOCAL_DIR="$1"; TARGET_DIR="$2"; shift 2
fi

usage() {
  cat <<USAGE
usage: scripts/merge.sh LOCAL_DIR TARGET_DIR [extra merger args...]

Runs: python -m mia.rl.model_merger merge --backend fsdp --local_dir LOCAL_DIR --target_dir TARGET_DIR
Variables (environment overrides, or the two positional arguments):
  LOCAL_DIR  a checkpoint step folder (e.g. runs/exp/checkpoints/global_step_50/actor)
  TARGET_DIR the output Hugging Face folder
  PYTHON=$PYTHON; DRY_RUN=1 prints the command instead of running it.
Extra args: --dtype bfloat16, --tie-word-embedding, --trust-remote-code (python -m
mia.rl.model_merger merge --help).
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi
if [ -z "$LOCAL_DIR" ] || [ -z "$TARGET_DIR" ]; then
  usage >&2
  echo "merge.sh: error: LOCAL_DIR and TARGET_DIR are required" >&2
  exit 2
fi

run "$PYTHON" -m mia.rl.model_merger merge --backend fsdp \
  --local_dir "$LOCAL_DIR" --target_dir "$TARGET_DIR" "$@"
