#!/usr/bin/env bash
# Offline retrieval: build a BM25 (or dense) index of a JSONL corpus, then serve it over the
# Search-R1 /retrieve API on :8001.
set -euo pipefail
. "$(dirname "$0")/_common.sh"

CMD="all"
case "${1:-}" in build|serve|all) CMD="$1"; shift ;; esac
CORPUS="${CORPUS:-runs/world/corpus.jsonl}"   # {"id", "contents"} per line (mia world --out runs/world)
INDEX="${INDEX:-runs/index/bm25}"
METHOD="${METHOD:-bm25}"                       # bm25 | dense
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8001}"

usage() {
  cat <<USAGE
usage: scripts/local_search.sh [build|serve|all] [extra args for that step...]

  build  python -m local_search build --corpus CORPUS --out INDEX --method METHOD
  serve  python -m local_search serve --index INDEX --host HOST --port PORT
  all    build when INDEX does not exist yet, then serve (default)

Variables (environment overrides; current values):
  CORPUS=$CORPUS INDEX=$INDEX METHOD=$METHOD HOST=$HOST PORT=$PORT PYTHON=$PYTHON
  LOCAL_SEARCH_TOKEN (optional bearer token); DRY_RUN=1 prints the commands.
See: python -m local_search build --help, python -m local_search serve --help
USAGE
}
if wants_help "${1:-}"; then usage; exit 0; fi

build() { step "$PYTHON" -m local_search build --corpus "$CORPUS" --out "$INDEX" --method "$METHOD" "$@"; }
serve() { run "$PYTHON" -m local_search serve --index "$INDEX" --host "$HOST" --port "$PORT" "$@"; }
case "$CMD" in
  build) build "$@" ;;
  serve) serve "$@" ;;
  all) if [ ! -d "$INDEX" ]; then build; fi; serve "$@" ;;
esac
