"""The efficacy protocol's runner (``python bench/efficacy_bench.py --protocol FILE``).

A protocol file (:mod:`mia.eval.protocol`, docs/protocol.md) fixes the worlds, each world's
stream, the orders, the rows and the targets. :func:`run_protocol` runs it with ``mia demo``'s
stages (:mod:`mia.apps.demo`), so a row runs exactly as the demo runs that policy or TTRL pass:

1. the rows' configs: ``mia demo``'s config (``configs/demo/default.yaml``; for a dev protocol
   also the demo flags and ``key=value`` overrides given after ``--``) with each row's
   overrides; the world size and the judge are the protocol's. Every row is composed and
   checked before anything runs;
2. a test protocol (its worlds in the test range of ``configs/world/seeds.yaml``) appends a
   ``started`` row to the ledger (docs/ledger.md), after refusing a second look at the same
   roles unless asked to take one; a dev protocol never writes the ledger;
3. per world: the world and its BM25 index (built once under ``$MIA_HOME/demo``), the roles
   (the warm start's, built once under ``$MIA_HOME/models``), and the services, started once for
   the world (local_search, serve, and memory_serve for the memory policies, for ``rag`` and
   for the TTRL passes);
4. per order (``file``, ``shuffled``), per row, on a fresh memory: ``mia eval`` of the row's
   policy over the ordered stream, or a TTRL pass over it. A row whose policy reads and writes
   no memory (``none``) does not depend on the order: it runs once per world, on the first
   order, and its answers stand for the other orders too (the output says so);
5. one JSON per stream (``streams/world-<seed>-<order>.json``: its questions in order, with
   kind, type and template, and every row's outcome per question), then the tables per kind
   and per question type with clustered intervals (:mod:`mia.eval.protocol_stats`), the paired
   differences the targets need, the targets, ``protocol.json`` and ``protocol.png``;
6. a test protocol appends the ``finished`` row with the targets' numbers.

Rerunning the same command with the same ``--out`` resumes: finished rows are read back, an
interrupted ``mia eval`` row resumes from its journal, an interrupted TTRL pass starts again
(:func:`discard_partial_pass`).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.apps.demo import (
    DemoRun,
    Models,
    demo_home,
    ensure_index,
    ensure_world,
    memory_stores,
    prepare_models,
    run_ttrl_stage,
    start_services,
    ttrl_name,
)
from mia.apps.demo_config import DemoConfig, load_demo_config
from mia.apps.demo_report import answer_correct
from mia.errors import MiaError
from mia.eval.protocol import Protocol, describe_stream, ordered, protocol_stream, row_summary
from mia.eval.protocol_stats import (
    Question,
    evaluate_targets,
    format_difference,
    format_scope_table,
    scope_table,
    short_result,
)
from mia.eval.templates import question_kind, question_template, question_type
from mia.paths import atomic_write_text

Log = Callable[[str], None]
# What a test protocol takes from the demo's command line: which roles run, nothing else.
ROLE_FLAGS = ("model", "executor_url", "planner_url", "manager_url", "api_key_env")


@dataclass
class ProtocolOptions:
    """How one protocol run is made, besides the protocol file itself."""

    path: Path  # the protocol file
    out: Path  # the run folder
    demo_argv: list[str] = field(default_factory=list)  # mia demo flags and key=value
    questions: int | None = None  # dev protocols: the first N questions of each stream
    baselines: bool = False  # the memory baselines too (a second table)
    ledger: Path = Path("docs/ledger.md")  # test protocols append their rows here
    another_look: bool = False  # a test protocol may run again on roles already looked at
    command: str = ""  # the command as the ledger records it
    root: Path = Path(".")  # the checkout (its commit goes in the ledger)
    log: Log = print


class ProtocolWorld(DemoRun):
    """The demo's run of one world of the protocol (its stage lines name the world)."""

    def stage(self, n: int, text: str) -> None:
        print(f"world {self.cfg.world.seed}: {text}", flush=True)


# ----------------------------------------------------------------------------- configs


def demo_args(opts: ProtocolOptions) -> argparse.Namespace:
    """The demo's flags and overrides given after ``--`` (``mia demo``'s own parser)."""
    from mia.apps.demo import _parser

    try:
        return _parser().parse_args([*opts.demo_argv, "--out", str(opts.out)])
    except SystemExit:
        raise MiaError(f"bad mia demo arguments: {shlex.join(opts.demo_argv)}") from None


def check_test_run(protocol: Protocol, opts: ProtocolOptions, args: argparse.Namespace) -> None:
    """A test protocol runs as docs/protocol.md fixes it: no fewer questions, no other
    precision, no demo config or overrides (``--model`` and the role endpoints only say which
    roles run; the ledger records them)."""
    if protocol.kind != "test":
        return
    changes = [
        *(["--questions"] if opts.questions is not None else []),
        *(["a demo --config"] if args.config else []),
        *(f"{o!r}" for o in args.overrides),
        *(
            f"--{name.replace('_', '-')}"
            for name in ("questions", "policy", "ttrl", "warm_start", "workers", "seed")
            if getattr(args, name) is not None
        ),
        *(["--world-size"] if args.world_size else []),
    ]
    if changes:
        raise MiaError(
            f"{opts.path} is a test protocol: it runs as docs/protocol.md fixes it, without "
            f"{', '.join(changes)} (a dev protocol takes them)"
        )


def compose(protocol: Protocol, args: argparse.Namespace, overrides: list[str]) -> DemoConfig:
    """The demo config of one row: the demo's (``--config``, its overrides, its flags) with the
    row's ``overrides``, the protocol's world size and its judge (rules, exact match)."""
    from mia.apps.demo import _apply_flags

    cfg = load_demo_config(args.config, [*args.overrides, *overrides])
    _apply_flags(cfg, args)
    cfg.world.size = protocol.size
    cfg.eval.judge.type = "rules"
    cfg.eval.judge.mode = "em"
    return cfg


def row_configs(protocol: Protocol, args: argparse.Namespace) -> dict[str, DemoConfig]:
    """name -> the row's demo config, checked (a bad row is one line naming it)."""
    out = {}
    for name, row in protocol.rows.items():
        try:
            cfg = compose(protocol, args, list(row.overrides))
            if row.policy is not None:
                cfg.eval.policies = [row.policy]
                cfg.ttrl.enabled = False
            else:
                cfg.ttrl.enabled = True
                cfg.ttrl.modes = [str(row.ttrl)]
            out[name] = cfg.validate()
        except MiaError as err:
            raise MiaError(f"rows.{name}: {err}") from None
    return out


def world_config(
    protocol: Protocol, args: argparse.Namespace, rows: dict[str, DemoConfig], baselines: list[str]
) -> DemoConfig:
    """The config the world's stages run under: every policy and TTRL mode the rows use (what
    the services and roles must serve)."""
    cfg = compose(protocol, args, [])
    policies = [c.eval.policies[0] for c in rows.values() if not c.ttrl.enabled]
    cfg.eval.policies = list(dict.fromkeys([*policies, *baselines])) or ["none"]
    modes = [c.ttrl.modes[0] for c in rows.values() if c.ttrl.enabled]
    cfg.ttrl.enabled = bool(modes)
    cfg.ttrl.modes = list(dict.fromkeys(modes)) or ["supervised"]
    return cfg.validate()


def role_keys(cfg: DemoConfig, args: argparse.Namespace) -> dict[str, str]:
    """executor / planner -> what runs it: the warm-start recipe key of the shipped role
    (:func:`mia.apps.warm_start.recipe_key`, the key in its cached folder's name), or the
    ``--model`` folder, an endpoint, or the raw embedded model."""
    from mia.apps.warm_start import embedded_fingerprint, recipe_key, warm_recipe

    out = {}
    for role in ("executor", "planner"):
        url = getattr(args, f"{role}_url")
        if args.model:
            out[role] = f"model {Path(args.model).name}"
        elif url:
            out[role] = f"{url} ({getattr(args, f'{role}_model')})"
        elif cfg.warm_start.enabled and role in cfg.warm_start.roles:
            recipe = warm_recipe(role, list(cfg.warm_start.overrides.get(role) or []))
            out[role] = recipe_key(recipe, embedded_fingerprint())
        else:
            out[role] = "embedded (raw)"
    return out


# ----------------------------------------------------------------------------- the ledger


@dataclass
class Ledger:
    """A test run's rows in the ledger (None for a dev run)."""

    path: Path
    run_id: str
    commit: str
    protocol: str
    roles: str
    command: str

    def append(self, event: str, result: str) -> None:
        from mia.eval.ledger import LedgerRow, append_row, utc_now

        row = LedgerRow(
            self.run_id,
            utc_now(),
            self.commit,
            self.protocol,
            self.roles,
            f"`{self.command}`",
            event,
            result,
        )
        append_row(self.path, row)


def open_ledger(
    protocol: Protocol, opts: ProtocolOptions, roles: dict[str, str], run_id: str
) -> tuple[Ledger, str] | None:
    """The ledger of a test run and the note of its ``started`` row; None for a dev run.

    A run of roles the ledger already holds a look at is a **reproduction** when that look ran
    on a clean commit and nothing outside docs/ has changed since (the same code, configs and
    roles: float32 gives the same numbers); it runs and its row says which run it reproduces.
    Any other run of the same roles is another look at the test worlds, refused unless
    ``another_look``."""
    from mia.eval.ledger import earlier_looks, git_commit, unchanged_since

    if protocol.kind != "test":
        return None
    label = f"{display_path(opts.path, opts.root)} v{protocol.version}"
    pair = f"{roles['executor']}, {roles['planner']}"
    looks = earlier_looks(opts.ledger, label, pair, run_id)
    same = [r.run for r in looks if unchanged_since(opts.root, r.commit)]
    note = f"reproduces {same[-1]}" if same else "-"
    if looks and not same and not opts.another_look:
        last = looks[-1]
        raise MiaError(
            f"{opts.ledger} already holds a run of {label} with these roles "
            f"({', '.join(r.run for r in looks)}) and the code has changed since: each shipped "
            "model is evaluated once on the test worlds (docs/protocol.md, 'Looks'); to "
            f"reproduce {last.run}, run the same command in a clean checkout of {last.commit} "
            f"with --ledger {opts.ledger.resolve()}; --another-look takes another look, and "
            "the ledger records it"
        )
    ledger = Ledger(opts.ledger, run_id, git_commit(opts.root), label, pair, opts.command)
    return ledger, note


def display_path(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def run_id_of(protocol: Protocol, opts: ProtocolOptions) -> str:
    """This run's id: the one in ``out/run.json`` when the folder holds a run of the same
    protocol (a resumed run keeps its id), else a new one."""
    state = opts.out / "run.json"
    label = f"{opts.path.resolve()} v{protocol.version}"
    if state.is_file():
        data = json.loads(state.read_text())
        if data.get("protocol") != label:
            raise MiaError(f"{opts.out} holds a run of {data.get('protocol')}; use another --out")
        return str(data["run_id"])
    run_id = (
        f"{opts.path.stem}-v{protocol.version}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    )
    opts.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(state, json.dumps({"protocol": label, "run_id": run_id}) + "\n")
    return run_id


# ----------------------------------------------------------------------------- running


@dataclass
class StreamResult:
    """One world in one order: its questions in order and every row's outcome per question."""

    world: int
    order: str
    items: list[Any]
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> outcomes, summary

    def questions(self) -> list[Question]:
        return [
            Question(
                self.world,
                self.order,
                it.id,
                question_kind(it),
                question_type(it),
                question_template(it),
            )
            for it in self.items
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "order": self.order,
            "questions": [
                {"id": q.id, "kind": q.kind, "type": q.type, "template": q.template}
                for q in self.questions()
            ],
            "rows": self.rows,
        }


def order_free(policy: str | None) -> bool:
    """A policy that reads and writes no memory: its answers do not depend on the order."""
    from mia.eval.policies import spec

    return policy is not None and not (spec(policy).retrieve or spec(policy).writes)


def run_protocol(protocol: Protocol, opts: ProtocolOptions) -> dict[str, Any]:
    """Run ``protocol`` into ``opts.out`` (see the module docstring); returns the summary that
    ``protocol.json`` holds."""
    say = opts.log
    started = time.perf_counter()
    args = demo_args(opts)
    check_test_run(protocol, opts, args)
    if opts.questions is not None and opts.questions < 1:
        raise MiaError("--questions must be >= 1")
    rows = row_configs(protocol, args)
    baselines = list(protocol.baselines) if opts.baselines else []
    for name in baselines:
        if name in rows:
            raise MiaError(f"baseline {name} is also a row name")
    base = world_config(protocol, args, rows, baselines)
    roles = role_keys(base, args)
    run_id = run_id_of(protocol, opts)
    opened = open_ledger(protocol, opts, roles, run_id)
    ledger, note = opened if opened is not None else (None, "-")
    say(
        f"protocol {display_path(opts.path, opts.root)} v{protocol.version} ({protocol.kind} "
        f"worlds {', '.join(map(str, protocol.worlds))}; run {run_id}) -> {opts.out}"
    )
    say(f"  stream: {describe_stream(protocol)}; orders: {', '.join(protocol.orders)}")
    say(
        f"  rows: {', '.join(rows)}" + (f"; baselines: {', '.join(baselines)}" if baselines else "")
    )
    say(f"  roles: executor {roles['executor']}, planner {roles['planner']}")
    reused = [n for n, r in protocol.rows.items() if order_free(r.policy)]
    if reused and len(protocol.orders) > 1:
        say(f"  {note_reused(reused, protocol.orders)}")
    if ledger is not None:
        ledger.append("started", note)
        say(
            f"  ledger: started row appended to {opts.ledger}"
            + ("" if note == "-" else f" ({note})")
        )
    streams: list[StreamResult] = []
    for seed in protocol.worlds:
        streams += run_world(protocol, opts, args, base, rows, baselines, seed)
    summary = report(protocol, opts, streams, rows, baselines, roles, run_id, reused)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    atomic_write_text(opts.out / "protocol.json", json.dumps(summary, indent=2) + "\n")
    if ledger is not None:
        ledger.append("finished", short_result(summary["targets"]))
        say(f"ledger: finished row appended to {opts.ledger}")
    say(f"\n{opts.out / 'protocol.json'}\n{opts.out / 'protocol.png'}")
    return summary


def note_reused(names: list[str], orders: list[str]) -> str:
    return (
        f"{', '.join(names)} reads and writes no memory, so its answers do not depend on the "
        f"order: it runs once per world, on the {orders[0]} order, and stands for the "
        f"{', '.join(orders[1:])} order too"
    )


def run_world(
    protocol: Protocol,
    opts: ProtocolOptions,
    args: argparse.Namespace,
    base: DemoConfig,
    rows: dict[str, DemoConfig],
    baselines: list[str],
    seed: int,
) -> list[StreamResult]:
    """One world: its world, index, roles and services, then every order and row."""
    from mia.data.formats import load_qa
    from mia.eval.supervisor import ServiceGroup

    cfg = copy.deepcopy(base)
    cfg.world.seed = seed
    run = ProtocolWorld(cfg, args, opts.out / f"world-{seed}", cfg.ttrl.enabled)
    run.stage(1, f"synthetic world (seed {seed}, size {protocol.size}) and its BM25 index")
    world = ensure_world(demo_home(), seed, protocol.size)
    index = ensure_index(demo_home(), world)
    models = prepare_models(run)
    stores = memory_stores(run)
    for mode in cfg.ttrl.modes if run.ttrl else []:
        # Each pass saves its memory under its row's folder, which memory_serve allows only
        # below the store's own folder: the world's.
        stores[ttrl_name(mode)] = run.out / f"memory-{ttrl_name(mode)}.sqlite"
    stream = protocol_stream(
        load_qa(world / f"{protocol.split}.jsonl"),
        protocol.stream.conventions,
        protocol.stream.standard,
    )
    if opts.questions is not None:
        stream = stream[: opts.questions]
    out = []
    with ServiceGroup(run.work, cfg.eval.services.startup_timeout_s, log_fn=opts.log) as group:
        urls = start_services(run, group, world, index, models, stores)
        first: dict[str, dict[str, Any]] = {}
        for order in protocol.orders:
            result = StreamResult(seed, order, ordered(stream, order, seed))
            names = [*rows, *baselines]
            for name in names:
                row_cfg = rows.get(name) or _baseline_config(base, name)
                policy = None if row_cfg.ttrl.enabled else row_cfg.eval.policies[0]
                if order_free(policy) and name in first:
                    result.rows[name] = {**first[name], "reused_from": protocol.orders[0]}
                    continue
                folder = run.out / order / name
                result.rows[name] = run_row(
                    name, row_cfg, world, result.items, models, urls, folder, args, opts.log
                )
                if order_free(policy):
                    first[name] = result.rows[name]
            _write_stream(opts.out, result)
            out.append(result)
    return out


def _baseline_config(base: DemoConfig, name: str) -> DemoConfig:
    cfg = copy.deepcopy(base)
    cfg.eval.policies = [name]
    cfg.ttrl.enabled = False
    return cfg


def run_row(
    name: str,
    cfg: DemoConfig,
    world: Path,
    items: list[Any],
    models: Models,
    urls: Any,
    folder: Path,
    args: argparse.Namespace,
    say: Log,
) -> dict[str, Any]:
    """One row over one ordered stream, on a fresh memory; its outcome per question and a
    summary. A row whose ``outcomes.json`` exists (a resumed run) is read back."""
    done = folder / "outcomes.json"
    if done.is_file():
        say(f"  {name}: done earlier, read back from {done}")
        return json.loads(done.read_text())
    say(f"  {name}: {len(items)} questions -> {folder}")
    if cfg.ttrl.enabled:
        outcomes, summary = _ttrl_row(cfg, world, items, models, urls, folder)
    else:
        outcomes, summary = _eval_row(cfg, world, items, models, urls, folder, args, say)
    keep = ("accuracy", "questions", "wall_s", "tool_calls_per_question", "tokens_per_question")
    record = {
        "outcomes": outcomes,
        "summary": {k: summary.get(k) for k in keep} | {"grpo": summary.get("grpo")},
    }
    atomic_write_text(done, json.dumps(record, indent=2, default=str) + "\n")
    return record


def _eval_row(
    cfg: DemoConfig,
    world: Path,
    items: list[Any],
    models: Models,
    urls: Any,
    folder: Path,
    args: argparse.Namespace,
    say: Log,
) -> tuple[dict[str, float], dict[str, Any]]:
    from mia.eval.harness import Endpoints, run_eval

    eval_cfg = copy.deepcopy(cfg.eval)
    eval_cfg.dataset = str(world / "test.jsonl")
    eval_cfg.offset, eval_cfg.limit, eval_cfg.plot = 0, None, False
    if eval_cfg.baselines.llm.config is None:  # the baselines share the services' LLM
        eval_cfg.baselines.llm.config = str(models.llm_yaml)
    endpoints = Endpoints(
        serve=urls.serve,
        memory=urls.memory.get("llm"),
        memory_by_policy={"rag": urls.memory["identity"]} if "identity" in urls.memory else {},
    )
    result = run_eval(
        eval_cfg, endpoints, folder, progress=not args.no_progress, log_fn=say, items=items
    )
    (policy,) = result.policies
    return {r["id"]: float(bool(r["correct"])) for r in policy.rows}, policy.summary


def discard_partial_pass(run_dir: Path) -> bool:
    """Remove an interrupted TTRL pass's folder; True if there was one. The demo's passes keep
    no Planner checkpoint (``trainer.save_freq=-1``), so resuming one from its journal would
    keep the memories of its finished batches but not the Planner's updates: a row's pass
    starts again from its first batch instead."""
    if not run_dir.exists():
        return False
    shutil.rmtree(run_dir)
    return True


def _ttrl_row(
    cfg: DemoConfig, world: Path, items: list[Any], models: Models, urls: Any, folder: Path
) -> tuple[dict[str, float], dict[str, Any]]:
    """A TTRL pass on the TTRL store, emptied first. A question the pass could not answer
    counts as wrong."""
    from mia.services import MemoryClient

    mode = cfg.ttrl.modes[0]
    url = urls.memory[ttrl_name(mode)]
    discard_partial_pass(folder / ttrl_name(mode))
    client = MemoryClient(url)
    try:
        client.sync.clear_memory()
    finally:
        client.close()
    planner = models.roles["planner"].model_path
    summary, result = run_ttrl_stage(cfg, world, items, urls.serve, url, planner, folder, mode)
    votes = {
        q["data_id"]: float(answer_correct(q) or 0.0)
        for r in result.rows
        for q in r.get("per_question") or []
    }
    return {it.id: votes.get(it.id, 0.0) for it in items}, summary


def _write_stream(out: Path, result: StreamResult) -> Path:
    path = out / "streams" / f"world-{result.world}-{result.order}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result.to_json(), indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- the report

SCOPES = ("all", "standard", "convention", "single_hop", "bridge", "comparison")


def report(
    protocol: Protocol,
    opts: ProtocolOptions,
    streams: list[StreamResult],
    rows: dict[str, DemoConfig],
    baselines: list[str],
    roles: dict[str, str],
    run_id: str,
    reused: list[str],
) -> dict[str, Any]:
    """The tables, the targets' differences and the targets: printed, and returned for
    ``protocol.json``; ``protocol.png`` beside it."""
    say = opts.log
    questions = [q for s in streams for q in s.questions()]
    outcomes: dict[str, dict[tuple[int, str, str], float]] = {}
    for s in streams:
        for name, rec in s.rows.items():
            for qid, v in rec["outcomes"].items():
                outcomes.setdefault(name, {})[(s.world, s.order, qid)] = float(v)
    names = list(rows)
    scopes = [sc for sc in SCOPES if any(q.in_scope(sc) for q in questions)]
    tables = [scope_table(outcomes, questions, sc, names) for sc in scopes]
    say("")
    say(
        "Accuracy (exact match, %) with 95% bootstrap intervals clustered by (world, "
        "template), both orders of a world in one cluster; 'vs none' / 'vs mia': the paired "
        "clustered difference in points"
    )
    if reused and len(protocol.orders) > 1:
        say(note_reused(reused, protocol.orders))
    for table in tables:
        say("")
        say(format_scope_table(table))
    baseline_tables = []
    if baselines:
        ref = [n for n in ("none", "mia") if n in outcomes]
        baseline_tables = [
            scope_table(outcomes, questions, sc, [*ref, *baselines])
            for sc in ("all", "standard", "convention")
            if any(q.in_scope(sc) for q in questions)
        ]
        say("\nThe memory baselines on the same streams:")
        for table in baseline_tables:
            say("")
            say(format_scope_table(table))
    targets = evaluate_targets(protocol.targets, outcomes, questions)
    say("\nThe paired clustered differences the targets read (points, 95% interval):")
    for t in targets:
        for scope, d in t["differences"].items():
            number = "n/a" if d is None else format_difference(d)
            say(f"  {t['metric']} on {scope}: {number}")
    say("\nTargets (docs/protocol.md):")
    for t in targets:
        say(f"  {t['line']}")
    from mia.eval.ledger import git_commit

    summary = {
        "protocol": display_path(opts.path, opts.root),
        "version": protocol.version,
        "kind": protocol.kind,
        "run_id": run_id,
        "command": opts.command,
        "commit": git_commit(opts.root),
        "roles": roles,
        "worlds": list(protocol.worlds),
        "orders": list(protocol.orders),
        "stream": describe_stream(protocol),
        "questions_per_stream": {f"{s.world}-{s.order}": len(s.items) for s in streams},
        "rows": row_summary(protocol),
        "baselines": baselines,
        "reused": {"rows": reused, "note": note_reused(reused, protocol.orders)}
        if reused and len(protocol.orders) > 1
        else None,
        "tables": tables,
        "baseline_tables": baseline_tables,
        "targets": targets,
        "streams": [f"streams/world-{s.world}-{s.order}.json" for s in streams],
    }
    plot(tables, opts.out / "protocol.png", f"{protocol.kind} worlds {protocol.worlds}")
    return summary


def plot(tables: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy of every row on standard and convention questions, with the clustered
    intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_scope = {t["scope"]: t for t in tables if t["scope"] in ("standard", "convention")}
    names = [r["row"] for r in (tables[0]["rows"] if tables else [])]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names) + 2), 4), dpi=100)
    width = 0.4
    for k, (scope, color) in enumerate((("standard", "#4a7ab7"), ("convention", "#d08c3c"))):
        table = by_scope.get(scope)
        if table is None:
            continue
        got = {r["row"]: r for r in table["rows"]}
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        acc = [100 * got[n]["mean"] if n in got else 0.0 for n in names]
        err = [
            [100 * (got[n]["mean"] - got[n]["ci"][0]) if n in got else 0.0 for n in names],
            [100 * (got[n]["ci"][1] - got[n]["mean"]) if n in got else 0.0 for n in names],
        ]
        ax.bar(xs, acc, width, yerr=err, capsize=3, color=color, label=scope)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("exact match, % (95% clustered CI)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
