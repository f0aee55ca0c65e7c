"""The Executor alone (policy `none`) on one or more worlds' test splits, served as the demo
serves the warm Executor, with exact match and 95% bootstrap intervals per question type.

    python bench/executor_eval.py --model DIR --out OUT \\
        --world dev0=data/w0:indexes/w0 --world dev9=data/w9:indexes/w9 [--limit N]

For each ``NAME=WORLD:INDEX`` it runs ``mia eval --policy none --modality text-only
--start-services`` on ``WORLD/test.jsonl`` with the model folder for the Executor, greedy,
``--max-tokens`` per turn and no presence penalty, ``--max-turns`` assistant turns (the demo's
``configs/demo/default.yaml`` values by default), ``--workers`` questions in flight and the
rule judge in exact-match mode. Then it prints and writes (``OUT/summary-ci.json``) EM overall
and per type for each world and for all of them pooled (bench/ci.py). ``--paired OTHER`` (an
earlier run's ``--out``, e.g. the SFT model's when this one is SFT+GRPO) adds the paired EM
difference on the same questions, with its interval.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ci import (  # noqa: E402
    em,
    format_summary,
    load_rows,
    paired_bootstrap_ci,
    question_types,
    summarize_rows,
)


def write_configs(out: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    llm = {
        "common": {
            "backend": "local",
            "model_path": str(Path(args.model).resolve()),
            "device": "cpu",
            "dtype": "auto",
            "max_batch_size": args.workers,
            "batch_wait_ms": args.batch_wait_ms,
            # The KV of the system prompt and earlier turns, reused: the same replies, faster.
            "prefix_cache_mb": args.prefix_cache_mb,
            "repeat_stop": args.repeat_stop,
            "chat_template_kwargs": {},
            "strip_think": False,
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 512},
        },
        "roles": {
            "manager": {"sampling": {"max_tokens": 96}},
            "planner": {"sampling": {"max_tokens": 160}},
            "executor": {
                "sampling": {"max_tokens": args.max_tokens, "presence_penalty": 0.0},
            },
            "judge": {"sampling": {"max_tokens": 16}},
        },
    }
    ev = {
        "judge": {"type": "rules", "mode": "em"},
        "plot": False,
        "services": {
            "threads": args.threads,
            "serve_overrides": [f"agent.max_turns={args.max_turns}"],
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm.yaml").write_text(yaml.safe_dump(llm, sort_keys=False))
    (out / "eval.yaml").write_text(yaml.safe_dump(ev, sort_keys=False))
    return out / "llm.yaml", out / "eval.yaml"


def paired_difference(
    rows: list[dict[str, Any]], other: list[dict[str, Any]], types: dict[str, str]
) -> dict[str, Any]:
    """EM of ``rows`` minus EM of ``other`` on their common questions, overall and per type,
    each with its paired 95% bootstrap interval (a question's two outcomes resampled together)."""
    mine = {str(r.get("id")): em(r) for r in rows}
    theirs = {str(r.get("id")): em(r) for r in other}
    ids = sorted(set(mine) & set(theirs))
    groups: dict[str, list[str]] = {"overall": ids}
    for i in ids:
        groups.setdefault(types.get(i, "other"), []).append(i)
    out = {}
    for g, members in groups.items():
        d, lo, hi = paired_bootstrap_ci([mine[i] for i in members], [theirs[i] for i in members])
        out[g] = {"n": len(members), "delta": d, "ci95": [lo, hi]}
    return out


def format_paired(name: str, p: dict[str, Any]) -> str:
    lines = [f"{name}: paired EM difference"]
    for g, v in p.items():
        lo, hi = v["ci95"]
        lines.append(f"  {g:<11} n={v['n']:>3}  {v['delta']:+.3f}  [{lo:+.3f}, {hi:+.3f}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="merged Hugging Face folder of the Executor")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--world", action="append", required=True, metavar="NAME=WORLD:INDEX")
    p.add_argument(
        "--paired",
        type=Path,
        metavar="OUT",
        help="another run's --out (same worlds): the paired EM difference, this run minus that",
    )
    p.add_argument("--limit", type=int, help="first N text questions of each test split")
    p.add_argument("--max-tokens", type=int, default=192, help="per assistant turn (demo: 192)")
    p.add_argument("--max-turns", type=int, default=4, help="assistant turns (demo: 4)")
    p.add_argument("--workers", type=int, default=8, help="questions in flight (demo: 8)")
    p.add_argument("--batch-wait-ms", type=int, default=200, help="decoder batching window")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the Executor")
    p.add_argument(
        "--prefix-cache-mb", type=float, default=512, help="serve's prefix cache (0 = off)"
    )
    p.add_argument(
        "--repeat-stop",
        type=int,
        default=0,
        help="loop stop (the demo: 32); 0 = off, as the 2026-12-03 results were measured",
    )
    args = p.parse_args(argv)
    llm, ev = write_configs(args.out, args)
    mia = Path(sys.executable).with_name("mia")
    pooled_rows, pooled_types, results = [], {}, {}
    for spec in args.world:
        name, _, paths = spec.partition("=")
        world, _, index = paths.partition(":")
        data = Path(world) / "test.jsonl"
        out = args.out / name
        cmd = [
            str(mia), "eval", "--config", str(ev), "--data", str(data), "--policy", "none",
            "--modality", "text-only", "--start-services", "--index", index,
            "--image-cache", str(Path(world) / "image_cache"), "--llm-config", str(llm),
            "--model", str(args.model), "--out", str(out), "--workers", str(args.workers),
            "--no-progress",
        ]  # fmt: skip
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        t0 = time.monotonic()
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        wall = time.monotonic() - t0
        rows = load_rows(out / "none" / "results.jsonl")
        types = question_types(data)
        s = summarize_rows(rows, types)
        s["wall_s"] = round(wall, 1)
        results[name] = s
        pooled_rows += rows
        pooled_types.update(types)
        print(format_summary(f"{name} (wall {wall:.0f} s)", s), flush=True)
        if args.paired:
            other = load_rows(args.paired / name / "none" / "results.jsonl")
            s["paired"] = paired_difference(rows, other, types)
            print(format_paired(f"{name} minus {args.paired}", s["paired"]), flush=True)
    if len(results) > 1:
        s = summarize_rows(pooled_rows, pooled_types)
        results["pooled"] = s
        print(format_summary("pooled", s), flush=True)
    for s in results.values():
        s.pop("scores", None)
    meta = {"model": str(args.model), "max_tokens": args.max_tokens, "max_turns": args.max_turns,
            "workers": args.workers, "worlds": args.world}  # fmt: skip
    (args.out / "summary-ci.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
