"""Episodes: how one rollout of one sample is produced, and how rollouts become a policy batch.

An **episode** is anything with ``async run(sample, rollout) -> trajectory``. The trainer calls it
n times per prompt, concurrently; ``rollout.generator`` is a per-rollout view of the shared
generator that gives every sampling call its own deterministic seed, so the n rollouts of a
group differ from each other but a rerun with the same seed reproduces them.

A **trajectory** is whatever the episode returns, as long as it carries the token view the
trainer learns from (duck-typed, as :class:`mia.agent.Trajectory` does):

- ``prompt_ids``: list[int]; ``response_ids``: list[int];
- ``response_mask``: list[int] (1 = the policy sampled it, 0 = injected tool/user tokens);
- ``rollout_logprobs``: list[float] or None (behaviour log-probs, 0.0 on injected tokens);
- optionally ``multimodal``: ``{"pixel_values", "image_grid_thw"}`` for Qwen2.5-VL.

The reward function sees the sample and the whole trajectory (answer, tool calls, messages).

:class:`AgentEpisode` adapts :class:`mia.agent.ExecutorLoop` (token mode) to this protocol; the
Executor, Planner and TTRL trainers supply their own episodes or configure this one.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from mia.errors import MiaError
from mia.llm.base import ChatResult, SamplingParams

if TYPE_CHECKING:
    from mia.agent import AgentConfig, Tool, ToolSet
    from mia.rl.generators.base import Generator


def mix_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts (stable across processes and Python versions)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class SeededGenerator:
    """A view of a generator for ONE rollout: the k-th call without an explicit seed samples
    with ``mix_seed(seed, k)``. Everything else (tokenizer, locks, context size, weight
    version) is the wrapped generator's, so token-mode policies use it like the real one."""

    def __init__(self, inner: Generator, seed: int | None) -> None:
        self.inner = inner
        self.seed = seed
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        p = params if params is not None else SamplingParams()
        if p.seed is None and self.seed is not None:
            p = replace(p, seed=mix_seed(self.seed, self.calls))
        self.calls += 1
        # Yield once before submitting: rollouts that start together all finish their Python
        # work (templates, parsing, tools) first and then submit back to back, so a static-batch
        # engine (transformers) decodes them as one batch instead of a few rows plus the rest.
        await asyncio.sleep(0)
        return await self.inner.generate(prompt_ids, p, multimodal=multimodal)

    generate_ids = generate  # the method name mia.agent.TokenPolicy calls


@dataclass
class Rollout:
    """What an episode gets besides the sample: where to sample from and how."""

    generator: Any  # a SeededGenerator (or any Generator)
    sampling: SamplingParams
    step: int = 0
    group: str = ""  # the prompt's uid: rollouts of one prompt share it
    index: int = 0  # 0..n-1 within the group
    seed: int | None = None


@runtime_checkable
class Episode(Protocol):
    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> Any: ...


# ----------------------------------------------------------------------------- agent adapter


# The generator view of the rollout running in the current asyncio task: one TokenPolicy (and
# loop) per generator serves every rollout, each task still sampling with its own seeds.
_ROLLOUT_GENERATOR: contextvars.ContextVar[Any] = contextvars.ContextVar("mia_rollout_generator")
_MAX_CACHED_LOOPS = 8


class _TaskEngine:
    """An engine for :class:`mia.agent.TokenPolicy` that forwards each call to the current
    task's rollout generator (its seeded view); everything else is the shared generator's."""

    def __init__(self, base: Any) -> None:
        self.base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    async def generate_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        gen = _ROLLOUT_GENERATOR.get(self.base)
        call = getattr(gen, "generate_ids", None) or gen.generate
        if multimodal is None:
            return await call(prompt_ids, params)
        return await call(prompt_ids, params, multimodal=multimodal)

    generate = generate_ids


class _BoundLoop:
    """A shared loop seen through one rollout: each coroutine method (``run``,
    ``continue_with_plan``...) runs with the rollout's generator as the current one; other
    attributes (``cfg``, ``policy``, ``tools``) are the loop's."""

    def __init__(self, loop: Any, generator: Any) -> None:
        self._loop = loop
        self._generator = generator

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._loop, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def bound(*args: Any, **kwargs: Any) -> Any:
            token = _ROLLOUT_GENERATOR.set(self._generator)
            try:
                return await attr(*args, **kwargs)
            finally:
                _ROLLOUT_GENERATOR.reset(token)

        return bound


class AgentEpisode:
    """One :class:`mia.agent.ExecutorLoop` run in token mode per rollout.

    ``tools``: a ToolSet, a list of tools, or config entries (``{name: {type|_target_,
    params}}``, built with :func:`mia.agent.build_tools`); default: ``cfg.tools``.
    ``task_fn`` maps a dataset sample to the loop's task (default: the sample itself, which
    needs ``question`` and may carry ``plan``, ``data_id``). ``loop_cls`` lets a task change the
    prompt or the loop (a subclass of ExecutorLoop). The trainer's sampling parameters are the
    policy defaults; ``cfg.sampling`` overrides them.

    The loop and its TokenPolicy hold no per-rollout state, so one of each per generator and
    sampling setting serves all rollouts (building a TokenPolicy renders the chat template
    several times: per rollout that was a measurable share of a batched turn).
    """

    def __init__(
        self,
        tools: ToolSet | Sequence[Tool] | Mapping[str, Any] | None = None,
        cfg: AgentConfig | Mapping[str, Any] | None = None,
        *,
        loop_cls: type | None = None,
        task_fn: Callable[[Mapping[str, Any]], Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from mia.agent import AgentConfig, ExecutorLoop, ToolSet, build_tools, load_agent_config

        if cfg is None:
            cfg = AgentConfig(tools={})
        elif not isinstance(cfg, AgentConfig):
            cfg = load_agent_config(dict(cfg))
        self.cfg = cfg.validate()
        if tools is None:
            tools = build_tools(self.cfg.tools)
        elif isinstance(tools, Mapping):
            tools = build_tools(tools)
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.loop_cls = loop_cls or ExecutorLoop
        self.task_fn = task_fn
        self.chat_template_kwargs = chat_template_kwargs
        self._loops: dict[tuple[int, str], tuple[Any, Any]] = {}

    def make_loop(self, generator: Any, sampling: SamplingParams) -> Any:
        """The loop for one rollout: the cached shared loop, bound to ``generator`` (the
        rollout's seeded view) -- its ``run``/``continue_with_plan`` sample from it."""
        from mia.agent import TokenPolicy

        base = generator.inner if isinstance(generator, SeededGenerator) else generator
        key = (id(base), repr(sampling))
        cached = self._loops.get(key)
        if cached is None or cached[0] is not base:
            policy = TokenPolicy(
                _TaskEngine(base),
                defaults=sampling,
                chat_template_kwargs=self.chat_template_kwargs,
            )
            cached = (base, self.loop_cls(policy, self.tools, self.cfg))
            self._loops[key] = cached
            while len(self._loops) > _MAX_CACHED_LOOPS:  # e.g. one scripted engine per sample
                self._loops.pop(next(iter(self._loops)))
        return _BoundLoop(cached[1], generator)

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> Any:
        loop = self.make_loop(rollout.generator, rollout.sampling)
        task = self.task_fn(sample) if self.task_fn is not None else sample
        return await loop.run(task)

    async def aclose(self) -> None:
        await self.tools.aclose()


# ----------------------------------------------------------------------------- collation


def token_view(traj: Any) -> tuple[list[int], list[int], list[int], list[float] | None]:
    """(prompt_ids, response_ids, response_mask, rollout_logprobs) of a trajectory, checked."""
    prompt = getattr(traj, "prompt_ids", None)
    resp = getattr(traj, "response_ids", None)
    mask = getattr(traj, "response_mask", None)
    if prompt is None or resp is None or mask is None:
        raise MiaError(
            f"{type(traj).__name__} has no token view (prompt_ids / response_ids / "
            "response_mask): the episode must run in token mode (e.g. mia.agent.TokenPolicy)"
        )
    if not prompt:
        raise MiaError("a trajectory has an empty prompt")
    if len(mask) != len(resp):
        raise MiaError(f"response_mask has {len(mask)} entries for {len(resp)} response tokens")
    lps = getattr(traj, "rollout_logprobs", None)
    if lps is not None and len(lps) != len(resp):
        raise MiaError(f"rollout_logprobs has {len(lps)} entries for {len(resp)} tokens")
    return list(prompt), list(resp), list(mask), (list(lps) if lps is not None else None)


def collate(trajectories: Sequence[Any], pad_id: int = 0) -> dict[str, Any]:
    """A policy batch (see :mod:`mia.rl.policy`) from token trajectories.

    Prompts are left-padded and responses right-padded, so every prompt ends at the same column
    and ``input_ids[b] = [pad..., prompt, response, pad...]``. ``rollout_logprobs`` ([B, L], 0
    outside policy tokens) is present only when every trajectory has them.
    """
    if not trajectories:
        raise MiaError("no trajectories to collate")
    views = [token_view(t) for t in trajectories]
    p_max = max(len(v[0]) for v in views)
    r_max = max(len(v[1]) for v in views)
    b, length = len(views), p_max + r_max
    input_ids = torch.full((b, length), int(pad_id), dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    resp_mask = torch.zeros((b, length), dtype=torch.long)
    have_lps = all(v[3] is not None for v in views)
    lps = torch.zeros((b, length), dtype=torch.float32) if have_lps else None
    for i, (prompt, resp, mask, lp) in enumerate(views):
        p0 = p_max - len(prompt)
        r1 = p_max + len(resp)
        input_ids[i, p0:p_max] = torch.tensor(prompt, dtype=torch.long)
        input_ids[i, p_max:r1] = torch.tensor(resp, dtype=torch.long)
        attn[i, p0:r1] = 1
        resp_mask[i, p_max:r1] = torch.tensor(mask, dtype=torch.long)
        if lps is not None and lp is not None:
            lps[i, p_max:r1] = torch.tensor(lp, dtype=torch.float32) * resp_mask[i, p_max:r1]
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attn,
        "response_mask": resp_mask,
    }
    if lps is not None:
        batch["rollout_logprobs"] = lps
    mm = [getattr(t, "multimodal", None) for t in trajectories]
    if any(mm):
        batch["pixel_values"] = [m.get("pixel_values") if m else None for m in mm]
        batch["image_grid_thw"] = [m.get("image_grid_thw") if m else None for m in mm]
    return batch
