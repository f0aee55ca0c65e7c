"""Warm start of the embedded roles: build time, and does the warm Executor research?

    python bench/warm_start_bench.py                       # fresh $MIA_HOME under .mia/bench
    python bench/warm_start_bench.py --home DIR --eval-only
    python bench/warm_start_bench.py --questions 10 --set executor:total_steps=24

1. Builds the warm Executor and Planner (``mia.apps.warm_start``) in ``--home`` and times each
   (wall and CPU seconds; the load average before and after: on a shared machine other work
   stretches wall time, CPU seconds / cores is what the same work needs on idle cores).
2. Runs the real agent loop (``ExecutorLoop`` + ``ChatPolicy`` over the in-process local backend
   on the warm Executor, greedy, the embedded Executor sampling) with the real ``search`` tool
   against a local_search server on the index of a HELD-OUT world (``--eval-seed``, never used
   for SFT), on the first ``--questions`` text questions of its test split, without a plan and
   with the gold plan. Reports the share of questions whose first turn is a well-formed tool
   call, the share with any valid call, calls per question, and accuracy (rule judge, EM).
3. The warm Planner writes plans for the same questions (before step 2, without memories):
   share that are numbered plans, and per kind how many equal the gold plan, share its first
   step (the first search) or its number of steps; ``--plans ...,planner_plan`` then runs the
   Executor with them (``plan_only`` of the efficacy bench, on a dev world).

``--held-out-wordings`` evaluates only the convention questions whose wording no train split
holds; their gold plan is what a perfect Planner could write, so ``gold_plan`` - ``no_plan``
there bounds what plans (from memory or not) can give this Executor (docs/results.md).

JSON lands in ``--home/bench/warm_start.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def build(role: str, overrides: list[str], base: str | None) -> dict[str, Any]:
    from mia.apps.warm_start import warm_role_dir

    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), _cpu()
    path = warm_role_dir(role, overrides=overrides, base_model_dir=base)
    marker = json.loads((path / "mia-model.json").read_text())
    return {
        "role": role,
        "path": str(path),
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(_cpu() - c0, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "steps": marker.get("steps"),
        "val_loss_end": marker.get("val_loss_end"),
    }


def held_out(
    seed: int, size: str, n: int, workdir: Path, wordings_only: bool = False
) -> tuple[Any, list[Any], Path]:
    from local_search import build_index
    from mia.data.world import World
    from mia.data.world_io import write_corpus

    world = World.generate(seed, size)
    keep = (lambda q: q.held_out) if wordings_only else (lambda q: q.type != "image")
    questions = [q for q in world.split("test") if keep(q)][:n]
    build_index(write_corpus(world, workdir / "corpus.jsonl"), workdir / "index", "bm25")
    return world, questions, workdir / "index"


async def run_executor(
    model_dir: Path, questions: list[Any], url: str, plans: dict, presence_penalty: float
) -> list[dict]:
    from mia.agent import AgentConfig, ChatPolicy, ExecutorLoop, build_tools, parse_turn
    from mia.judge.rules import exact_match
    from mia.llm.base import SamplingParams
    from mia.llm.local_backend import LocalChat

    # The embedded Executor's sampling (configs/llm/embedded.yaml): greedy, 512 tokens.
    defaults = SamplingParams(temperature=0.0, max_tokens=512, presence_penalty=presence_penalty)
    chat = LocalChat(model_dir, dtype="float32", max_batch_size=8, defaults=defaults)
    cfg = AgentConfig(max_turns=8)
    cfg.tools["search"]["params"]["url"] = url
    cfg.tools.pop("web_image_to_image_search", None)
    loop = ExecutorLoop(ChatPolicy(chat), build_tools(cfg.tools), cfg)
    try:
        tasks = [
            loop.run({"question": q.question, "plan": plans.get(q.id), "data_id": q.id})
            for q in questions
        ]
        trajs = await asyncio.gather(*tasks)
    finally:
        await loop.tools.aclose()
        await chat.aclose()
    rows = []
    for q, t in zip(questions, trajs, strict=True):
        turns = t.assistant_texts()
        first = parse_turn(turns[0]) if turns else None
        rows.append(
            {
                "id": q.id,
                "type": q.type,
                "kind": q.template or q.type,
                "question": q.question,
                "gold": q.answer,
                "answer": t.answer,
                "correct": exact_match(t.answer, q.answers) > 0,
                "first_turn_call": bool(
                    first is not None
                    and first.call is not None
                    and first.error is None
                    and first.call.name == "search"
                ),
                "valid_calls": sum(1 for c in t.tool_calls if c.ok),
                "calls": len(t.tool_calls),
                "turns": t.turns,
                "first_turn": turns[0][:400] if turns else "",
            }
        )
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    n = max(len(rows), 1)
    return {
        "questions": len(rows),
        "first_turn_tool_call": round(sum(r["first_turn_call"] for r in rows) / n, 3),
        "any_valid_call": round(sum(r["valid_calls"] > 0 for r in rows) / n, 3),
        "calls_per_question": round(sum(r["calls"] for r in rows) / n, 2),
        "accuracy": round(sum(r["correct"] for r in rows) / n, 3),
        # per wording (held-out convention questions) or per type: right / asked
        "by_kind": {
            k: f"{sum(r['correct'] for r in rows if r['kind'] == k)}/"
            f"{sum(r['kind'] == k for r in rows)}"
            for k in dict.fromkeys(r["kind"] for r in rows)
        },
    }


def _plan_body(text: str) -> list[str]:
    """The steps of a plan as the Planner flow hands it on (its <think> block dropped)."""
    from mia.llm.think import text_after_think

    return [line.strip() for line in text_after_think(text).splitlines() if line.strip()]


def run_planner(model_dir: Path, questions: list[Any], gold: dict[str, str]) -> dict[str, Any]:
    """The warm Planner's greedy plans without memories, compared with the gold plans.

    Per kind: how many plans equal the gold plan, start with the gold plan's first step (the
    first search), and have as many steps (a bridge needs two searches, a single hop one).
    """
    import re

    from mia.apps.gold import planner_messages
    from mia.llm.base import SamplingParams
    from mia.llm.local_backend import LocalChat

    chat = LocalChat(model_dir, dtype="float32", max_batch_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=400)

    async def go() -> list[str]:
        outs = await asyncio.gather(
            *(
                chat.chat(planner_messages(q.question, "", image=False)[:2], params)
                for q in questions
            )
        )
        await chat.aclose()
        return [o.text for o in outs]

    t0 = time.perf_counter()
    texts = asyncio.run(go())
    wall = round(time.perf_counter() - t0, 1)
    numbered = [bool(re.search(r"(?m)^1\. .+\n2\. ", t)) for t in texts]
    by_kind: dict[str, list[int]] = {}
    for q, t in zip(questions, texts, strict=True):
        mine, ref = _plan_body(t), _plan_body(gold[q.id])
        row = by_kind.setdefault(_kind(q), [0, 0, 0, 0])
        row[0] += 1
        row[1] += mine == ref
        row[2] += bool(mine) and mine[0] == ref[0]
        row[3] += len(mine) == len(ref)
    return {
        "numbered_plans": round(sum(numbered) / max(len(texts), 1), 3),
        "wall_s": wall,
        # per kind: asked, plan == gold, same first step, same number of steps
        "vs_gold": {
            k: {"n": v[0], "same_plan": v[1], "same_first_step": v[2], "same_steps": v[3]}
            for k, v in by_kind.items()
        },
        "plans": {q.id: t for q, t in zip(questions, texts, strict=True)},
        "example": texts[0][:600] if texts else "",
    }


def _kind(q: Any) -> str:
    """The standard types by name; convention questions as seen or held-out wordings."""
    if q.type != "convention":
        return q.type
    return "held_out_wording" if q.held_out else "seen_convention"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--home", type=Path, help="MIA_HOME (default: a fresh folder)")
    p.add_argument("--base", help="base model folder (default: the embedded SmolLM2)")
    p.add_argument("--roles", default="executor,planner")
    p.add_argument("--eval-only", action="store_true", help="only evaluate (build if missing)")
    p.add_argument("--eval-seed", type=int, default=1)
    p.add_argument("--eval-size", default="default")
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--held-out-wordings", action="store_true",
                   help="only the convention questions whose wording no train split holds: "
                   "how much a perfect plan could give (docs/results.md)")  # fmt: skip
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="ROLE:KEY=VALUE",
                   help="recipe override for one role (repeatable)")  # fmt: skip
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--plans", default="no_plan,gold_plan",
                   help="Executor prompts to evaluate: no_plan, gold_plan, planner_plan (the "
                   "warm Planner's own plans, no memories; needs the planner role)")  # fmt: skip
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="Executor sampling (configs/llm/embedded.yaml has 1.1; see docs/sft.md)")  # fmt: skip
    args = p.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="warm-", dir=ROOT / ".mia"))
    os.environ["MIA_HOME"] = str(home)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    roles = [r for r in args.roles.split(",") if r]
    overrides = {r: [s.split(":", 1)[1] for s in args.sets if s.startswith(f"{r}:")] for r in roles}
    report: dict[str, Any] = {"home": str(home), "cpus": os.cpu_count(), "builds": []}
    for role in roles:
        info = build(role, overrides[role], args.base)
        report["builds"].append(info)
        print(json.dumps(info), flush=True)
    dirs = {b["role"]: Path(b["path"]) for b in report["builds"]}
    if "executor" in dirs:
        from local_search import ServeConfig, open_index
        from local_search.server import create_search_app
        from mia.apps.gold import GoldWriter
        from mia.http import ServerThread

        with tempfile.TemporaryDirectory() as tmp:
            world, questions, index = held_out(
                args.eval_seed, args.eval_size, args.questions, Path(tmp), args.held_out_wordings
            )
            retriever = open_index(index)
            writer = GoldWriter(world, retriever, 3)
            plans = {q.id: writer.plan(q) for q in questions}
            modes = {"no_plan": {}, "gold_plan": plans}
            if "planner" in dirs:
                report["planner"] = run_planner(dirs["planner"], questions, plans)
                print("planner", json.dumps(report["planner"]["vs_gold"]), flush=True)
                modes["planner_plan"] = report["planner"]["plans"]
            with ServerThread(create_search_app(retriever, ServeConfig())) as url:
                for label in [x for x in args.plans.split(",") if x]:
                    if label not in modes:  # planner_plan needs the planner role
                        p.error(f"--plans {label}: one of {', '.join(modes)}")
                    use = modes[label]
                    t0 = time.perf_counter()
                    rows = asyncio.run(
                        run_executor(dirs["executor"], questions, url, use, args.presence_penalty)
                    )
                    summary = summarize(rows) | {"wall_s": round(time.perf_counter() - t0, 1)}
                    report[f"executor_{label}"] = {"summary": summary, "rows": rows}
                    print(label, json.dumps(summary), flush=True)
                    for r in rows[:3]:
                        print("  ", json.dumps({k: r[k] for k in ("question", "gold", "answer")}))
                        print("   first turn:", r["first_turn"][:300].replace("\n", "\\n"))
            retriever.close()
    out = home / "bench" / "warm_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
