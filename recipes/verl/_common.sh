# Sourced by the recipes/verl run scripts (not a stage itself): the repo root, the Python that
# has veRL (and vLLM: a GPU machine), the reference's environment defaults, DRY_RUN and --help.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${VERL_PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv-verl/bin/python" ]; then VERL_PYTHON="$ROOT/.venv-verl/bin/python"; else VERL_PYTHON=python3; fi
fi
# As the reference's run scripts: W&B offline, no tokenizer threads, no hub downloads unless
# asked for; Ray without its auth token for a private cluster.
export WANDB_MODE="${WANDB_MODE:-offline}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export VLLM_USE_V1="${VLLM_USE_V1:-1}"
NNODES="${NNODES:-1}"
RESUME_MODE="${RESUME_MODE:-auto}"          # auto | disable | resume_path
RESUME_FROM_PATH="${RESUME_FROM_PATH:-}"    # with resume_path: <CKPT_DIR>/global_step_K

# A service URL as the reference's variables give it (…/replan_train, …/plan) -> its base.
base_url() {
  local url="${1%/}"
  for route in /replan_train /replan /plan /execute /continue /memory; do
    url="${url%$route}"
  done
  printf '%s' "$url"
}

# veRL's resume keys (trainer.resume_mode / resume_from_path) from RESUME_MODE / RESUME_FROM_PATH.
resume_overrides() {
  RESUME=("trainer.resume_mode=$RESUME_MODE")
  if [ -n "$RESUME_FROM_PATH" ]; then
    RESUME=("trainer.resume_mode=resume_path" "trainer.resume_from_path=$RESUME_FROM_PATH")
  fi
}

# Run veRL's PPO entry point with a recipe config from recipes/verl/config, from the repo root
# (the agent loop config path is relative to it).
run_verl() {
  local name="$1"; shift
  local cmd=("$VERL_PYTHON" -m verl.trainer.main_ppo "--config-path=$ROOT/recipes/verl/config"
             "--config-name=$name" "$@")
  if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${cmd[@]}"; printf '\n'; return 0; fi
  cd "$ROOT"
  exec "${cmd[@]}"
}

wants_help() {
  case "${1:-}" in -h|--help|help) return 0 ;; *) return 1 ;; esac
}
