"""The Planner GRPO episode (REFERENCE §5, ``multi_turn_agent``) with per-rollout state.

One rollout is a fixed script over ONE token-exact planner conversation:

1. user: plan prompt (the question + retrieved memories)         -> mask 0 (the prompt)
2. assistant: the plan                                            -> mask 1
   ... the frozen Executor runs it (serve ``/execute``)
3. user: reflection prompt with the Executor's trace              -> mask 0
4. assistant: yes / no (replan?)                                  -> mask 1
5. if yes: user: replan prompt                                    -> mask 0
6.         assistant: the supplementary plan                      -> mask 1
   ... the Executor continues with it (serve ``/continue``)

Token-in/token-out through :class:`mia.agent.TokenPolicy` (the Executor loop's machinery: the
prompt is rendered once, injected turns are appended as the chat template's delta tokens, every
generation keeps its sampled ids and log-probs), so the conversation is never re-tokenised.
The prompts are memory_serve's (:mod:`memory_serve.planning`): the Planner reads the same text in
training, TTRL and serving.

Everything a rollout produces -- plan, decision, replan, both Executor answers, memory ids -- is
held by the :class:`PlannerRollout` it returns (the reference shared one dict between the n
rollouts of a prompt).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from memory_serve.context import format_context
from memory_serve.planning import judge_messages, plan_messages, replan_messages
from memory_serve.records import Retrieval
from mia.agent import TokenPolicy, Trajectory
from mia.agent.trajectory import ASSISTANT
from mia.errors import MiaError
from mia.judge.panel import truncate_middle
from mia.llm.base import SamplingParams
from mia.prompts.planner import parse_decision, text_after_think
from mia.rewards.planner import PlannerEpisodeRecord
from mia.rl.episode import Rollout
from mia.services import ExecutorClient, MemoryClient
from mia.trace import format_trace

log = logging.getLogger("planner_train")

# Segment kinds of the injected turns.
JUDGE_TURN = "judge_prompt"
REPLAN_TURN = "replan_prompt"

STOP_DONE = "done"
STOP_CONTEXT = "context_budget"


@dataclass
class PlannerEpisodeConfig:
    """Mirrors the ``episode`` section of configs/planner_train/default.yaml."""

    max_context: int = 32768  # tokens of the whole planner conversation (prompt + responses)
    plan_max_tokens: int = 1024
    decision_max_tokens: int = 256
    replan_max_tokens: int = 512
    min_generation_tokens: int = 8  # a turn that cannot get this many tokens ends the episode
    judge_trace_max_chars: int | None = 20000  # Executor trace in the reflection turn
    max_replans: int = 1  # 0: the decision is made but never acted on
    memory_top_k: int | None = None  # /memory top_k when a sample has no memory context
    image_variant: str = "auto"  # plan prompt: auto (image prompt iff a caption) | text | image

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any] | PlannerEpisodeConfig | None
    ) -> PlannerEpisodeConfig:
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise MiaError(f"unknown planner episode option(s): {', '.join(unknown)}")
        cfg = cls(**data)
        if cfg.image_variant not in ("auto", "text", "image"):
            raise MiaError("episode.image_variant must be auto, text or image")
        if min(cfg.plan_max_tokens, cfg.decision_max_tokens, cfg.replan_max_tokens) < 1:
            raise MiaError("episode: the *_max_tokens limits must be >= 1")
        return cfg


EMPTY_MEMORY = format_context(Retrieval((), ()))


@dataclass
class PlannerRollout:
    """One planner rollout: the token view the trainer learns from, plus what rewards and the
    memory need. ``first`` / ``final`` are the Executor service's ``/execute`` and
    ``/continue`` answers."""

    conversation: Trajectory
    question: str
    data_id: str | None = None
    memory_context: str = ""
    memory_ids: list[int] | None = None
    plan_raw: str = ""
    decision_raw: str = ""
    replan_raw: str | None = None
    asked_replan: bool = False
    first: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    stop_reason: str = ""
    group: str = ""
    index: int = 0

    # ---- token view (mia.rl.episode.token_view)
    @property
    def prompt_ids(self) -> list[int] | None:
        return self.conversation.prompt_ids

    @property
    def response_ids(self) -> list[int] | None:
        return self.conversation.response_ids

    @property
    def response_mask(self) -> list[int] | None:
        return self.conversation.response_mask

    @property
    def rollout_logprobs(self) -> list[float] | None:
        return self.conversation.rollout_logprobs

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.conversation.messages

    # ---- texts
    @property
    def plan(self) -> str:
        return text_after_think(self.plan_raw)

    @property
    def replan(self) -> str:
        return text_after_think(self.replan_raw or "")

    @property
    def replanned(self) -> bool:
        return self.final is not None

    @property
    def executor(self) -> dict[str, Any]:
        """The Executor's last answer (after the replan when there was one)."""
        return self.final or self.first or {}

    @property
    def executor_messages(self) -> list[dict[str, Any]]:
        return list(self.executor.get("messages") or [])

    @property
    def answer_first(self) -> str:
        return str((self.first or {}).get("answer", ""))

    @property
    def final_answer(self) -> str:
        return str(self.executor.get("answer", ""))

    def executor_history(self) -> list[dict[str, Any]]:
        """The Executor chat after its first user prompt (what memories are made of)."""
        msgs = self.executor_messages
        first_user = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), len(msgs))
        return msgs[first_user + 1 :]

    @property
    def record(self) -> PlannerEpisodeRecord:
        """What the Planner rewards read (REFERENCE §7.2)."""
        first = self.first or {}
        return PlannerEpisodeRecord(
            plan=self.plan_raw,
            decision=self.decision_raw,
            replan=self.replan_raw,
            answer_first=str(first.get("answer", "")),
            answer_final=str((self.final or {}).get("answer", "")),
            replanned=self.replanned,
            question=self.question,
            trace_first=str(first.get("trace", "")),
            trace_final=format_trace(self.question, self.executor_history())
            if self.replanned
            else "",
        )

    def to_dict(self, tokens: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "question": self.question,
            "data_id": self.data_id,
            "group": self.group,
            "index": self.index,
            "plan": self.plan,
            "decision": text_after_think(self.decision_raw),
            "asked_replan": self.asked_replan,
            "replan": self.replan if self.replan_raw is not None else None,
            "replanned": self.replanned,
            "answer_first": self.answer_first,
            "answer_final": self.final_answer,
            "memory_ids": list(self.memory_ids or []),
            "stop_reason": self.stop_reason,
            "planner_messages": self.messages,
        }
        if tokens:
            out.update(
                prompt_ids=self.prompt_ids,
                response_ids=self.response_ids,
                response_mask=self.response_mask,
                rollout_logprobs=self.rollout_logprobs,
            )
        return out


def _is_image(sample: Mapping[str, Any], variant: str) -> bool:
    if variant != "auto":
        return variant == "image"
    return bool(sample.get("image_caption")) or sample.get("modality") == "text-image"


class PlannerEpisode:
    """``await PlannerEpisode(executor, memory, cfg).run(sample, rollout) -> PlannerRollout``.

    ``sample``: ``question`` and optionally ``data_id``, ``image_caption``, ``modality``,
    ``images`` (base64, forwarded to the Executor), ``memory_context`` + ``memory_ids`` (else
    fetched from ``memory`` when given, else "no memories").
    """

    def __init__(
        self,
        executor: ExecutorClient,
        memory: MemoryClient | None = None,
        cfg: PlannerEpisodeConfig | Mapping[str, Any] | None = None,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.executor = executor
        self.memory = memory
        self.cfg = PlannerEpisodeConfig.from_dict(cfg)
        self.chat_template_kwargs = chat_template_kwargs

    async def memory_for(self, sample: Mapping[str, Any]) -> tuple[str, list[int]]:
        if sample.get("memory_context"):
            return str(sample["memory_context"]), [int(i) for i in sample.get("memory_ids") or []]
        if self.memory is None:
            return EMPTY_MEMORY, []
        out = await self.memory.memory(
            str(sample["question"]),
            image_caption=sample.get("image_caption") or None,
            data_id=sample.get("data_id"),
            top_k=self.cfg.memory_top_k,
        )
        ids = [int(i) for i in out.get("positive_ids", []) + out.get("negative_ids", [])]
        return str(out.get("context", "")), ids

    def _params(self, base: SamplingParams, cap: int, room: int) -> SamplingParams:
        return replace(base, max_tokens=max(1, min(cap, room)))

    def _room(self, policy: TokenPolicy, traj: Trajectory) -> int:
        budget = self.cfg.max_context
        if policy.max_context:
            budget = min(budget, int(policy.max_context))
        return budget - policy.context_tokens(traj)

    async def _say(
        self, policy: TokenPolicy, traj: Trajectory, base: SamplingParams, cap: int
    ) -> str | None:
        """One planner generation (mask 1); None when the context has no room left."""
        room = self._room(policy, traj)
        if room < self.cfg.min_generation_tokens:
            return None
        gen = await policy.generate(traj, self._params(base, cap, room))
        traj.messages.append({"role": "assistant", "content": gen.text})
        return gen.text

    def _inject(self, policy: TokenPolicy, traj: Trajectory, text: str, kind: str) -> bool:
        """Append a user turn (mask 0) if it leaves room for an answer."""
        message = {"role": "user", "content": text}
        injection = policy.prepare(traj, [message], kind)
        room = self._room(policy, traj) - injection.n_tokens
        if room < self.cfg.min_generation_tokens:
            return False
        policy.commit(traj, injection)
        traj.messages.append(message)
        return True

    async def run(self, sample: Mapping[str, Any], rollout: Rollout) -> PlannerRollout:
        question = str(sample["question"])
        data_id = None if sample.get("data_id") is None else str(sample["data_id"])
        images = list(sample.get("images") or [])
        context, memory_ids = await self.memory_for(sample)
        messages = plan_messages(context, question, image=_is_image(sample, self.cfg.image_variant))
        conv = Trajectory(question=question, data_id=data_id, messages=messages)
        out = PlannerRollout(
            conversation=conv,
            question=question,
            data_id=data_id,
            memory_context=context,
            memory_ids=memory_ids,
            group=rollout.group,
            index=rollout.index,
        )
        policy = TokenPolicy(
            rollout.generator,
            defaults=rollout.sampling,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        await policy.begin(conv)
        base = rollout.sampling
        cfg = self.cfg

        plan = await self._say(policy, conv, base, cfg.plan_max_tokens)
        if plan is None:
            raise MiaError(
                f"the plan prompt of {data_id or question[:40]!r} leaves no room to generate "
                f"(episode.max_context={cfg.max_context})"
            )
        out.plan_raw = plan
        out.first = await self.executor.execute(
            question, text_after_think(plan), data_id=data_id, images=images
        )
        trace = truncate_middle(str(out.first.get("trace", "")), cfg.judge_trace_max_chars)
        judge_text = judge_messages([], trace)[-1]["content"]
        decision = None
        if self._inject(policy, conv, judge_text, JUDGE_TURN):
            decision = await self._say(policy, conv, base, cfg.decision_max_tokens)
        if decision is None:
            out.stop_reason = STOP_CONTEXT
            return out
        out.decision_raw = decision
        out.asked_replan = parse_decision(decision)
        out.stop_reason = STOP_DONE
        if not out.asked_replan or cfg.max_replans < 1:
            return out
        replan_text = replan_messages([], question)[-1]["content"]
        replan = None
        if self._inject(policy, conv, replan_text, REPLAN_TURN):
            replan = await self._say(policy, conv, base, cfg.replan_max_tokens)
        if replan is None:
            out.stop_reason = STOP_CONTEXT
            return out
        out.replan_raw = replan
        if text_after_think(replan).strip():
            out.final = await self.executor.continue_(
                question,
                list(out.first.get("messages") or []),
                text_after_think(replan),
                data_id=data_id,
                images=images,
            )
        return out

    async def aclose(self) -> None:
        await self.executor.aclose()
        if self.memory is not None:
            await self.memory.aclose()


def planner_segments(rollout: PlannerRollout) -> list[tuple[str, int, int]]:
    """``(kind, mask, n_tokens)`` per segment: what the trainer sees (for tests and debugging)."""
    return [
        (s.kind, s.mask, len(s.token_ids or []))
        for s in rollout.conversation.segments
        if s.kind == ASSISTANT or s.token_ids
    ]
