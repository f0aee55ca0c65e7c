"""Rollout collection for the GRPO trainer: ``n`` concurrent rollouts per sample, each scored
by the reward function (:class:`RolloutResult`), failed groups dropped, the results grouped,
padded into update batches and dumped to ``rollouts.jsonl``."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.rl.batches import Batch, concat_batches, slice_batch
from mia.rl.episode import Episode, Rollout, SeededGenerator, mix_seed

RewardFn = Callable[[Mapping[str, Any], Any], Any]  # -> float | (float, dict) | awaitable
# group_reward(results): rescores one collection's results in place (sync or async), e.g. a
# majority vote over each group of n rollouts when there is no ground truth.
GroupReward = Callable[[list["RolloutResult"]], Any]


@dataclass
class RolloutResult:
    sample: Mapping[str, Any]
    group: str
    index: int
    trajectory: Any = None
    reward: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def split_reward(value: Any) -> tuple[float, dict[str, Any]]:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        score, extras = value
    else:
        score, extras = value, {}
    try:
        score = float(score)
    except (TypeError, ValueError):
        raise MiaError(f"reward_fn must return a number or (number, dict), got {value!r}") from None
    if not math.isfinite(score):
        raise MiaError(f"reward_fn returned a non-finite reward {score}")
    return score, dict(extras)


async def run_rollouts(
    samples: Sequence[Mapping[str, Any]],
    n: int,
    sampling: SamplingParams,
    step: int,
    phase: str,
    episode: Episode,
    *,
    generator: Any,
    reward_fn: RewardFn,
    seed: int,
    max_concurrent: int | None,
    rollout_errors: str,
) -> list[RolloutResult]:
    """``n`` rollouts of every sample, all in flight at once (at most ``max_concurrent``),
    each scored by ``reward_fn``; group ``<phase>-<step>-<sample>``, sampling seed from
    (``seed``, phase, step, sample, rollout). ``rollout_errors``: raise | drop (the result
    carries ``error``)."""
    limit = max_concurrent
    sem = asyncio.Semaphore(limit) if limit else None

    async def one(i: int, j: int) -> RolloutResult:
        sample = samples[i]
        group = f"{phase}-{step}-{i}"
        rollout_seed = mix_seed(seed, phase, step, i, j)
        rollout = Rollout(
            generator=SeededGenerator(generator, rollout_seed),
            sampling=sampling,
            step=step,
            group=group,
            index=j,
            seed=rollout_seed,
        )
        res = RolloutResult(sample=sample, group=group, index=j)
        t0 = time.perf_counter()
        try:
            if sem is not None:
                async with sem:
                    res.trajectory = await episode.run(sample, rollout)
            else:
                res.trajectory = await episode.run(sample, rollout)
            score = await maybe_await(reward_fn(sample, res.trajectory))
            res.reward, res.extras = split_reward(score)
        except MiaError as err:
            if rollout_errors == "raise":
                raise
            res.error = str(err)
        except Exception as err:
            if rollout_errors == "raise":
                raise
            res.error = "".join(traceback.format_exception_only(err)).strip()
        res.seconds = time.perf_counter() - t0
        return res

    tasks = [one(i, j) for i in range(len(samples)) for j in range(n)]
    return list(await asyncio.gather(*tasks))


def drop_failed_groups(results: list[RolloutResult], step: int) -> tuple[list[RolloutResult], int]:
    """The results of the groups without a failed rollout, and how many results were dropped
    (``step``: the step they are for, in the error when every group failed)."""
    failed = {r.group for r in results if r.error is not None}
    if not failed:
        return results, 0
    kept = [r for r in results if r.group not in failed]
    if not kept:
        raise MiaError(f"every rollout group failed at step {step}")
    return kept, len(results) - len(kept)


def group_results(results: Sequence[RolloutResult]) -> dict[str, list[RolloutResult]]:
    """Results per group id, groups and rollouts in order."""
    groups: dict[str, list[RolloutResult]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    return groups


# ----------------------------------------------------------------------------- update batches


def pad_id(generator: Any) -> int:
    tok = getattr(generator, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is None:
        pad = getattr(tok, "eos_token_id", None)
    return int(pad) if pad is not None else 0


def pad_rows(batch: Batch, multiple: int) -> Batch:
    """Pad a batch to a multiple of the world size with copies of its last row whose response
    mask and advantage are zero: they add nothing to the loss or the token count."""
    n = int(batch["input_ids"].shape[0])
    extra = (-n) % multiple
    if not extra:
        return batch
    filler = slice_batch(batch, n - 1, n)
    filler["response_mask"] = torch.zeros_like(filler["response_mask"])
    filler["advantages"] = torch.zeros_like(filler["advantages"])
    return concat_batches([batch] + [filler] * extra)


def dump_rollouts(path: Path, step: int, results: list[RolloutResult], k: int) -> None:
    """Append the first ``k`` results of ``step`` to the JSONL file ``path``."""
    if k <= 0:
        return
    with path.open("a", encoding="utf-8") as f:
        for r in results[:k]:
            traj = r.trajectory
            body = traj.to_dict(tokens=False) if hasattr(traj, "to_dict") else repr(traj)
            record = {
                "step": step,
                "group": r.group,
                "index": r.index,
                "reward": r.reward,
                "extras": r.extras,
                "trajectory": body,
            }
            f.write(json.dumps(record, default=str) + "\n")
