# Sourced by the stage scripts (not a stage itself): repo root, the Python to use, offline
# defaults, and `run` / `step`, which print the command instead of running it when DRY_RUN=1.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
# No hub downloads unless asked for (HF_HUB_OFFLINE=0 lets vLLM fetch a model by name).
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

# Run the stage's command in place of this shell (signals reach it directly).
run() {
  if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; printf '\n'; return 0; fi
  exec "$@"
}

# Run a command and come back (for scripts with several steps).
step() {
  if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; printf '\n'; return 0; fi
  "$@"
}

wants_help() {
  case "${1:-}" in -h|--help|help) return 0 ;; *) return 1 ;; esac
}

# The training stages (train_executor.sh, train_planner.sh, ttrl.sh): CONFIG_NAME is a Hydra
# config name of the role (empty: its default); Ray runs without its auth token and W&B offline
# unless set.
train_defaults() {
  CONFIG_NAME="${CONFIG_NAME:-}"
  export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
  export WANDB_MODE="${WANDB_MODE:-offline}"
}

# The variables a training stage's usage lists; $1: the stage's own ones, shown first.
train_vars() {
  cat <<VARS
Variables (environment overrides; current values):
  ${1:-}CONFIG_NAME=${CONFIG_NAME:-<default>} PYTHON=$PYTHON RAY_AUTH_MODE=$RAY_AUTH_MODE
  WANDB_MODE=$WANDB_MODE HF_HUB_OFFLINE=$HF_HUB_OFFLINE; DRY_RUN=1 prints the command.
VARS
}
