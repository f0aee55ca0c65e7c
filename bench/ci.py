"""Accuracy with 95% bootstrap intervals, overall and per question type, from `mia eval` rows.

    python bench/ci.py RUN/none/results.jsonl [--data WORLD/test.jsonl] [--json OUT.json]
    python bench/ci.py RUN                   # every RUN/<policy>/results.jsonl
    python bench/ci.py A/results.jsonl --paired B/results.jsonl   # paired difference A - B

Exact match (SQuAD normalisation, aliases count) is recomputed from each row's ``prediction``
and ``golds``, so the number does not depend on the judge mode the run used; a failed row
(``error`` set) counts as wrong. The question type comes from the row, or from ``--data`` (the
QA file's ``extra_info.question_type``), or from the id's world (``level`` 1 = single_hop).

Library use (bench/efficacy_bench.py):

    from ci import bootstrap_ci, paired_bootstrap_ci, summarize_rows
    bootstrap_ci([1, 0, 1, 1])              # -> (mean, low, high)
    paired_bootstrap_ci(a_correct, b_correct)   # same questions, same order
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# One bootstrap for the demo, the efficacy bench and this script (mia.eval.stats).
from mia.eval.stats import bootstrap_ci, paired_bootstrap_ci  # noqa: E402,F401

TYPES = ("single_hop", "bridge", "comparison", "image")


def em(row: Mapping[str, Any]) -> float:
    """Exact match of a results row (0 for a failed row)."""
    from mia.judge.rules import exact_match

    if row.get("error"):
        return 0.0
    pred = row.get("prediction") or ""
    golds = row.get("golds") or [row.get("answer") or ""]
    return exact_match(str(pred), [str(g) for g in golds])


def question_types(data: str | Path | None) -> dict[str, str]:
    """id -> question type from a QA JSONL file (``extra_info.question_type``)."""
    if data is None:
        return {}
    out = {}
    with open(data, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                qt = (r.get("extra_info") or {}).get("question_type") or r.get("type")
                if qt:
                    out[str(r["id"])] = qt
    return out


def row_type(row: Mapping[str, Any], types: Mapping[str, str]) -> str:
    if str(row.get("id")) in types:
        return types[str(row["id"])]
    for key in ("question_type", "type"):
        if row.get(key) in TYPES:
            return str(row[key])
    if row.get("modality") == "text-image":
        return "image"
    return "single_hop" if row.get("level") == 1 else "multi_hop"


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    # a resumed run may hold a failed row and its retry: keep the last row per id
    last = {str(r.get("id")): r for r in rows}
    return sorted(last.values(), key=lambda r: r.get("index", 0))


def summarize_rows(
    rows: Sequence[Mapping[str, Any]], types: Mapping[str, str] | None = None, **boot: Any
) -> dict[str, Any]:
    """Accuracy (EM) overall and per type with 95% bootstrap intervals, plus cost per question."""
    types = types or {}
    scores = [em(r) for r in rows]
    by: dict[str, list[float]] = {}
    for r, s in zip(rows, scores, strict=True):
        by.setdefault(row_type(r, types), []).append(s)

    def block(vals: Sequence[float]) -> dict[str, Any]:
        m, lo, hi = bootstrap_ci(vals, **boot)
        return {"n": len(vals), "correct": int(sum(vals)), "acc": m, "ci95": [lo, hi]}

    def mean(key: Iterable[float]) -> float:
        vals = list(key)
        return float(np.mean(vals)) if vals else float("nan")

    tok = [r.get("tokens") or {} for r in rows]
    return {
        "overall": block(scores),
        "by_type": {t: block(v) for t, v in sorted(by.items(), key=lambda kv: _order(kv[0]))},
        "answer_tag_rate": mean(float(r.get("stop_reason") == "answer") for r in rows),
        "errors": sum(1 for r in rows if r.get("error")),
        "tool_calls_per_q": mean(float(r.get("tool_call_count") or 0) for r in rows),
        "turns_per_q": mean(float(r.get("turns") or 0) for r in rows),
        "prompt_tokens_per_q": mean(float(t.get("prompt") or 0) for t in tok),
        "completion_tokens_per_q": mean(float(t.get("completion") or 0) for t in tok),
        "elapsed_s_per_q": mean(float(r.get("elapsed_s") or 0) for r in rows),
        "scores": {str(r.get("id")): s for r, s in zip(rows, scores, strict=True)},
    }


def _order(t: str) -> int:
    return TYPES.index(t) if t in TYPES else len(TYPES)


def format_summary(name: str, s: Mapping[str, Any]) -> str:
    def cell(b: Mapping[str, Any]) -> str:
        lo, hi = b["ci95"]
        return f"{b['acc']:.3f} [{lo:.3f}, {hi:.3f}] ({b['correct']}/{b['n']})"

    lines = [f"{name}: EM {cell(s['overall'])}"]
    for t, b in s["by_type"].items():
        lines.append(f"  {t:<11} {cell(b)}")
    lines.append(
        f"  answer-tag {s['answer_tag_rate']:.2f}, errors {s['errors']}, tools/q "
        f"{s['tool_calls_per_q']:.2f}, turns/q {s['turns_per_q']:.2f}, completion tok/q "
        f"{s['completion_tokens_per_q']:.0f}, prompt tok/q {s['prompt_tokens_per_q']:.0f}, "
        f"s/q {s['elapsed_s_per_q']:.1f}"
    )
    return "\n".join(lines)


def _results_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(path.glob("*/results.jsonl"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="results.jsonl files or eval run folders")
    p.add_argument("--data", type=Path, action="append", default=[],
                   help="QA JSONL file(s) for question types (repeatable)")  # fmt: skip
    p.add_argument("--paired", type=Path, help="results.jsonl to compare against (A - B)")
    p.add_argument("--json", type=Path, help="write the summaries here")
    p.add_argument("--boot", type=int, default=10_000, help="bootstrap resamples")
    args = p.parse_args(argv)
    types: dict[str, str] = {}
    for d in args.data:
        types.update(question_types(d))
    files = [f for r in args.results for f in _results_files(r)]
    rows = [r for f in files for r in load_rows(f)]
    if not rows:
        print("ci: no results rows found", file=sys.stderr)
        return 2
    s = summarize_rows(rows, types, n_boot=args.boot)
    print(format_summary(" + ".join(str(f) for f in files), s))
    out: dict[str, Any] = {"files": [str(f) for f in files], "summary": s}
    if args.paired is not None:
        other = {str(r.get("id")): em(r) for r in load_rows(args.paired)}
        ids = [i for i in s["scores"] if i in other]
        d = paired_bootstrap_ci([s["scores"][i] for i in ids], [other[i] for i in ids],
                                n_boot=args.boot)  # fmt: skip
        print(f"paired A - B over {len(ids)} questions: {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]")
        out["paired"] = {"against": str(args.paired), "n": len(ids), "diff": d[0],
                         "ci95": [d[1], d[2]]}  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
