"""``mia world``: generate the synthetic research world into a folder.

    mia world --out DIR [--seed 0] [--size small|default|large] [--config FILE.yaml]
              [--set KEY=VALUE ...] [--quiet]

Sizes are presets (``configs/world/<size>.yaml`` mirrors them); ``--config`` and ``--set``
override single fields on top of the chosen size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mia.errors import MiaError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, exit 2 (via MiaError in mia.cli), instead of argparse's usage dump.
        raise MiaError(message)


def _parser() -> argparse.ArgumentParser:
    from mia.data.world import PRESETS

    p = _Parser(prog="mia world", description="Generate the synthetic research world.")
    p.add_argument(
        "--out", required=True, type=Path, help="output folder (replaced if it holds a world)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed -> same bytes)")
    p.add_argument("--size", default="default", choices=list(PRESETS), help="size preset")
    p.add_argument(
        "--config", type=Path, help="YAML of WorldConfig fields overriding the size preset"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one WorldConfig field (repeatable)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if args.config is not None:
        if not args.config.is_file():
            raise MiaError(f"--config {args.config}: no such file")
        try:
            loaded = yaml.safe_load(args.config.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise MiaError(
                f"--config {args.config}: invalid YAML ({str(err).splitlines()[0]})"
            ) from None
        if not isinstance(loaded, dict):
            raise MiaError(f"--config {args.config}: expected a mapping of WorldConfig fields")
        data.update(loaded)
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise MiaError(f"--set {item!r}: expected KEY=VALUE")
        data[key.strip()] = yaml.safe_load(value)
    return data


def main(argv: list[str] | None = None) -> None:
    from mia.data.world import PRESETS, World, WorldConfig
    from mia.data.world_io import check_target

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.seed < 0:
        raise MiaError(f"--seed must be >= 0, got {args.seed}")
    overrides = _overrides(args)
    size: str | WorldConfig = args.size
    if overrides:
        size = WorldConfig.from_mapping(overrides, base=PRESETS[args.size])

    check_target(args.out)  # fail before minutes of work, not after
    start = time.monotonic()

    def log(message: str) -> None:
        if not args.quiet:
            print(
                f"[world {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True
            )

    log(f"generating seed={args.seed} size={args.size}{' (with overrides)' if overrides else ''}")
    world = World.generate(args.seed, size, log=log)
    manifest = world.write(args.out, log=log if not args.quiet else None)
    counts = manifest["counts"]["questions"]
    summary = ", ".join(f"{split}: {sum(c.values())}" for split, c in counts.items())
    print(
        f"wrote {args.out} ({manifest['counts']['passages']} passages; questions {summary}; "
        f"{time.monotonic() - start:.1f}s)"
    )


if __name__ == "__main__":
    try:
        main()
    except MiaError as err:
        print(f"mia world: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
