"""The Planner GRPO episode: :class:`mia.planner.flow.PlannerFlow` with the trainable policy as
the Planner (token-exact) and the frozen Executor behind serve.

One rollout is ONE planner conversation, rendered token-exactly by :class:`mia.agent.TokenPolicy`
(the prompt is rendered once, injected turns are appended as the chat template's delta tokens,
every generation keeps its sampled ids and log-probs), so it is never re-tokenised:

1. user: plan prompt (the question + retrieved memories)         -> mask 0 (the prompt)
2. assistant: the plan                                            -> mask 1
   ... the frozen Executor runs it (serve ``/execute``)
3. user: reflection prompt with the Executor's trace              -> mask 0
   (``episode.reflect=false`` ends the rollout before this turn)
4. assistant: yes / no (replan?)                                  -> mask 1
5. if yes: user: replan prompt                                    -> mask 0
6.         assistant: the supplementary plan                      -> mask 1
   ... the Executor continues with it (serve ``/continue``)

Everything a rollout produces -- plan, decision, replan, both Executor answers, memory ids -- is
held by the :class:`~mia.planner.flow.PlannerRun` it returns (the reference shared one dict
between the n rollouts of a prompt). Planner training, TTRL and the streaming server use this
episode; evaluation runs the same flow with memory_serve's Planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mia.agent import TokenPolicy
from mia.agent.trajectory import ASSISTANT
from mia.config import check_known
from mia.errors import MiaError
from mia.planner.flow import Executor, FlowConfig, PlannerFlow, PlannerRun, Task
from mia.planner.planners import IMAGE_VARIANTS, ConversationPlanner, NoPlanner, TurnLimits
from mia.rl.episode import Rollout
from mia.services import MemoryClient
from mia.services.serve import ExecuteResponse


@dataclass
class PlannerEpisodeConfig(TurnLimits):
    """The ``episode`` section of configs/planner_train (and ttrl, ttrl_streaming): the turn
    limits (:class:`TurnLimits`, its fields first) and the episode's own options."""

    min_generation_tokens: int = field(
        default=8, metadata={"help": "a turn that cannot get this many tokens ends the episode"}
    )
    reflect: bool = field(
        default=True,
        metadata={
            "help": "ask for the reflection turn (false: the rollout ends at the Executor's "
            "answer, as evaluation with reflect=false; no decision is scored)"
        },
    )
    judge_trace_max_chars: int | None = field(
        default=20000, metadata={"help": "the Executor trace in the reflection turn, cut to this"}
    )
    max_replans: int = field(
        default=1, metadata={"help": "supplementary plans (0: the decision is never acted on)"}
    )
    memory_top_k: int | None = field(
        default=None, metadata={"help": "/memory top_k when a sample has no memory context"}
    )
    image_variant: str = field(
        default="auto", metadata={"help": "plan prompt: auto (image iff a caption) | text | image"}
    )

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any] | PlannerEpisodeConfig | None
    ) -> PlannerEpisodeConfig:
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        check_known(cls, data, "planner episode")
        cfg = cls(**data)
        if cfg.image_variant not in IMAGE_VARIANTS:
            raise MiaError("episode.image_variant must be auto, text or image")
        cfg.limits()  # validates the token limits
        return cfg

    def limits(self) -> TurnLimits:
        """The turn limits alone, checked."""
        return TurnLimits(**{f.name: getattr(self, f.name) for f in fields(TurnLimits)}).validate()

    def flow(self) -> FlowConfig:
        return FlowConfig(
            reflect=self.reflect,
            max_replans=self.max_replans,
            judge_trace_max_chars=self.judge_trace_max_chars,
        )


class PlannerEpisode:
    """``await PlannerEpisode(executor, memory, cfg).run(sample, rollout) -> PlannerRun``.

    ``sample``: ``question`` and optionally ``data_id``, ``image_caption``, ``modality``,
    ``images`` (base64, forwarded to the Executor), ``memory_context`` + ``memory_ids`` (else
    fetched from ``memory`` when given, else "no memories").
    """

    def __init__(
        self,
        executor: Executor,
        memory: MemoryClient | None = None,
        cfg: PlannerEpisodeConfig | Mapping[str, Any] | None = None,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.executor = executor
        self.memory = memory
        self.cfg = PlannerEpisodeConfig.from_dict(cfg)
        self.chat_template_kwargs = chat_template_kwargs
        self.flow_cfg = self.cfg.flow()

    def make_policy(self, rollout: Rollout) -> TokenPolicy:
        """This rollout's token-exact policy over ``rollout.generator`` (an engine with
        ``generate_ids``: mia.rl's generators, veRL's server client through
        :mod:`mia.verl.engine`, which also bounds the response to veRL's length)."""
        return TokenPolicy(
            rollout.generator,
            defaults=rollout.sampling,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def planner(self, rollout: Rollout) -> ConversationPlanner:
        """This rollout's Planner: the trainable policy, token-exact."""
        return ConversationPlanner(
            self.make_policy(rollout),
            rollout.sampling,
            limits=self.cfg.limits(),
            memory=self.memory,
            memory_top_k=self.cfg.memory_top_k,
            image_variant=self.cfg.image_variant,
        )

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> PlannerRun:
        task = Task.from_sample(sample)
        run = PlannerRun(task=task, group=rollout.group, index=rollout.index)
        flow = PlannerFlow(self.planner(rollout), self.executor, self.flow_cfg)
        return await flow.run(task, run)

    async def aclose(self) -> None:
        await self.executor.aclose()  # type: ignore[attr-defined]
        if self.memory is not None:
            await self.memory.aclose()


class ExecutorAloneEpisode:
    """``await ExecutorAloneEpisode(executor, temperature).run(sample, rollout) -> PlannerRun``:
    the flow with no Planner (``none``'s: no plan, no reflection), as an episode. TTRL answers
    with it the questions it does not plan (``memory.plan_without_failure=false``); its rollouts
    carry no Planner tokens, so they are scored and remembered, never trained on.

    Rollout 0 runs with the Executor's own sampling (greedy on the shipped services); with a
    ``temperature``, rollouts 1.. ask serve to sample at it, seeded by the rollout, so a group of
    them is a vote over the Executor's answers (``memory.alone_samples``)."""

    def __init__(self, executor: Executor, temperature: float | None = None) -> None:
        self.executor = executor
        self.temperature = temperature
        self.flow = PlannerFlow(NoPlanner(), executor)

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> PlannerRun:
        task = Task.from_sample(sample)
        # No memory_ids: the Executor never saw the memories, so their scores learn nothing.
        run = PlannerRun(task=task, group=rollout.group, index=rollout.index)
        flow = self.flow
        if rollout.index > 0 and self.temperature is not None:
            seed = None if rollout.seed is None else rollout.seed % 2**31
            sampled = _SampledExecutor(self.executor, self.temperature, seed)
            flow = PlannerFlow(NoPlanner(), sampled)
        return await flow.run(task, run)


class _SampledExecutor:
    """An Executor whose ``/execute`` runs sample at ``temperature`` with ``seed``."""

    def __init__(self, executor: Executor, temperature: float, seed: int | None) -> None:
        self.executor = executor
        self.temperature = temperature
        self.seed = seed

    async def execute(
        self, question: str, plan: str, *, data_id: str | None = None, images: Any = ()
    ) -> ExecuteResponse | dict[str, Any]:
        return await self.executor.execute(
            question,
            plan,
            data_id=data_id,
            images=images,
            temperature=self.temperature,
            seed=self.seed,
        )

    async def continue_(self, *args: Any, **kwargs: Any) -> ExecuteResponse | dict[str, Any]:
        return await self.executor.continue_(*args, **kwargs)


def planner_segments(rollout: PlannerRun) -> list[tuple[str, int, int]]:
    """``(kind, mask, n_tokens)`` per segment: what the trainer sees (for tests and debugging)."""
    return [
        (s.kind, s.mask, len(s.token_ids or []))
        for s in rollout.conversation.segments
        if s.kind == ASSISTANT or s.token_ids
    ]
