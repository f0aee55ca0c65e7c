"""Summaries of evaluation rows: numbers per policy, a plain-text table, an accuracy plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mia.paths import atomic_write_text

COLUMNS = (
    ("policy", "policy", "{}"),
    ("questions", "n", "{}"),
    ("accuracy", "acc", "{:.3f}"),
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("tool_calls_per_question", "tools/q", "{:.2f}"),
    ("turns_per_question", "turns/q", "{:.2f}"),
    ("tokens_per_question", "tokens/q", "{:.0f}"),
    ("replan_rate", "replan", "{:.2f}"),
    ("memories_written", "memories", "{}"),
    ("errors", "errors", "{}"),
    ("wall_s", "time s", "{:.0f}"),
)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict[str, Any]], policy: str, judge: str = "") -> dict[str, Any]:
    """Numbers of one policy run. Failed questions count as incorrect in ``accuracy``
    (``accuracy_answered`` leaves them out). ``replan_rate``: share of reflected questions the
    planner sent back for a replan."""
    n = len(rows)
    ok_rows = [r for r in rows if not r.get("error")]
    correct = sum(1 for r in rows if r.get("correct"))
    details = [r.get("judgement", {}).get("detail", {}) for r in ok_rows]
    ems = [float(d["em"]) for d in details if isinstance(d.get("em"), int | float)]
    f1s = [float(d["f1"]) for d in details if isinstance(d.get("f1"), int | float)]
    reflected = [r for r in ok_rows if r.get("need_replan") is not None]
    labels: dict[str, int] = {}
    for r in rows:
        label = r.get("judgement", {}).get("label", "incorrect")
        labels[label] = labels.get(label, 0) + 1
    return {
        "policy": policy,
        "judge": judge,
        "questions": n,
        "answered": len(ok_rows),
        "errors": n - len(ok_rows),
        "correct": correct,
        "accuracy": correct / n if n else None,
        "accuracy_answered": (
            sum(1 for r in ok_rows if r.get("correct")) / len(ok_rows) if ok_rows else None
        ),
        "labels": dict(sorted(labels.items())),
        # Exact match / token F1 whatever the judge (the rule judge's detail), so a lenient
        # containment verdict can be told apart from a clean answer.
        "em": _mean(ems) if len(ems) == len(ok_rows) else None,
        "f1": _mean(f1s) if len(f1s) == len(ok_rows) else None,
        "tool_calls_per_question": _mean([r.get("tool_call_count", 0) for r in ok_rows]),
        "turns_per_question": _mean([r.get("turns", 0) for r in ok_rows]),
        "tokens_per_question": _mean([r.get("tokens", {}).get("total", 0) for r in ok_rows]),
        "answer_tag_rate": _mean(
            [
                float(any("<answer>" in m.get("content", "") for m in r.get("messages", [])))
                for r in ok_rows
            ]
        ),
        "reflected": len(reflected),
        "replan_rate": (
            sum(1 for r in reflected if r.get("need_replan")) / len(reflected)
            if reflected
            else None
        ),
        "replanned": sum(1 for r in ok_rows if r.get("replanned")),
    }


def format_table(summaries: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table, one line per policy ("-" where a number does not apply)."""
    header = [title for _, title, _ in COLUMNS]
    lines = []
    for s in summaries:
        cells = []
        for key, _, fmt in COLUMNS:
            value = s.get(key)
            cell = "-" if value is None else fmt.format(value)
            if key == "memories_written" and s.get("memory_write_errors"):
                cell += f" (+{s['memory_write_errors']} failed)"
            cells.append(cell)
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]

    def fmt_row(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt_row(header), rule, *(fmt_row(c) for c in lines)])


def plot_accuracy(
    summaries: Sequence[dict[str, Any]], rows: Sequence[list[dict[str, Any]]], path: Path
) -> Path:
    """Two panels: accuracy per policy (bars), and running accuracy over the questions in
    dataset order (how accuracy evolves while the memory grows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [s["policy"] for s in summaries]
    accs = [s["accuracy"] or 0.0 for s in summaries]
    bars = left.bar(names, accs, color=[f"C{i}" for i in range(len(names))])
    for bar, s in zip(bars, summaries, strict=True):
        left.annotate(
            f"{s['correct']}/{s['questions']}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    left.set_ylim(0, 1.05)
    left.set_ylabel("accuracy")
    left.set_title(f"accuracy ({summaries[0].get('judge', '') if summaries else ''})")
    for i, (s, policy_rows) in enumerate(zip(summaries, rows, strict=True)):
        ordered = sorted(policy_rows, key=lambda r: r.get("index", 0))
        running, total = [], 0
        for k, r in enumerate(ordered, start=1):
            total += bool(r.get("correct"))
            running.append(total / k)
        right.plot(range(1, len(running) + 1), running, label=s["policy"], color=f"C{i}")
    right.set_ylim(0, 1.05)
    right.set_xlabel("questions (dataset order)")
    right.set_ylabel("running accuracy")
    right.set_title("running accuracy")
    if summaries:
        right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_report(
    out_dir: Path,
    summaries: list[dict[str, Any]],
    rows: list[list[dict[str, Any]]],
    plot: bool = True,
) -> tuple[Path, Path, Path | None, str]:
    """``summary.json``, ``summary.txt`` (the table) and ``accuracy.png`` in ``out_dir``."""
    table = format_table(summaries)
    summary_path = out_dir / "summary.json"
    table_path = out_dir / "summary.txt"
    atomic_write_text(summary_path, json.dumps({"policies": summaries}, indent=2) + "\n")
    atomic_write_text(table_path, table + "\n")
    plot_path = plot_accuracy(summaries, rows, out_dir / "accuracy.png") if plot else None
    return summary_path, table_path, plot_path, table
