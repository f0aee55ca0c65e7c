"""MIA's Executor and Planner loops as veRL 0.9 agent loops (``verl.experimental.agent_loop``).

- ``mia_executor`` (:class:`MiaExecutorAgentLoop`): one Executor GRPO rollout,
  :func:`mia.planner.executor_rollout.run_executor_rollout` -- the Executor loop of
  :mod:`mia.agent` (think -> tool call -> observation ... -> ``<answer>``, text search and
  image search from ``mia.agent.tools``, the row's plan as its guide), the judge's verdict on
  the first answer and ONE supplementary plan from memory_serve ``/replan_train`` mid-rollout.
- ``mia_planner`` (:class:`MiaPlannerAgentLoop`): one Planner rollout,
  :class:`mia.planner.episode.PlannerEpisode` -- plan -> the frozen Executor over HTTP (serve
  ``/execute``) -> reflect yes/no -> replan -> serve ``/continue``, as one token-exact
  conversation; TTRL runs it too (memories from ``/memory``).

Both drive MIA's token-exact policy (:class:`mia.verl.engine.BudgetPolicy`) over veRL's
server client and return an ``AgentLoopOutput``: the prompt ids, the response ids with their
mask (1 = sampled by the policy; tool observations, injected turns, end-of-turn tokens and
image pads = 0), the rollout log-probs, the images whose pads are in the ids
(``multi_modal_data``) and, in ``extra_fields["mia"]``, the record :mod:`mia.verl.rewards`
scores. They are registered with veRL's ``register`` when this module is imported; veRL's
agent loop workers import it through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
(recipes/verl/config/agent_loops.yaml). MIA's settings are the config's ``mia`` section
(:class:`mia.verl.config.VerlMiaConfig`). Nothing here keeps per-rollout state outside the
rollout's own objects: veRL runs the n rollouts of a prompt concurrently over shared rows.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from mia.agent import ExecutorLoop, build_tools
from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.planner.episode import PlannerEpisode
from mia.planner.executor_rollout import PlanSource, run_executor_rollout
from mia.rl.episode import Rollout
from mia.roles.common import build_judge, service_kwargs
from mia.services import ExecutorClient, MemoryClient
from mia.verl import EXECUTOR_LOOP, PLANNER_LOOP, RECORD_KEY
from mia.verl.config import VerlMiaConfig, load_mia_config
from mia.verl.engine import BudgetPolicy, ServerEngine, sampling_defaults
from mia.verl.records import executor_record, fit_response, planner_record, sample_from_row

log = logging.getLogger("mia.verl")

# Per process (veRL's agent loop worker): parsed configs and the objects every rollout of a
# config shares (tools, judge, service clients), one set per event loop.
_CONFIGS: dict[int, VerlMiaConfig] = {}
_SHARED: dict[tuple[str, str, int], Any] = {}


def mia_config(trainer_config: Any) -> VerlMiaConfig:
    """The ``mia`` section of veRL's config (parsed once per config object)."""
    key = id(trainer_config)
    if key not in _CONFIGS:
        _CONFIGS[key] = load_mia_config(trainer_config.get("mia"))
    return _CONFIGS[key]


def _shared(kind: str, cfg: VerlMiaConfig, build: Any) -> Any:
    key = (kind, cfg.key(), id(asyncio.get_running_loop()))
    if key not in _SHARED:
        _SHARED[key] = build(cfg)
    return _SHARED[key]


@functools.cache
def _hf_config(path: str) -> Any:
    from transformers import AutoConfig
    from verl.utils.fs import copy_to_local

    return AutoConfig.from_pretrained(copy_to_local(path), trust_remote_code=False)


class _MiaAgentLoop(AgentLoopBase):
    """What both loops share: the ``mia`` config, the engine over veRL's server and the
    conversion of a token-mode conversation into veRL's output."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        # ``tools``: veRL's tool list (rollout.multi_turn.tool_config_path); MIA's tools are
        # mia.agent's, configured in mia.agent.tools.
        super().__init__(*args, **kwargs)
        self.mia = mia_config(self.config)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    # ---- the engine and the policy
    def engine(self, sampling_params: dict[str, Any], request_id: str) -> ServerEngine:
        hf_config = None
        if self.processor is not None:  # a vision model: the policy expands image pads
            hf_config = _hf_config(str(self.config.actor_rollout_ref.model.path))
        return ServerEngine(
            self.server_manager,
            self.tokenizer,
            request_id=request_id,
            sampling=sampling_params,
            hf_config=hf_config,
        )

    def template_kwargs(self) -> dict[str, Any]:
        return {**dict(self.apply_chat_template_kwargs or {}), **self.mia.chat_template_kwargs}

    def image_processor(self) -> dict[str, Any]:
        """veRL's processor's pixel bounds: MIA's pads then match what veRL's processor
        computes for training (mia.vision reproduces its numerics)."""
        proc = getattr(self.processor, "image_processor", None)
        out: dict[str, Any] = {}
        size = getattr(proc, "size", None) or {}
        for key, alt in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            value = getattr(proc, key, None) or (size.get(alt) if isinstance(size, dict) else None)
            if value:
                out[key] = int(value)
        return out

    def policy(self, engine: ServerEngine, defaults: SamplingParams) -> BudgetPolicy:
        return BudgetPolicy(
            engine,
            tokenizer=self.tokenizer,
            tokenizer_lock=engine.tokenizer_lock,
            chat_template_kwargs=self.template_kwargs(),
            defaults=defaults,
            image_processor=self.image_processor(),
            prompt_length=self.prompt_length,
            response_length=self.response_length,
        )

    # ---- the output
    def output(
        self,
        conv: Any,
        engine: ServerEngine,
        sampling_params: dict[str, Any],
        record: dict[str, Any],
        *,
        tool_seconds: float = 0.0,
    ) -> AgentLoopOutput:
        """veRL's output of a token-mode conversation (a :class:`mia.agent.Trajectory`)."""
        prompt = list(conv.prompt_ids)
        response, mask = list(conv.response_ids), list(conv.response_mask)
        lps = conv.rollout_logprobs if sampling_params.get("logprobs") else None
        mm = conv.state.get("multimodal")
        vision = getattr(engine.hf_config, "vision_config", None)
        pad_id = getattr(engine.hf_config, "image_token_id", None) if vision else None
        merge = int(getattr(vision, "spatial_merge_size", 2)) if vision else 2
        pads = [int(g.prod()) // merge**2 for g in mm.grids] if mm is not None else []
        full = len(response)
        response, mask, lps, kept = fit_response(
            prompt, response, mask, lps, pads, self.response_length, pad_id
        )
        if len(response) < full:
            log.warning(
                "%s: response of %d tokens cut to %d (rollout.response_length=%d)",
                record.get("kind"),
                full,
                len(response),
                self.response_length,
            )
        images = list(mm.images[:kept]) if mm is not None else []
        turns = sum(1 for m in conv.messages if m.get("role") != "system")
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=response,
            response_mask=mask,
            response_logprobs=list(lps) if lps is not None else None,
            multi_modal_data={"images": images} if images else {},
            num_turns=turns,
            metrics=AgentLoopMetrics(
                generate_sequences=engine.generate_s,
                tool_calls=tool_seconds,
                num_preempted=engine.preempted if engine.preempted is not None else -1,
            ),
            extra_fields={
                **engine.extra_fields,
                "turn_scores": [],
                "tool_rewards": [],
                "response_cut": full - len(response),
                RECORD_KEY: record,
            },
        )


def _memory_client(cfg: VerlMiaConfig) -> MemoryClient | None:
    """A client of the config's memory_serve (None without ``services.memory_url``)."""
    s = cfg.services
    return MemoryClient(s.memory_url, **service_kwargs(s, "memory")) if s.memory_url else None


class _ExecutorParts:
    """The objects every ``mia_executor`` rollout of one config shares."""

    def __init__(self, cfg: VerlMiaConfig) -> None:
        self.tools = build_tools(cfg.agent.tools)
        self.memory = _memory_client(cfg)
        self.plans = PlanSource(self.memory, cfg.missing_plan)
        self.judge = build_judge(cfg.judge, cfg.llm)


@register(EXECUTOR_LOOP)
class MiaExecutorAgentLoop(_MiaAgentLoop):
    """veRL agent ``mia_executor``: one Executor GRPO rollout (the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        cfg = self.mia
        parts = _shared(EXECUTOR_LOOP, cfg, _ExecutorParts)
        sample = sample_from_row(kwargs)
        engine = self.engine(sampling_params, uuid4().hex)
        defaults = sampling_defaults(sampling_params, self.response_length)
        loop = ExecutorLoop(self.policy(engine, defaults), parts.tools, cfg.agent)
        traj = await run_executor_rollout(
            loop,
            sample,
            plans=parts.plans,
            judge=parts.judge,
            memory=parts.memory,
            replan=cfg.replan,
            max_answer_words=cfg.max_answer_words,
        )
        tool_s = sum(c.duration_s for c in traj.tool_calls)
        return self.output(
            traj, engine, sampling_params, executor_record(traj), tool_seconds=tool_s
        )


class _PlannerParts:
    """The objects every ``mia_planner`` rollout of one config shares."""

    def __init__(self, cfg: VerlMiaConfig) -> None:
        s = cfg.services
        if not s.executor_url:
            raise MiaError("mia.services.executor_url: the frozen Executor (serve) is required")
        self.executor = ExecutorClient(s.executor_url, **service_kwargs(s, "executor"))
        self.memory = _memory_client(cfg)


class _VerlPlannerEpisode(PlannerEpisode):
    """:class:`PlannerEpisode` whose policy is the rollout's :class:`BudgetPolicy`."""

    def __init__(self, *args: Any, policy: BudgetPolicy, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._policy = policy

    def make_policy(self, rollout: Rollout) -> BudgetPolicy:
        return self._policy


@register(PLANNER_LOOP)
class MiaPlannerAgentLoop(_MiaAgentLoop):
    """veRL agent ``mia_planner``: one Planner rollout (the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from mia.roles.ttrl_memory import bank_item

        cfg = self.mia
        parts = _shared(PLANNER_LOOP, cfg, _PlannerParts)
        sample = sample_from_row(kwargs)
        engine = self.engine(sampling_params, uuid4().hex)
        defaults = sampling_defaults(sampling_params, cfg.episode.plan_max_tokens)
        episode = _VerlPlannerEpisode(
            parts.executor,
            parts.memory,
            cfg.episode,
            chat_template_kwargs=self.template_kwargs(),
            policy=self.policy(engine, defaults),
        )
        rollout = Rollout(
            generator=engine,
            sampling=defaults,
            group=str(kwargs.get("uid") or ""),
            index=int(kwargs.get("session_id") or 0),
        )
        run = await episode.run(sample, rollout)
        bank = None
        if cfg.ttrl.bank:
            step = kwargs.get("global_steps", -1)
            step = int(step.item() if hasattr(step, "item") else step)
            bank = bank_item(sample, run, {}, cfg.ttrl.mode, step, 0.0)
        return self.output(run.conversation, engine, sampling_params, planner_record(run, bank))
