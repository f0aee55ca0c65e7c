"""Per-batch accuracy of a TTRL run: ``accuracy.jsonl`` (one row per batch, rewritten atomically
so a resumed run never duplicates a row), ``accuracy.png`` and a text rendering for terminals."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mia.paths import atomic_write_bytes, atomic_write_text


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]


def write_row(path: str | Path, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add (or replace) the row of ``row["batch"]``; rows stay sorted by batch."""
    rows = {int(r["batch"]): r for r in read_rows(path)}
    rows[int(row["batch"])] = dict(row)
    ordered = [rows[b] for b in sorted(rows)]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered)
    atomic_write_text(path, text)
    return ordered


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def plot(rows: Sequence[Mapping[str, Any]], out: str | Path, title: str = "TTRL") -> Path:
    """A PNG of per-batch accuracy (mean over rollouts), its running mean and the reward."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [int(r["batch"]) + 1 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    acc = [_num(r.get("accuracy")) for r in rows]
    if any(a is not None for a in acc):
        ax.plot(xs, [math.nan if a is None else a for a in acc], "o-", label="accuracy (batch)")
        seen: list[float] = []
        running = []
        for a in acc:
            if a is not None:
                seen.append(a)
            running.append(sum(seen) / len(seen) if seen else math.nan)
        ax.plot(xs, running, "--", label="accuracy (running mean)")
    vote = [_num(r.get("accuracy_vote")) for r in rows]
    if any(v is not None for v in vote):
        ax.plot(xs, [math.nan if v is None else v for v in vote], "^-", label="majority answer")
    reward = [_num(r.get("reward_mean")) for r in rows]
    ax.plot(xs, [math.nan if v is None else v for v in reward], "s:", label="planner reward")
    ax.set_xlabel("batch")
    ax.set_ylim(-0.02, 1.2)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return Path(out)


def format_curve(rows: Sequence[Mapping[str, Any]], width: int = 30) -> str:
    """Per-batch accuracy as text bars, e.g. ``batch  3  acc 0.625 |###########       |``."""
    lines = []
    for r in rows:
        acc = _num(r.get("accuracy"))
        value = acc if acc is not None else _num(r.get("self_accuracy"))
        label = "acc" if acc is not None else "self"
        if value is None:
            lines.append(f"batch {int(r['batch']) + 1:>3}  {label} n/a")
            continue
        filled = round(max(0.0, min(1.0, value)) * width)
        reward = _num(r.get("reward_mean"))
        tail = f"  reward {reward:.3f}" if reward is not None else ""
        bar = "#" * filled + " " * (width - filled)
        lines.append(f"batch {int(r['batch']) + 1:>3}  {label} {value:.3f} |{bar}|{tail}")
    return "\n".join(lines)


def step_report(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How much the Planner could learn from a pass: GRPO steps tried (batches with a planned
    question), steps taken without an update (every group tied: all advantages 0), and the
    groups (questions with more than one plan): tied (equal rewards, no signal), all wrong,
    all right.

    >>> rows = [{"planned_questions": 2, "updated": False, "per_question": [
    ...     {"correct": [0.0, 0.0], "rewards": [0.05, 0.05]},
    ...     {"correct": [1.0, 1.0], "rewards": [0.95, 0.95]}]},
    ...     {"planned_questions": 1, "updated": True, "per_question": [
    ...     {"correct": [0.0, 0.0], "rewards": [0.05, 0.15]}, {"correct": [1.0]}]},
    ...     {"planned_questions": 0, "updated": None, "per_question": [{"correct": [1.0]}]}]
    >>> step_report(rows)
    {'batches': 3, 'steps': 2, 'steps_without_update': 1, 'groups': 3, 'groups_tied': 2, 'groups_all_wrong': 2, 'groups_all_right': 1}
    """
    groups = [
        q
        for r in rows
        for q in r.get("per_question") or []
        if len(q.get("correct") or q.get("rewards") or []) > 1
    ]

    def tied(q: Mapping[str, Any]) -> bool:
        values = q.get("rewards") or []
        return bool(values) and max(values) - min(values) < 1e-9

    return {
        "batches": len(rows),
        "steps": sum(1 for r in rows if r.get("planned_questions")),
        "steps_without_update": sum(1 for r in rows if r.get("updated") is False),
        "groups": len(groups),
        "groups_tied": sum(1 for q in groups if tied(q)),
        "groups_all_wrong": sum(1 for q in groups if q.get("correct") and not any(q["correct"])),
        "groups_all_right": sum(
            1 for q in groups if q.get("correct") and all(c == 1 for c in q["correct"])
        ),
    }


def format_steps(report: Mapping[str, int]) -> str:
    """One line for a terminal: how many steps moved the Planner and why the others did not."""
    batches = f"{report['batches']} batch" + ("" if report["batches"] == 1 else "es")
    return (
        f"GRPO: {report['steps']} steps over {batches} (a batch with no planned "
        f"question takes none), {report['steps_without_update']} without an update (every "
        f"group tied); {report['groups']} groups, {report['groups_tied']} tied (equal rewards: "
        f"no signal); {report['groups_all_wrong']} all wrong, {report['groups_all_right']} all "
        "right"
    )
