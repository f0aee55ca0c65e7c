"""``mia gold``: gold Executor trajectories and Planner plans for a world (SFT cold start).

    mia gold --world DIR --index DIR --out FILE [--split train|test|all] [--limit N]
             [--image-cache DIR] [--agent-config FILE] [--set KEY=VALUE ...]
             [--no-plan | --alternate-plan] [--style full|concise|terse] [--skipped FILE] [--quiet]

The world is regenerated from ``DIR/world.json`` (seed + config) and checked against the
folder's ``corpus.jsonl`` hash; the index must be built from that corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mia.errors import MiaError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise MiaError(message)  # one line, exit 2 (mia.cli)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mia gold",
        description="Write gold Executor trajectories and Planner plans for a world's questions.",
    )
    p.add_argument("--world", required=True, type=Path, help="world folder (mia world --out)")
    p.add_argument("--index", required=True, type=Path,
                   help="local_search index of the world's corpus.jsonl")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output JSONL file")
    p.add_argument("--split", default="train", choices=["train", "test", "all"])
    p.add_argument("--limit", type=int, help="only the first N questions of the split")
    p.add_argument("--image-cache", type=Path,
                   help="image-search cache (default: WORLD/image_cache)")  # fmt: skip
    p.add_argument("--agent-config", type=Path,
                   help="agent YAML (observation format, truncation, top-k); default: built-in "
                   "defaults = configs/agent/default.yaml")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one agent-config key (dot path, repeatable)")  # fmt: skip
    plan = p.add_mutually_exclusive_group()
    plan.add_argument("--no-plan", action="store_true",
                      help="Executor prompts without the gold plan (question only)")  # fmt: skip
    plan.add_argument("--alternate-plan", action="store_true",
                      help="about half the questions (by id) with the gold plan, the rest "
                      "without")  # fmt: skip
    p.add_argument("--style", default="full", choices=["full", "concise", "terse"],
                   help="how much the Executor's <think> says (docs/gold.md)")  # fmt: skip
    p.add_argument("--skipped", type=Path,
                   help="also write the skipped questions with reasons (JSONL)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def load_world_dir(folder: Path) -> Any:
    """The :class:`World` a ``mia world`` folder was written from, regenerated from its
    manifest and checked against its ``corpus.jsonl`` hash."""
    from mia.apps.gold import corpus_sha256
    from mia.data.world import PRESETS, World, WorldConfig
    from mia.data.world_io import MANIFEST

    path = folder / MANIFEST
    if not path.is_file():
        raise MiaError(f"{folder} is not a world folder (no {MANIFEST}; make one with mia world)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        seed, config = int(manifest["seed"]), WorldConfig(**manifest["config"]).validate()
        want = manifest["files"]["corpus.jsonl"]
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise MiaError(f"{path}: unreadable world manifest ({err})") from None
    size = manifest.get("size")
    world = World.generate(seed, size if PRESETS.get(size) == config else config)
    if corpus_sha256(world) != want:
        raise MiaError(
            f"{folder}: regenerating seed {seed} does not reproduce its corpus.jsonl (written by "
            "another version of the world generator?): regenerate the world folder"
        )
    return world


def main(argv: list[str] | None = None) -> None:
    from local_search import read_manifest
    from mia.agent import load_agent_config
    from mia.apps.gold import generate_gold, write_gold

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.limit is not None and args.limit < 0:
        raise MiaError(f"--limit must be >= 0, got {args.limit}")
    if args.out.is_dir():
        raise MiaError(f"--out {args.out} is a folder; give a file name")
    read_manifest(args.index)  # a bad index fails before the world is regenerated
    cache = args.image_cache
    if cache is None and (args.world / "image_cache").is_dir():
        cache = args.world / "image_cache"
    cfg = load_agent_config(args.agent_config, args.overrides)
    start = time.monotonic()

    def log(message: str) -> None:
        if not args.quiet:
            print(f"[gold {time.monotonic() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    log(f"loading world {args.world}")
    world = load_world_dir(args.world)
    log(f"replaying {args.split} questions through the Executor loop")
    report = generate_gold(
        world,
        args.index,
        args.split,
        cache,
        agent_config=cfg,
        with_plan="alternate" if args.alternate_plan else not args.no_plan,
        limit=args.limit,
        progress=not args.quiet,
        style=args.style,
    )
    write_gold(args.out, report.examples)
    if args.skipped is not None:
        lines = [json.dumps(s.__dict__, ensure_ascii=False) + "\n" for s in report.skipped]
        args.skipped.parent.mkdir(parents=True, exist_ok=True)
        args.skipped.write_text("".join(lines), encoding="utf-8")
    for s in report.skipped[:10]:
        log(f"skipped {s.id} ({s.type}, {s.relation}): {s.reason}")
    if len(report.skipped) > 10:
        log(f"... and {len(report.skipped) - 10} more skipped")
    print(f"wrote {args.out}: {report.summary()} ({time.monotonic() - start:.1f}s)")


if __name__ == "__main__":
    try:
        main()
    except MiaError as err:
        print(f"mia gold: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
