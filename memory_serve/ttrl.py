"""TTRL rollout selection (docs/reference.md §3.2, §4.6, §4.7): which buffered rollout is evaluated under
each rule, and which rollouts a consolidation step turns into memories.

Deterministic: every random choice uses an RNG seeded by (seed, purpose, question key), so the
result does not depend on request order or on the process.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memory_serve.records import CORRECT, Rollout
from mia.llm.think import text_after_think

_STEP = re.compile(r"^\s*(?:step\s*)?\d+\s*[.):]", re.IGNORECASE | re.MULTILINE)
_INT = re.compile(r"\d+")


def group_rollouts(rollouts: Sequence[Rollout]) -> dict[str, list[Rollout]]:
    """Rollouts per question key, questions in order of first arrival, rollouts oldest first."""
    groups: dict[str, list[Rollout]] = {}
    for r in sorted(rollouts, key=lambda r: r.id):
        groups.setdefault(r.key, []).append(r)
    return groups


def seeded_rng(seed: int, purpose: str, key: str) -> random.Random:
    return random.Random(f"{seed}:{purpose}:{key}")


def plan_length(plan: str) -> tuple[int, int]:
    """(numbered steps, words): the reference's measure for the shortest/longest rules."""
    return len(_STEP.findall(plan)), len(plan.split())


def select_index(rule: str, rollouts: Sequence[Rollout], seed: int) -> int:
    """Index of the rollout a non-LLM rule picks (ties: the earliest)."""
    if not rollouts:
        raise ValueError("no rollouts to select from")
    if rule == "first":
        return 0
    if rule == "random":
        return seeded_rng(seed, "evaluate", rollouts[0].key).randrange(len(rollouts))
    lengths = [plan_length(r.plan) for r in rollouts]
    if rule == "shortest":
        return min(range(len(rollouts)), key=lambda i: lengths[i])
    if rule == "longest":
        return max(range(len(rollouts)), key=lambda i: (lengths[i], -i))
    raise ValueError(f"unknown selection rule {rule!r}")


def parse_choice(text: str, n: int) -> int | None:
    """0-based index from a reply naming plan 1..n (first integer in range), else None."""
    for match in _INT.findall(text_after_think(text)):
        k = int(match)
        if 1 <= k <= n:
            return k - 1
    return None


@dataclass(frozen=True)
class Consolidation:
    positive: Rollout | None
    negative: Rollout | None
    # Which side carries its used_memory_ids into the win-rate credit (the majority outcome).
    credit_positive: bool
    credit_negative: bool


def consolidate_group(rollouts: Sequence[Rollout], seed: int) -> Consolidation:
    """The correct rollout with the fewest messages and one seeded-random incorrect one.

    Win-rate credit follows the majority outcome: if #correct <= #incorrect only the negative
    carries its used memory ids (the used memories record a failure), otherwise only the
    positive does. A lone side always carries its ids.
    """
    correct = [r for r in rollouts if r.judgement == CORRECT]
    incorrect = [r for r in rollouts if r.judgement != CORRECT]
    positive = min(correct, key=lambda r: (len(r.messages), r.id)) if correct else None
    negative = None
    if incorrect:
        rng = seeded_rng(seed, "consolidate", incorrect[0].key)
        negative = incorrect[rng.randrange(len(incorrect))]
    majority_correct = len(correct) > len(incorrect)
    return Consolidation(
        positive=positive,
        negative=negative,
        credit_positive=positive is not None and (negative is None or majority_correct),
        credit_negative=negative is not None and (positive is None or not majority_correct),
    )
