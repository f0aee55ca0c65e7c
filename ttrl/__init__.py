"""Test-time RL over a test stream (``python -m ttrl mode=supervised|nogt``; docs/reference.md §7.3, §8).

One pass; per batch: memories -> n plans per question -> the Executor -> judging (ground truth,
the no-GT review panel, or majority vote) -> GRPO step on the Planner -> memory writes. Resumes
after a kill without writing a memory twice. ``run_ttrl_pass`` is the entry point of
``mia demo --ttrl``.
"""

from __future__ import annotations

from typing import Any


def run_ttrl_pass(*args: Any, **kwargs: Any) -> Any:
    """See :func:`ttrl.run.run_ttrl_pass` (imported lazily: torch is heavy)."""
    from ttrl.run import run_ttrl_pass as _run

    return _run(*args, **kwargs)


def format_curve(rows: Any, width: int = 30) -> str:
    from ttrl.curve import format_curve as _fmt

    return _fmt(rows, width)
