"""What ``mia demo`` reports: the TTRL pass as a table row, every policy's per-question outcomes
and question groups for the comparison table, how many templates memory could act on, and the
printed report."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


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


# Memory can act on a question only after a question of its template failed; the demo says it
# cannot show memory at work when fewer templates than this give it that chance.
MEMORY_MIN_TEMPLATES = 2
BENCH_COMMAND = "python bench/efficacy_bench.py --protocol configs/efficacy/dev.yaml"


def memory_chances(
    items: list[Any],
    templates: Mapping[str, str],
    outcomes: Mapping[str, Mapping[str, float]],
    policies: list[str],
) -> dict[str, Any]:
    """How many templates give memory a chance to act: those in which a question that the
    first memory-writing policy of the run (``mia`` in the demo) answered wrongly comes before
    another question of the same template, in the order asked. No memory-writing policy: 0."""
    from mia.eval.policies import spec

    writer = next((p for p in policies if spec(p).writes and p in outcomes), None)
    failed: set[str] = set()
    chances: set[str] = set()
    for it in items if writer else []:
        template = templates.get(it.id, "")
        if not template:
            continue
        if template in failed:
            chances.add(template)
        if not outcomes[writer].get(it.id):
            failed.add(template)
    return {
        "policy": writer,
        "templates": sorted(chances),
        "needed": MEMORY_MIN_TEMPLATES,
        "shown": len(chances) >= MEMORY_MIN_TEMPLATES,
    }


def print_report(
    result: Any,
    summaries: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    ttrl_results: dict[str, Any],
    elapsed: float,
    raw_embedded_executor: bool,
    by_kind: Sequence[Mapping[str, Any]] = (),
    chances: Mapping[str, Any] | None = None,
    baseline: str = "none",
) -> None:
    """The comparison table (overall, then per kind), each TTRL pass's per-batch curve and
    GRPO line, the line saying when memory had too few chances to act, and where the results
    are."""
    from mia.eval.protocol_stats import format_scope_table
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
    print("Accuracy (exact match) with 95% bootstrap intervals clustered by question template")
    print("(questions of one template resampled together); 'vs none' is the paired difference")
    print("in points over the same questions (an interval above 0 is beyond noise):")
    print(format_comparison([{k: v for k, v in r.items() if k != "groups"} for r in rows], extra))
    for table in by_kind:
        print()
        print(format_scope_table(table, against=(baseline,), clusters="templates"))
    grpo = {s["policy"]: s["grpo"] for s in summaries if "grpo" in s}  # ttrl_summary's report
    for name, res in ttrl_results.items():
        from ttrl import format_curve
        from ttrl.curve import format_steps

        print()
        print(f"{name} accuracy per batch (each batch judged before the Planner learns from it):")
        print(format_curve(res.rows))
        print(format_steps(grpo[name]))
    if chances is not None and not chances["shown"]:
        print()
        print(
            f"note: {rows[0]['n'] if rows else 0} questions cannot show memory at work "
            f"({len(chances['templates'])} template(s) where a failure precedes a question of "
            f"the same template, {chances['needed']} needed); {BENCH_COMMAND} measures it"
        )
    print()
    _print_paths(result, ttrl_results)
    print(f"done in {elapsed:.0f}s")
    calls = [s.get("tool_calls_per_question") or 0 for s in summaries]
    if raw_embedded_executor and max(calls, default=0) < 0.5:
        print(
            "note: the raw SmolLM2-135M answers without calling the search tool (tools/q "
            "near 0), so accuracy is near zero; the warm start (on by default) teaches it to "
            "search. Point the roles at a stronger model with --executor-url/--planner-url/"
            "--manager-url."
        )


def _print_paths(result: Any, ttrl_results: dict[str, Any]) -> None:
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
