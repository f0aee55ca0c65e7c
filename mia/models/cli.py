"""``mia models``: build or locate the embedded default model's cached folder."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mia models", description="Build or inspect the embedded default model."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build (or reuse) the cached model folder, print its path")
    build.add_argument("--force", action="store_true", help="rebuild even if a valid cache exists")
    build.add_argument("--home", type=Path, help="cache root (default: $MIA_HOME or ~/.cache/mia)")
    path = sub.add_parser("path", help="print the cached folder (exit 1 if it is not built yet)")
    path.add_argument("--home", type=Path, help="cache root (default: $MIA_HOME or ~/.cache/mia)")
    path.add_argument("--json", action="store_true", help="print path, built flag and recipe")
    return parser


def main(argv: list[str]) -> None:
    from mia.models import embedded

    args = _parser().parse_args(argv)
    if args.action == "build":
        print(embedded.embedded_model_dir(args.home, force=args.force))
        return
    folder = embedded.cache_dir(args.home)
    marker = embedded.cache_marker(args.home)
    if args.json:
        print(json.dumps({"path": str(folder), "built": marker is not None, "marker": marker}))
    else:
        print(folder)
    if marker is None:
        print("not built yet: run `mia models build`", file=sys.stderr)
        raise SystemExit(1)
