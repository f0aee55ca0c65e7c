"""MIA's rewards as veRL reward functions.

veRL 0.9's reward managers call ``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=, **reward_kwargs)`` (sync or async) and take a dict with ``score`` plus extra
scalars (logged per key; ``acc`` and ``pred`` get veRL's accuracy and majority-vote metrics).
The ``mia_executor`` / ``mia_planner`` agent loops leave a record of each rollout in their
``extra_fields["mia"]``, which veRL's reward loop merges into ``extra_info``
(:mod:`mia.verl.records`); the functions here rebuild what :mod:`mia.rewards` reads from it and
return its score, so a veRL run and a ``mia.rl`` run score a rollout identically
(tests/test_verl_rewards.py).

Recipes point ``reward.custom_reward_function.path`` at this file (or ``pkg://``-free: the
module path) with ``name: compute_score`` and these ``reward_kwargs``:

- ``judge``: a :class:`mia.judge.JudgeConfig` mapping (default rules/contains; ``{type: llm}``
  for the SimpleQA-style judge, ``{type: panel}`` for the no-ground-truth review panel);
- ``llm``: the LLM roles an LLM judge uses (``configs/llm/<name>.yaml`` or a file);
- ``weights``: overrides of the reward's weights (``configs/reward/<kind>.yaml`` keys);
- ``mode``: ``gt`` (default) or ``nogt`` for Planner rollouts (TTRL without ground truth);
- ``bank_url``: TTRL, memory_serve's URL: each Planner rollout is buffered there
  (``/memory_bank_save``) with its judgement, as the reference's TTRL reward did.

Rows of the reference's Planner data (``extra_info.messages`` = the 3 or 6 useful messages) are
scored without a record (:meth:`PlannerEpisodeRecord.from_reference_messages`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from mia.errors import MiaError
from mia.rewards import (
    ExecutorRewardConfig,
    NoGTRewardConfig,
    PlannerEpisodeRecord,
    PlannerRewardConfig,
    executor_reward,
    load_reward_config,
    nogt_reward,
    planner_reward,
)
from mia.verl import RECORD_KEY
from mia.verl.records import as_golds, trajectory_of

_JUDGES: dict[tuple[str, int], Any] = {}
_CLIENTS: dict[tuple[str, int], Any] = {}


def _plain(value: Any) -> Any:
    from mia.config import plain

    if value is None or isinstance(value, str | int | float | bool):
        return value
    return plain(value)


def judge_for(judge: Any = None, llm: Any = "embedded") -> Any:
    """The judge of ``judge`` (a JudgeConfig mapping; None: rules) on ``llm``, one per
    event loop (LLM judges hold async HTTP clients)."""
    from mia.roles.common import build_judge

    spec = _plain(judge) or {}
    key = (json.dumps([spec, _plain(llm)], sort_keys=True, default=str), id(_loop()))
    if key not in _JUDGES:
        _JUDGES[key] = build_judge(spec, _plain(llm) or "embedded")
    return _JUDGES[key]


def _loop() -> Any:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _record(extra_info: Mapping[str, Any] | None, kind: str | None = None) -> dict[str, Any]:
    rec = (extra_info or {}).get(RECORD_KEY)
    if not isinstance(rec, Mapping):
        raise MiaError(
            f"extra_info has no {RECORD_KEY!r} record: the rollout was not produced by MIA's "
            "mia_executor / mia_planner agent loop (set the rows' agent_name)"
        )
    if kind is not None and rec.get("kind") != kind:
        raise MiaError(f"a {rec.get('kind')!r} rollout given to the {kind} reward")
    return dict(rec)


def _result(score: float, extras: Mapping[str, Any], answer: str) -> dict[str, Any]:
    """veRL's reward dict: the score and the scalar extras (lists and dicts are left out:
    veRL stacks each key over the batch), ``pred`` = the final answer."""
    out: dict[str, Any] = {"score": float(score)}
    for key, value in extras.items():
        if key != "score" and (value is None or isinstance(value, bool | int | float | str)):
            out[key] = value
    out["pred"] = answer
    return out


async def executor_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    judge: Any = None,
    llm: Any = "embedded",
    weights: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """docs/reference.md §7.1 (:func:`mia.rewards.executor_reward`) for a ``mia_executor``
    rollout."""
    rec = _record(extra_info, "executor")
    golds = as_golds(ground_truth)
    if not golds:
        raise MiaError("reward_model.ground_truth is empty: the Executor reward needs answers")
    traj = trajectory_of(rec)
    cfg = load_reward_config(ExecutorRewardConfig, _plain(weights))
    score, extras = await executor_reward(
        traj, golds, judge_for(judge, llm), cfg, first_correct=rec.get("first_correct")
    )
    return _result(score, extras, traj.answer)


def planner_episode(extra_info: Mapping[str, Any] | None) -> PlannerEpisodeRecord:
    """The Planner episode of a ``mia_planner`` record, or of the reference's
    ``extra_info.messages`` (3 or 6 useful messages)."""
    info = extra_info or {}
    rec = info.get(RECORD_KEY)
    if isinstance(rec, Mapping) and rec.get("kind") == "planner":
        return PlannerEpisodeRecord.from_dict(rec["record"])
    if info.get("messages") is not None:
        return PlannerEpisodeRecord.from_reference_messages(
            list(info["messages"]), question=str(info.get("question") or "")
        )
    _record(info, "planner")  # raises the missing-record error
    raise AssertionError("unreachable")


async def planner_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    judge: Any = None,
    llm: Any = "embedded",
    weights: Any = None,
    mode: str = "gt",
    bank_url: str | None = None,
    bank_token: str | None = None,
    **_: Any,
) -> dict[str, Any]:
    """docs/reference.md §7.2 (:func:`mia.rewards.planner_reward`; ``mode=nogt``: §7.3,
    :func:`mia.rewards.nogt_reward` with a panel judge) for a ``mia_planner`` rollout;
    ``bank_url``: TTRL, buffer the rollout in memory_serve with its judgement."""
    record = planner_episode(extra_info)
    if mode == "nogt":
        cfg = load_reward_config(NoGTRewardConfig, _plain(weights))
        score, extras = await nogt_reward(record, judge_for(judge or {"type": "panel"}, llm), cfg)
    elif mode == "gt":
        golds = as_golds(ground_truth)
        if not golds:
            raise MiaError("reward_model.ground_truth is empty (mode=nogt grades without it)")
        cfg = load_reward_config(PlannerRewardConfig, _plain(weights))
        score, extras = await planner_reward(record, golds, judge_for(judge, llm), cfg)
    else:
        raise MiaError(f"reward mode must be gt | nogt, got {mode!r}")
    if bank_url:
        await bank_save(
            bank_url, (extra_info or {}).get(RECORD_KEY), score, extras, mode, bank_token
        )
    return _result(score, extras, record.final_answer)


async def bank_save(
    url: str,
    rec: Mapping[str, Any] | None,
    score: float,
    extras: Mapping[str, Any],
    mode: str,
    token: str | None = None,
) -> None:
    """Buffer one TTRL rollout in memory_serve (``/memory_bank_save``) with its judgement."""
    from mia.services import MemoryClient

    item = dict((rec or {}).get("bank") or {})
    if not item:
        raise MiaError(
            "bank_url is set but the rollout has no bank item: set mia.ttrl.bank=true so the "
            "mia_planner loop records one"
        )
    judgement = str(extras.get("judgement") or "incorrect")
    item.pop("judgement", None)
    item.pop("judgement_nogt", None)
    item["judgement_nogt" if mode == "nogt" else "judgement"] = judgement
    item["extra"] = {**dict(item.get("extra") or {}), "reward": float(score)}
    key = (f"{url}|{token}", id(_loop()))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = MemoryClient(url, token=token)
    await client.bank_save([item])


async def compute_score(
    data_source: Any = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """veRL's entry point: the Executor reward for ``mia_executor`` rollouts, the Planner's
    (or, with ``mode=nogt``, the no-ground-truth one) for ``mia_planner`` rollouts and for
    reference Planner rows."""
    rec = (extra_info or {}).get(RECORD_KEY)
    kind = rec.get("kind") if isinstance(rec, Mapping) else None
    fn = executor_score if kind == "executor" else planner_score
    return await fn(data_source, solution_str, ground_truth, extra_info, **kwargs)
