"""The Planner GRPO reward (docs/reference.md §7.2) over one planner episode.

A planner episode is: plan -> the Executor answers (answer 1) -> the Planner decides yes/no on
replanning -> if yes, a supplementary plan -> the Executor continues (answer 2).
:class:`PlannerEpisodeRecord` holds what the reward needs; planner training and TTRL produce it,
the reward server builds it from the reference's ``extra_info.messages`` too.

``score = acc_final_weight*acc2 + acc_first_weight*acc1 + format_weight*format +
decision_weight*decision + evidence_weight*evidence`` where ``acc2 = acc1`` without a replan;
``format`` = 1 iff the decision (after its ``<think>``) is exactly ``yes`` or ``no`` and
``<think>`` tags are balanced in the plan, the decision and the replan; ``decision`` = 1 iff the
Planner asked for a replan exactly when answer 1 was wrong; ``evidence`` = 1 iff a search result
in the final trace holds a gold answer (weight 0 by default: the reference's reward).

The rollout-facing rewards, as ``await reward(sample, rollout) -> (score, extras)``:
:class:`PlannerReward` (this score against the sample's ground truth with a local judge) and
:class:`RemoteReward` (the pluggable reward server's ``/compute_gt_reward`` with the native
episode record, where ground truths and user feedback live: TTRL-streaming).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from mia.agent.protocol import tags_balanced
from mia.errors import MiaError
from mia.judge.base import Judge, as_golds
from mia.llm.think import text_after_think
from mia.prompts.planner import parse_decision
from mia.rewards.config import PlannerRewardConfig, load_reward_config
from mia.rewards.grading import answer_from_trace, grade, sample_golds
from mia.services import RewardClient
from mia.trace import content_text, evidence_in_trace


@dataclass
class PlannerEpisodeRecord:
    """One planner rollout, as the rewards read it. Texts are the Planner's raw outputs
    (``<think>`` blocks included: the format score reads them)."""

    plan: str
    decision: str
    replan: str | None = None
    answer_first: str = ""
    answer_final: str = ""  # the answer after the replan; ignored when replanned is False
    replanned: bool = False
    question: str = ""
    # Executor traces (mia.trace format): what the no-ground-truth panel reads.
    trace_first: str = ""
    trace_final: str = ""
    # False: the flow ended at the Executor's answer (reflection off, ``episode.reflect=false``):
    # there is no decision, so neither the format rule nor the decision score reads one.
    reflected: bool = True

    @property
    def final_answer(self) -> str:
        return self.answer_final if self.replanned else self.answer_first

    @property
    def final_trace(self) -> str:
        return (self.trace_final or self.trace_first) if self.replanned else self.trace_first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannerEpisodeRecord:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MiaError(f"planner episode record: unknown field(s) {unknown}")
        return cls(**dict(data))

    @classmethod
    def from_reference_messages(
        cls, messages: Sequence[Any], question: str = ""
    ) -> PlannerEpisodeRecord:
        """From the reference's ``useful_messages``: ``[plan, trace1, decision]`` or
        ``[plan, trace1, decision, replan_prompt, replan, trace2]`` (strings or chat messages).
        Answers are read from the traces (:func:`answer_from_trace`)."""
        texts = [content_text(m.get("content") if isinstance(m, Mapping) else m) for m in messages]
        if len(texts) not in (3, 6):
            raise MiaError(
                f"extra_info.messages must hold 3 (no replan) or 6 (with replan) items "
                f"[plan, trace1, decision, replan_prompt, replan, trace2], got {len(texts)}"
            )
        replanned = len(texts) == 6
        return cls(
            plan=texts[0],
            decision=texts[2],
            replan=texts[4] if replanned else None,
            answer_first=answer_from_trace(texts[1]),
            answer_final=answer_from_trace(texts[5]) if replanned else "",
            replanned=replanned,
            question=question,
            trace_first=texts[1],
            trace_final=texts[5] if replanned else "",
        )


DECISIONS = ("yes", "no")


def planner_format(record: PlannerEpisodeRecord) -> tuple[float, list[str]]:
    """``(1.0 | 0.0, issues)`` by the §7.2 format rule (the decision only when there was one)."""
    issues: list[str] = []
    said = text_after_think(record.decision).strip().lower()
    if record.reflected and said not in DECISIONS:
        issues.append(f"decision must be exactly 'yes' or 'no' after its reasoning, got {said!r}")
    turns = (("plan", record.plan), ("decision", record.decision))
    for name, text in turns if record.reflected else turns[:1]:
        if not tags_balanced(text, "think"):
            issues.append(f"unbalanced <think> tags in the {name}")
    if record.replan is not None and not tags_balanced(record.replan, "think"):
        issues.append("unbalanced <think> tags in the replan")
    return (0.0 if issues else 1.0), issues


async def planner_reward(
    record: PlannerEpisodeRecord,
    golds: str | Sequence[str],
    judge: Judge,
    cfg: PlannerRewardConfig | Any = None,
) -> tuple[float, dict[str, Any]]:
    """``(score, extras)`` for one planner episode; one judge call, two with a replan."""
    c = load_reward_config(PlannerRewardConfig, cfg)
    first = await grade(
        judge, record.question, record.answer_first, golds, trajectory=record.trace_first
    )
    if record.replanned:
        final = await grade(
            judge, record.question, record.answer_final, golds, trajectory=record.final_trace
        )
    else:
        final = first
    format_score, issues = planner_format(record)
    asked_replan = parse_decision(record.decision)
    # Without a reflection nothing was decided: the term is 0 for every rollout of the group.
    decision = 1.0 if record.reflected and asked_replan != first.correct else 0.0
    # Partial credit (0 by default, as the reference): the searches reached the answer.
    answers = as_golds(golds, "planner reward")
    evidence = float(c.evidence_weight != 0 and evidence_in_trace(record.final_trace, answers))
    score = (
        c.acc_final_weight * final.acc
        + c.acc_first_weight * first.acc
        + c.format_weight * format_score
        + c.decision_weight * decision
        + c.evidence_weight * evidence
    )
    extras: dict[str, Any] = {
        "score": score,
        "acc_final": final.acc,
        "acc_first": first.acc,
        "format": format_score,
        "format_issues": issues,
        "decision": decision,
        "evidence": evidence,
        "asked_replan": asked_replan,
        "replanned": record.replanned,
        "judgement": "correct" if final.correct else "incorrect",
        "label_first": first.label,
        "label_final": final.label,
        "is_answer1_correct": first.correct,
        "is_answer2_correct": final.correct,
        "answer_first": record.answer_first,
        "answer_final": record.final_answer,
        "judge": final.judge,
    }
    return score, extras


class PlannerReward:
    def __init__(self, judge: Judge, cfg: PlannerRewardConfig | Mapping[str, Any] | None = None):
        self.judge = judge
        self.cfg = load_reward_config(PlannerRewardConfig, cfg)

    async def __call__(
        self, sample: Mapping[str, Any], rollout: Any
    ) -> tuple[float, dict[str, Any]]:
        golds = sample_golds(sample)
        return await planner_reward(rollout.record, golds, self.judge, self.cfg)


class RemoteReward:
    """Scores come from the reward server; ``extras`` are the server's (judgement, format, ...)."""

    def __init__(self, client: RewardClient) -> None:
        self.client = client

    async def __call__(
        self, sample: Mapping[str, Any], rollout: Any
    ) -> tuple[float, dict[str, Any]]:
        data_id = sample.get("data_id")
        if data_id is None:
            raise MiaError("the reward server needs a data_id per sample")
        out = await self.client.compute(
            str(data_id),
            rollout.record.to_dict(),
            question=str(sample.get("question", "")),
            data_source=sample.get("data_source") or None,
        )
        extras = dict(out.extras)
        for key in ("judgement", "format_score", "decision_score"):
            if (value := getattr(out, key)) is not None:
                extras.setdefault(key, value)
        return out.score, extras
