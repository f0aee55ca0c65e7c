"""``mia eval``: evaluate memory policies on a QA file through running (or started) services.

    mia eval --data test.jsonl --policy none,mia --memory-url http://127.0.0.1:5000 \\
        --serve-url http://127.0.0.1:5001 --out runs/eval1
    mia eval --data data/world/test.jsonl --policy none,mia,rag --start-services \\
        --index indexes/world-bm25 --out runs/eval2          # services on loopback, stopped after

Rerunning the same command with the same ``--out`` resumes an interrupted run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from mia.config import add_help_config, from_dict, load_dict
from mia.errors import MiaError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mia eval",
        description="Evaluate memory policies (none, plan_only, mia, rag, feedback and the memory "
        "baselines mem0, amem, expel, memento, reasoningbank) on a QA dataset: "
        "plan -> execute -> reflect/replan -> judge -> memory write, per question. Trailing "
        "key=value arguments override configs/eval/default.yaml.",
    )
    p.add_argument("--data", help="QA file (.jsonl/.json/.parquet), e.g. a world's test.jsonl")
    p.add_argument(
        "--policy",
        help="comma list of none, plan_only, mia, rag, feedback, mem0, amem, expel, memento, "
        "reasoningbank (default: mia)",
    )
    p.add_argument("--order", choices=("online", "batched"), help="memory write order")
    p.add_argument("--batch-size", type=int, help="batched order: questions per frozen batch")
    p.add_argument("--workers", type=int, help="questions in flight at once (default 4)")
    p.add_argument("--limit", type=int, help="evaluate at most N questions")
    p.add_argument("--offset", type=int, help="skip the first K questions")
    p.add_argument("--modality", choices=("all", "text-only", "text-image"))
    p.add_argument("--out", help="output folder (default runs/eval-<time>); reuse it to resume")
    p.add_argument("--restart", action="store_true", help="discard earlier results in --out")
    p.add_argument("--memory-url", help="memory_serve URL (policies plan_only, mia, rag)")
    p.add_argument("--serve-url", help="serve (Executor service) URL")
    p.add_argument("--memory-token", default=os.environ.get("MEMORY_SERVE_TOKEN"))
    p.add_argument("--serve-token", default=os.environ.get("SERVE_TOKEN"))
    p.add_argument(
        "--start-services",
        action="store_true",
        help="start local_search, serve and memory_serve on loopback for this run",
    )
    p.add_argument("--index", help="--start-services: local_search index folder")
    p.add_argument(
        "--image-cache", action="append", default=None, help="--start-services: cache root"
    )
    p.add_argument("--llm-config", help="--start-services: llm config name or file (embedded)")
    p.add_argument("--model", help="--start-services: local model folder for every role")
    p.add_argument("--judge", help="rules | llm | panel, or a judge YAML file")
    p.add_argument("--judge-url", help="OpenAI-compatible base URL for an llm/panel judge")
    p.add_argument("--judge-model", default="qwen", help="model name at --judge-url")
    p.add_argument("--config", help="eval YAML (default configs/eval/default.yaml)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from mia.eval.config import EvalConfig

    add_help_config(p, EvalConfig)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _judge_config(name: str) -> Any:
    from mia.judge import JudgeConfig

    return from_dict(JudgeConfig, load_dict(name, group="judge"), f"judge config {name}")


def apply_flags(cfg: Any, args: argparse.Namespace) -> Any:
    """Command-line flags on top of the loaded config."""
    if args.data:
        cfg.dataset = args.data
    if args.policy:
        cfg.policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    for flag, attr in (
        ("order", "order"),
        ("batch_size", "batch_size"),
        ("workers", "workers"),
        ("limit", "limit"),
        ("offset", "offset"),
        ("modality", "modality"),
    ):
        value = getattr(args, flag)
        if value is not None:
            setattr(cfg, attr, value)
    if args.judge:
        cfg.judge = _judge_config(args.judge)
    if args.judge_url:
        cfg.judge_llm.overrides = {
            **cfg.judge_llm.overrides,
            "backend": "openai",
            "base_url": args.judge_url,
            "model": args.judge_model,
        }
    s = cfg.services
    if args.index:
        s.index = args.index
    if args.image_cache:
        s.image_cache = list(args.image_cache)
    if args.llm_config:
        s.llm_config = args.llm_config
    return cfg.validate()


def default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str]) -> None:
    from mia.eval.config import load_eval_config
    from mia.eval.harness import Endpoints, load_items, run_eval

    args = _parser().parse_args(argv)
    cfg = apply_flags(load_eval_config(args.config, args.overrides), args)
    if not args.start_services and not args.serve_url:
        raise MiaError(
            "pass --serve-url (and --memory-url) of running services, or --start-services"
        )
    needs_golds = cfg.judge.type != "panel"
    items = load_items(cfg, require_answer=needs_golds)  # bad data fails before any service
    out = Path(args.out) if args.out else default_out("eval")
    say = _say
    say(f"mia eval: {len(items)} questions from {cfg.dataset}, policies {cfg.policies}, "
        f"order {cfg.order}, {cfg.workers} workers -> {out}")  # fmt: skip
    if args.start_services:
        result = _with_services(cfg, args, items, out)
    else:
        endpoints = Endpoints(
            serve=args.serve_url,
            memory=args.memory_url,
            serve_token=args.serve_token,
            memory_token=args.memory_token,
        )
        result = run_eval(
            cfg,
            endpoints,
            out,
            restart=args.restart,
            progress=not args.no_progress,
            log_fn=say,
            items=items,
        )
    print_result(result)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _with_services(cfg: Any, args: argparse.Namespace, items: list[Any], out: Path) -> Any:
    from mia.eval.harness import Endpoints, run_eval
    from mia.eval.policies import spec
    from mia.eval.supervisor import ServiceGroup, StackOptions, start_stack, write_llm_config

    s = cfg.services
    if not s.index:
        raise MiaError("--start-services needs --index DIR (a local_search index)")
    if not (Path(s.index) / "index.json").is_file():
        raise MiaError(f"not a local_search index (no index.json): {s.index}")
    work = out / "services"
    modes: dict[str, str] = {}  # policy -> memory_serve mode
    for policy in cfg.policies:
        p = spec(policy)
        if p.needs_memory:
            modes[policy] = "identity" if p.compress_modes == ("identity",) else "llm"
    with ServiceGroup(work, s.startup_timeout_s, log_fn=_say) as group:
        llm_config = write_llm_config(s.llm_config, work / "llm.yaml", model_path=args.model)
        if cfg.baselines.llm.config is None:  # the baselines share the services' LLM
            cfg.baselines.llm.config = str(llm_config)
        _say("mia eval: starting services")
        urls = start_stack(
            group,
            StackOptions(
                index=Path(s.index),
                llm_config=llm_config,
                work_dir=work,
                memory_dbs={m: out / f"memory-{m}.sqlite" for m in sorted(set(modes.values()))},
                image_cache=list(s.image_cache),
                threads=s.threads,
                memory_overrides=list(s.memory_overrides),
                serve_overrides=list(s.serve_overrides),
            ),
        )
        group.write_manifest(work / "services.json")
        endpoints = Endpoints(
            serve=urls.serve,
            memory_by_policy={policy: urls.memory[mode] for policy, mode in modes.items()},
        )
        return run_eval(
            cfg,
            endpoints,
            out,
            restart=args.restart,
            progress=not args.no_progress,
            log_fn=_say,
            items=items,
        )


def print_result(result: Any) -> None:
    print()
    print(result.table)
    print()
    for r in result.policies:
        print(f"{r.policy:>9}: {r.run_dir / 'results.jsonl'}")
    print(f"  summary: {result.summary_path} (table: {result.table_path})")
    if result.plot_path is not None:
        print(f"     plot: {result.plot_path}")
