"""SimpleQA-style LLM judge with ground truth: A = correct, B = incorrect, C = not attempted.

Transport failures are retried by the chat backend; what still fails (or a reply naming no
verdict) is REPORTED as :class:`JudgeError`. Only when ``fallback="rules"`` is configured does a
rule judge step in, and the :class:`Judgement` then says so (``judge`` ends in ``(fallback)``,
``detail["fallback_reason"]`` holds the error) and a warning is logged. The reference system
silently fell back to substring match; a silent fallback hides a dead judge for a whole run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from mia.judge.base import JudgeError, Judgement, Label, as_golds
from mia.judge.parse import parse_letter
from mia.judge.rules import RuleJudge
from mia.llm.base import ChatBackend, LLMError, Message, SamplingParams
from mia.prompts import judge as prompts

log = logging.getLogger("mia.judge.llm")

LETTER_LABELS: dict[str, Label] = {"A": "correct", "B": "incorrect", "C": "not_attempted"}
FALLBACKS = (None, "rules")


def format_golds(golds: list[str]) -> str:
    if len(golds) == 1:
        return golds[0]
    return prompts.GOLD_ALTERNATIVES.format(first=golds[0], rest="; ".join(golds[1:]))


def grader_messages(question: str, prediction: str, golds: list[str]) -> list[Message]:
    user = prompts.GRADER_TEMPLATE.format(
        question=question, gold=format_golds(golds), prediction=prediction
    )
    return [
        {"role": "system", "content": prompts.GRADER_SYSTEM},
        {"role": "user", "content": user},
    ]


class LLMJudge:
    """Grades with a chat backend. ``params`` defaults to greedy, 256 tokens (room for a model
    that thinks before answering). ``fallback``: ``None`` (report failures) or ``"rules"``
    (grade with ``fallback_judge``, by default containment, and record that it did)."""

    name = "llm"

    def __init__(
        self,
        backend: ChatBackend,
        params: SamplingParams | None = None,
        fallback: str | None = None,
        fallback_judge: RuleJudge | None = None,
    ) -> None:
        if fallback not in FALLBACKS:
            raise JudgeError(f"llm judge: fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.backend = backend
        self.params = params or SamplingParams(temperature=0.0, max_tokens=256)
        self.fallback = fallback
        self.fallback_judge = fallback_judge or RuleJudge(mode="contains")

    async def grade(
        self,
        question: str,
        prediction: str,
        golds: str | Sequence[str] | None = None,
        trajectory: str = "",
    ) -> Judgement:
        gold_list = as_golds(golds, "llm")
        messages = grader_messages(question, prediction, gold_list)
        try:
            result = await self.backend.chat(messages, replace(self.params))
            letter = parse_letter(result.text, "ABC")
            if letter is None:
                raise JudgeError(
                    f"llm judge ({self.backend.name}): reply names no verdict A/B/C: "
                    f"{result.text[:200]!r}"
                )
        except (LLMError, JudgeError) as err:
            if self.fallback != "rules":
                if isinstance(err, JudgeError):
                    raise
                raise JudgeError(f"llm judge ({self.backend.name}) failed: {err}") from err
            log.warning(
                "llm judge failed, grading with %s instead: %s", self.fallback_judge.name, err
            )
            fallback = self.fallback_judge.grade_sync(question, prediction, gold_list)
            return replace(
                fallback,
                judge=f"{fallback.judge} (fallback)",
                detail={**fallback.detail, "fallback_reason": str(err)},
            )
        label = LETTER_LABELS[letter]
        return Judgement(
            label=label,
            score=1.0 if label == "correct" else 0.0,
            judge=self.name,
            detail={"letter": letter, "raw": result.text, "backend": self.backend.name},
        )
