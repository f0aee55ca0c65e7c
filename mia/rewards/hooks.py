"""Pluggable reward functions: where user feedback enters training (the reward server's
``--reward-fn package.module:function``).

A reward function takes one :class:`RewardContext` and returns ``(score, extras)`` -- or just a
number -- sync or async::

    from mia.rewards.hooks import RewardContext

    async def my_reward(ctx: RewardContext) -> tuple[float, dict]:
        thumbs_up = ctx.request.get("feedback") == "up"   # any extra request field
        return (1.0 if thumbs_up else 0.0), {"judgement": "correct" if thumbs_up else "incorrect"}

``extras`` keys the reward server copies into its response when present: ``judgement``,
``format`` (-> ``format_score``), ``decision`` (-> ``decision_score``), ``is_answer1_correct``,
``is_answer2_correct``; everything JSON-safe in it is returned under ``extras`` as well.
Sync functions run in a worker thread, so they may block (read a file, call a service).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mia.errors import MiaError
from mia.judge.base import Judge
from mia.rewards.nogt import nogt_reward
from mia.rewards.planner import PlannerEpisodeRecord, planner_reward

DEFAULT_REWARD_FN = "mia.rewards.hooks:planner_gt_reward"


@dataclass
class RewardContext:
    data_id: str
    ground_truths: list[str]  # every registered alias
    record: PlannerEpisodeRecord
    judge: Judge  # the server's configured judge (rules | llm | panel)
    question: str = ""
    data_source: str | None = None
    config: Mapping[str, Any] | None = None  # the server's --reward-config, as loaded
    request: dict[str, Any] = field(default_factory=dict)  # the raw request body


RewardResult = tuple[float, dict[str, Any]] | float
RewardFn = Callable[[RewardContext], RewardResult | Awaitable[RewardResult]]


async def planner_gt_reward(ctx: RewardContext) -> tuple[float, dict[str, Any]]:
    """The default: the Planner reward (docs/reference.md §7.2) against the registered ground truth."""
    return await planner_reward(ctx.record, ctx.ground_truths, ctx.judge, ctx.config)


async def nogt_panel_reward(ctx: RewardContext) -> tuple[float, dict[str, Any]]:
    """No-ground-truth reward (docs/reference.md §7.3); run the server with ``--judge panel``."""
    return await nogt_reward(ctx.record, ctx.judge, ctx.config, question=ctx.question)


def load_reward_fn(spec: str) -> RewardFn:
    """Import ``package.module:function`` (a clear :class:`MiaError` for every way it can fail)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise MiaError(f"reward function must be 'package.module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise MiaError(f"reward function {spec}: cannot import {module_name}: {err}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise MiaError(f"reward function {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise MiaError(f"reward function {spec} is not callable")
    return obj


class RewardFnError(MiaError):
    """A reward function returned something that is not a score."""


async def call_reward_fn(fn: RewardFn, ctx: RewardContext) -> tuple[float, dict[str, Any]]:
    """Run ``fn`` (sync in a thread, async awaited) and check what it returned."""
    if inspect.iscoroutinefunction(fn):
        result = await fn(ctx)
    else:
        # An async callable object returns its coroutine from the thread; it runs here.
        result = await asyncio.to_thread(fn, ctx)
        if inspect.isawaitable(result):
            result = await result
    if isinstance(result, tuple) and len(result) == 2:
        score, extras = result
    else:
        score, extras = result, {}
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise RewardFnError(
            f"reward function returned a non-numeric or non-finite score: {score!r}"
        )
    if not isinstance(extras, Mapping):
        raise RewardFnError(f"reward function extras must be a dict, got {type(extras).__name__}")
    return float(score), dict(extras)
