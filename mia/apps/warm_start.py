"""Warm-started embedded roles: SmolLM2 after a short SFT on gold transcripts (the cold start).

Out of the box the embedded SmolLM2-135M reads passages but never calls a tool (docs/sft.md),
so the demo's Executor and Planner are first fine-tuned on the gold transcripts of a synthetic
world's train split. Built on first use, with progress:

    world (seed of the recipe) -> BM25 index -> gold transcripts (cached under $MIA_HOME/data/gold)
    -> SFT of the base model (mia.rl.sft, configs/sft/<role>.yaml) -> merged HF folder

The folder is ``$MIA_HOME/models/warm-<role>-<key>``, written atomically (a temporary sibling
renamed into place; the marker ``mia-model.json`` is written last), behind a file lock so
concurrent callers build once. ``key`` hashes the recipe (the composed SFT config, minus where
it runs and logs), the data version (world format, :data:`WARM_DATA_VERSION`, the prompt and
gold phrase tables) and the base model's marker: a changed recipe gets a new folder.

    from mia.apps.warm_start import warm_executor_dir, warm_planner_dir
    LocalChat(warm_executor_dir())
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia.errors import MiaError
from mia.models.embedded import file_lock, read_marker
from mia.paths import atomic_dir, atomic_write_text, mia_home

if TYPE_CHECKING:
    from mia.rl.sft import GoldWorldConfig

ROLES = ("executor", "planner")
MARKER = "mia-model.json"
RECIPE = "warm-start-sft"
# Bump when the way gold data is made changes in a way the fingerprint below cannot see.
WARM_DATA_VERSION = 2  # 2: gold styles (concise, terse), alternate plans, several worlds
# Recipe keys that say where a build runs and logs, not what it builds.
NOT_RECIPE = ("run_dir", "output_dir", "logging", "checkpoint_dir", "resume", "save_freq",
              "keep_last", "export", "export_dtype")  # fmt: skip

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _stable(value: Any) -> str:
    """JSON fallback that is the same in every process: a function by its source (``str`` of a
    function holds its memory address, which changed the cache key on every run), a set sorted."""
    if callable(value):
        import inspect

        try:
            return "fn:" + inspect.getsource(value).strip()
        except (OSError, TypeError):
            return "fn:" + getattr(value, "__qualname__", type(value).__name__)
    if isinstance(value, set | frozenset):
        return json.dumps(sorted(map(_stable_item, value)))
    return str(value)


def _stable_item(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_stable)


def _sha(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=_stable).encode()).hexdigest()


# ----------------------------------------------------------------------------- fingerprints


def _constants(module: Any) -> dict[str, Any]:
    """The upper-case text/table constants of a module (prompts, phrase tables)."""
    out = {}
    for name, value in sorted(vars(module).items()):
        if name.isupper() and isinstance(value, str | dict | tuple | list):
            out[name] = value
    return out


def data_fingerprint() -> dict[str, Any]:
    """What the gold data depends on beyond the recipe: the world format, the prompts the agent
    loop and the Planner render, the gold phrase tables, and :data:`WARM_DATA_VERSION`."""
    from mia.apps import gold
    from mia.data.world_io import WORLD_FORMAT_VERSION
    from mia.prompts import executor, planner

    return {
        "warm_data_version": WARM_DATA_VERSION,
        "world_format": WORLD_FORMAT_VERSION,
        "prompts": _sha([_constants(executor), _constants(planner)]),
        "gold": _sha(_constants(gold)),
    }


def base_fingerprint(model_dir: str | Path) -> dict[str, Any]:
    """The base model's identity: its build marker when it has one (the embedded model: no
    need to read 260 MB), else the sha256 of every file in the folder."""
    folder = Path(model_dir)
    marker = folder / MARKER
    if marker.is_file():
        data = json.loads(marker.read_text())
        data.pop("built_at", None)
        data.pop("seconds", None)
        return {"marker": data}
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            h = hashlib.sha256()
            with f.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    h.update(chunk)
            files[f.name] = h.hexdigest()
    if "config.json" not in files:
        raise MiaError(f"warm start: base model folder has no config.json: {folder}")
    return {"files": files}


# ----------------------------------------------------------------------------- gold data


def gold_world_file(
    g: GoldWorldConfig | Mapping[str, Any],
    home: str | Path | None = None,
    *,
    say: Log | None = _stderr,
) -> Path:
    """The gold transcripts of a synthetic world as a JSONL file, built once and cached.

    ``$MIA_HOME/data/gold/w<seed>[+<seed>...]-<size>-<split>-<key>.jsonl``. Each row is a
    :class:`mia.apps.gold.GoldExample` plus ``variant`` (``plan`` / ``no_plan``); with
    ``plan: both`` a question has one row of each (same ``id``). Several seeds: the worlds'
    rows one after the other (ids ``w<seed>_...`` stay distinct).
    """
    from mia.rl.policy import config_from_dict
    from mia.rl.sft import GoldWorldConfig

    if is_dataclass(g) and not isinstance(g, GoldWorldConfig):
        g = asdict(g)  # e.g. the class of ``python -m mia.rl.sft`` (``__main__``), not this one
    cfg = g if isinstance(g, GoldWorldConfig) else config_from_dict(GoldWorldConfig, dict(g))
    cfg.validate()
    emit = say or (lambda _line: None)
    root = (Path(home) if home is not None else mia_home()) / "data" / "gold"
    key = _sha({"gold": asdict(cfg), "data": data_fingerprint()})[:12]
    seeds = "+".join(str(s) for s in cfg.seeds)
    path = root / f"w{seeds}-{cfg.size}-{cfg.split}-{key}.jsonl"
    if path.is_file():
        return path
    with file_lock(root / ".gold.lock"):
        if path.is_file():
            return path
        started = time.monotonic()
        rows = _build_gold(cfg, root, emit)
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        emit(f"gold: {len(rows)} conversations in {time.monotonic() - started:.0f} s -> {path}")
    return path


def _build_gold(cfg: GoldWorldConfig, root: Path, emit: Log) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seed in cfg.seeds:
        rows += _build_world_gold(cfg, seed, root, emit)
    return rows


def _build_world_gold(
    cfg: GoldWorldConfig, seed: int, root: Path, emit: Log
) -> list[dict[str, Any]]:
    from local_search import build_index, open_index
    from mia.agent import AgentConfig
    from mia.apps.gold import generate_gold, gets_plan
    from mia.data.world import World

    t0 = time.monotonic()
    world = World.generate(seed, cfg.size)
    # Only the asked types (image questions need a vision model): the corpus stays whole.
    view = copy.copy(world)
    view.questions = [q for q in world.questions if q.type in cfg.types]
    emit(
        f"gold: world seed {seed} ({cfg.size}): {len(world.passages)} passages, "
        f"{len(view.split(cfg.split)) if cfg.split != 'all' else len(view.questions)} "
        f"{cfg.split} questions of types {', '.join(cfg.types)} ({time.monotonic() - t0:.1f} s)"
    )
    root.mkdir(parents=True, exist_ok=True)
    agent = AgentConfig()
    agent.tools["search"]["params"]["topk"] = cfg.topk
    variants: list[bool | str] = {
        "with": [True], "without": [False], "both": [True, False], "alternate": ["alternate"]
    }[cfg.plan]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=".gold-build-", dir=root) as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        # The format World.write uses; generate_gold checks the index against the corpus hash.
        corpus.write_text(
            "".join(
                json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n"
                for p in world.passages
            ),
            encoding="utf-8",
        )
        t0 = time.monotonic()
        with _quiet_stderr():
            build_index(corpus, Path(tmp) / "index", "bm25")
        emit(f"gold: BM25 index built ({time.monotonic() - t0:.1f} s)")
        rows: list[dict[str, Any]] = []
        with contextlib.closing(open_index(Path(tmp) / "index")) as retriever:
            for with_plan in variants:
                label = (
                    "with and without"
                    if with_plan == "alternate"
                    else ("with" if with_plan else "without")
                )
                emit(f"gold: replaying transcripts {label} plans ({cfg.style} style)")
                report = generate_gold(
                    view,
                    retriever,
                    cfg.split,
                    agent_config=agent,
                    with_plan=with_plan,
                    limit=cfg.limit,
                    progress=True,
                    style=cfg.style,
                )
                emit(f"gold: {report.summary()}")
                for ex in report.examples:
                    plan = gets_plan(ex.id, with_plan)
                    rows.append({**ex.to_dict(), "variant": "plan" if plan else "no_plan"})
            if cfg.planner_memory:
                from mia.apps.planner_gold import planner_memory_examples

                emit("gold: plan chats with retrieved memories")
                memory_rows = planner_memory_examples(
                    world, retriever, split=cfg.split, style=cfg.style, agent_config=agent
                )
                emit(f"gold: {len(memory_rows)} plan chats with memories")
                rows += [{**r, "variant": "memory"} for r in memory_rows]
    return rows


@contextlib.contextmanager
def _quiet_stderr() -> Any:
    """bm25s draws its own progress bars for a sub-second build; keep the console readable."""
    import io

    saved = sys.stderr
    sys.stderr = io.StringIO()
    try:
        yield
    finally:
        sys.stderr = saved


# ----------------------------------------------------------------------------- recipes


def warm_recipe(role: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The composed SFT recipe of a role (``configs/sft/<role>.yaml`` + Hydra overrides)."""
    from mia.rl.sft import compose

    if role not in ROLES:
        raise MiaError(f"unknown warm-start role {role!r} (one of {', '.join(ROLES)})")
    return compose(role, list(overrides))


def recipe_key(recipe: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The cache key: recipe (minus run location/logging) + data version + base model."""
    from mia.rl.sft import SftConfig

    full = SftConfig.from_dict(dict(recipe)).to_dict()  # defaults filled: a no-op edit keeps it
    semantic = {k: v for k, v in full.items() if k not in NOT_RECIPE and k != "model_path"}
    return _sha({"recipe": semantic, "data": data_fingerprint(), "base": dict(base)})[:16]


def warm_cache_dir(role: str, key: str, home: str | Path | None = None) -> Path:
    return (Path(home) if home is not None else mia_home()) / "models" / f"warm-{role}-{key}"


def _is_valid(folder: Path, key: str) -> bool:
    marker = read_marker(folder)
    return (
        marker is not None
        and marker.get("recipe") == RECIPE
        and marker.get("key") == key
        and (folder / "config.json").is_file()
    )


# ----------------------------------------------------------------------------- building


def warm_role_dir(
    role: str,
    *,
    home: str | Path | None = None,
    base_model_dir: str | Path | None = None,
    recipe: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    log: Log | None = _stderr,
) -> Path:
    """The warm-started folder of ``role`` (executor | planner), built on first use.

    ``base_model_dir``: the model to fine-tune (default: the embedded SmolLM2, built if
    needed). ``recipe``: a full SFT config mapping instead of ``configs/sft/<role>.yaml``;
    ``overrides``: Hydra overrides of that file. ``force`` rebuilds a valid cache.
    """
    emit = log or (lambda _line: None)
    if role not in ROLES:
        raise MiaError(f"unknown warm-start role {role!r} (one of {', '.join(ROLES)})")
    cfg = dict(recipe) if recipe is not None else warm_recipe(role, overrides)
    if base_model_dir is None:
        from mia.models.embedded import embedded_model_dir

        base_model_dir = embedded_model_dir(home, log=log)
    base = Path(base_model_dir)
    key = recipe_key(cfg, base_fingerprint(base))
    target = warm_cache_dir(role, key, home)
    if not force and _is_valid(target, key):
        return target
    with file_lock(target.with_name(f".warm-{role}.lock")):
        if not force and _is_valid(target, key):
            return target
        _build(role, cfg, base, key, target, home, emit)
    return target


def warm_executor_dir(**kwargs: Any) -> Path:
    """The warm-started Executor (see :func:`warm_role_dir`)."""
    return warm_role_dir("executor", **kwargs)


def warm_planner_dir(**kwargs: Any) -> Path:
    """The warm-started Planner (see :func:`warm_role_dir`)."""
    return warm_role_dir("planner", **kwargs)


def _build(
    role: str,
    cfg: dict[str, Any],
    base: Path,
    key: str,
    target: Path,
    home: str | Path | None,
    emit: Log,
) -> None:
    from mia.rl.sft import SftConfig, train_sft

    started = time.monotonic()
    emit(f"warm start [{role}]: fine-tuning {base.name} on gold transcripts -> {target}")
    sft = SftConfig.from_dict(cfg)
    if not sft.data.train:  # gold first (shared by the roles): the SFT then runs on a file
        sft.data.train = [str(gold_world_file(sft.data.gold_world, home, say=emit))]
    runs = target.parent / ".warm-runs"
    runs.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{role}-", dir=runs))
    try:
        with atomic_dir(target) as tmp:
            sft.model_path = str(base)
            sft.run_dir = str(run_dir)
            sft.output_dir = str(tmp)
            sft.save_freq = -1  # the folder is the result; no resumable checkpoints
            sft.resume = False
            sft.export = True
            result = train_sft(sft, say=emit)
            tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is readable
            marker = {
                "recipe": RECIPE,
                "role": role,
                "key": key,
                "base": str(base),
                "base_fingerprint": base_fingerprint(base),
                "data": data_fingerprint(),
                "steps": result.steps,
                "val_loss_start": result.val_loss_start,
                "val_loss_end": result.val_loss_end,
                "seconds": round(time.monotonic() - started, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            # Written last: a folder without it is never trusted.
            atomic_write_text(tmp / MARKER, json.dumps(marker, indent=2) + "\n")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    emit(f"warm start [{role}]: done in {time.monotonic() - started:.0f} s: {target}")


def main(argv: list[str] | None = None) -> None:
    """``python -m mia.apps.warm_start [ROLE ...] [--force] [--set KEY=VALUE ...]``: build (or
    find) the warm-started folders and print their paths."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mia.apps.warm_start", description=main.__doc__)
    p.add_argument("roles", nargs="*", default=list(ROLES), help="executor and/or planner")
    p.add_argument("--force", action="store_true", help="rebuild even a valid cache")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override (Hydra syntax), applied to every role given")  # fmt: skip
    args = p.parse_args(argv)
    try:
        for role in args.roles:
            print(warm_role_dir(role, overrides=args.overrides, force=args.force))
    except MiaError as err:
        print(f"warm_start: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


__all__ = [
    "ROLES",
    "main",
    "WARM_DATA_VERSION",
    "base_fingerprint",
    "data_fingerprint",
    "gold_world_file",
    "recipe_key",
    "warm_cache_dir",
    "warm_executor_dir",
    "warm_planner_dir",
    "warm_recipe",
    "warm_role_dir",
]


if __name__ == "__main__":
    main()
