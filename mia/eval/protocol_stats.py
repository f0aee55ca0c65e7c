"""The protocol's numbers (docs/protocol.md, "Statistics" and "Targets"): accuracy per scope
with clustered 95% bootstrap intervals, paired clustered differences, and the targets.

A question of a run is a :class:`Question` (its world, order and id, with its kind, type and
template); ``outcomes`` maps a row name to ``{Question.key: 0/1}``. A cluster is
``(world, template)``: a template's questions of one world, from both orders, are resampled
together (:func:`mia.eval.stats.cluster_bootstrap_ci`).

    table = scope_table(outcomes, questions, "convention", ["none", "mia"])
    print(format_scope_table(table))
    results = evaluate_targets(protocol.targets, outcomes, questions)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mia.eval.protocol import TYPES, TargetSpec
from mia.eval.stats import cluster_bootstrap_ci, paired_cluster_bootstrap_ci

Key = tuple[int, str, str]  # (world, order, question id)
Outcomes = Mapping[str, Mapping[Key, float]]


@dataclass(frozen=True)
class Question:
    """One question of one stream."""

    world: int
    order: str
    id: str
    kind: str  # standard | convention
    type: str  # single_hop | bridge | comparison | convention
    template: str

    @property
    def key(self) -> Key:
        return (self.world, self.order, self.id)

    @property
    def cluster(self) -> tuple[int, str]:
        return (self.world, self.template)

    def in_scope(self, scope: str) -> bool:
        return scope == "all" or scope in (self.kind, self.type)


def in_scope(questions: Iterable[Question], scope: str) -> list[Question]:
    return [q for q in questions if q.in_scope(scope)]


def accuracy(outcome: Mapping[Key, float], questions: Sequence[Question]) -> dict[str, Any] | None:
    """Mean accuracy over the questions the row answered, with its clustered interval."""
    qs = [q for q in questions if q.key in outcome]
    if not qs:
        return None
    mean, lo, hi = cluster_bootstrap_ci([outcome[q.key] for q in qs], [q.cluster for q in qs])
    return {"n": len(qs), "clusters": len({q.cluster for q in qs}), "mean": mean, "ci": [lo, hi]}


def difference(outcomes: Outcomes, a: str, b: str, questions: Sequence[Question]) -> dict | None:
    """``a - b`` over the questions both rows answered, paired, whole clusters resampled."""
    if a not in outcomes or b not in outcomes:
        return None
    qs = [q for q in questions if q.key in outcomes[a] and q.key in outcomes[b]]
    if not qs:
        return None
    mean, lo, hi = paired_cluster_bootstrap_ci(
        [outcomes[a][q.key] for q in qs], [outcomes[b][q.key] for q in qs], [q.cluster for q in qs]
    )
    return {"a": a, "b": b, "n": len(qs), "mean": mean, "ci": [lo, hi]}


def scope_table(
    outcomes: Outcomes,
    questions: Sequence[Question],
    scope: str,
    rows: Sequence[str],
    against: Sequence[str] = ("none", "mia"),
) -> dict[str, Any]:
    """One table: for each row its accuracy on ``scope`` and its paired difference against
    each of ``against`` (the row itself left out)."""
    qs = in_scope(questions, scope)
    out = []
    for name in rows:
        if name not in outcomes:
            continue
        acc = accuracy(outcomes[name], qs)
        if acc is None:
            continue
        vs = {
            other: difference(outcomes, name, other, qs)
            for other in against
            if other != name and other in outcomes
        }
        out.append({"row": name, **acc, "vs": vs})
    return {
        "scope": scope,
        "questions": len({q.key for q in qs}),
        "clusters": len({q.cluster for q in qs}),
        "rows": out,
    }


def _pts(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:+.1f}"


def _diff_cell(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "-"
    return f"{_signed(d['mean'])} [{_signed(d['ci'][0])}, {_signed(d['ci'][1])}]"


def format_difference(d: Mapping[str, Any]) -> str:
    """``+12.5 [+2.0, +21.0] over 48 questions``."""
    return f"{_diff_cell(d)} over {d['n']} questions"


def format_scope_table(
    table: Mapping[str, Any],
    against: Sequence[str] = ("none", "mia"),
    clusters: str = "clusters (world x template)",
) -> str:
    """A plain-text table: row, n, accuracy % with its clustered interval, and the paired
    differences in points; ``clusters`` names what the title counts."""
    head = ["row", "n", "acc %", "95% CI", *(f"vs {a} [95% CI]" for a in against)]
    lines = [head]
    for r in table["rows"]:
        lines.append(
            [
                r["row"],
                str(r["n"]),
                _pts(r["mean"]),
                f"[{_pts(r['ci'][0])}, {_pts(r['ci'][1])}]",
                *(_diff_cell(r["vs"].get(a)) for a in against),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = [
        "  ".join([c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)])
        for row in lines
    ]
    title = f"{table['scope']}: {table['questions']} questions in {table['clusters']} {clusters}"
    return "\n".join([title, *text])


# ----------------------------------------------------------------------------- targets


def _meets(target: TargetSpec, d: Mapping[str, Any]) -> bool:
    ok = True
    if target.at_least is not None:
        ok &= d["mean"] >= target.at_least
    if target.above is not None:
        ok &= d["mean"] > target.above
    if target.interval_above is not None:
        ok &= d["ci"][0] > target.interval_above
    return bool(ok)


def _needs(target: TargetSpec) -> str:
    parts = []
    if target.at_least is not None:
        parts.append(f">= {_signed(target.at_least)}")
    if target.above is not None:
        parts.append(f"> {_signed(target.above)}")
    if target.interval_above is not None:
        parts.append(f"the interval above {_signed(target.interval_above)}")
    return " with ".join(parts)


def evaluate_targets(
    targets: Sequence[TargetSpec], outcomes: Outcomes, questions: Sequence[Question]
) -> list[dict[str, Any]]:
    """Each target with its number(s), whether it is met, and one line saying so. A target on
    ``each_type`` is met when every question type meets it; its line names the worst type."""
    out = []
    for t in targets:
        a, b = t.rows
        scopes = [ty for ty in TYPES if in_scope(questions, ty)] if t.on == "each_type" else [t.on]
        diffs = {s: difference(outcomes, a, b, in_scope(questions, s)) for s in scopes}
        known = {s: d for s, d in diffs.items() if d is not None}
        met = bool(known) and len(known) == len(diffs) and all(_meets(t, d) for d in known.values())
        if not known:
            number = "no questions answered by both rows"
            worst = None
        else:
            worst = min(known, key=lambda s: known[s]["mean"])
            d = known[worst]
            where = f"worst type {worst}: " if t.on == "each_type" else ""
            number = (
                f"{where}{_signed(d['mean'])} points [{_signed(d['ci'][0])}, {_signed(d['ci'][1])}]"
            )
        line = (
            f"{t.name}: {t.metric} on {t.on} = {number}; needs {_needs(t)}: "
            f"{'met' if met else 'MISSED'}"
        )
        out.append(
            {
                "name": t.name,
                "metric": t.metric,
                "on": t.on,
                "differences": diffs,
                "worst": worst,
                "met": met,
                "line": line,
            }
        )
    return out


def short_result(results: Sequence[Mapping[str, Any]]) -> str:
    """The targets in one line (the ledger's result column)."""
    parts = []
    for r in results:
        d = r["differences"].get(r["worst"]) if r["worst"] else None
        number = _signed(d["mean"]) if d else "n/a"
        parts.append(f"{r['name']} {number} {'met' if r['met'] else 'missed'}")
    return "; ".join(parts)
