"""The no-ground-truth review panel: three critics, then an arbiter.

Critics (run concurrently) each score the agent 1-10 with a reason of at most 50 words:
1. reasoning quality and logical consistency (question, trajectory, final output);
2. information sourcing / hallucination (same inputs);
3. result validity: a substantive answer at all (question and final output only).
The arbiter sees everything plus the three feedbacks (nominal weights 0.5/0.3/0.2, stated in its
prompt) and answers A (correct) or B (incorrect).

The result's ``detail`` carries the reference record's fields (``is_correct``, ``raw_verdict``,
``evaluator_1_feedback`` .. ``evaluator_3_feedback``) so it can be stored with a memory as is,
plus the parsed critic scores and their weighted mean. Any failed call or an arbiter reply that
is neither A nor B raises :class:`JudgeError` (the reference wrote "Error" into the feedback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mia.judge.base import JudgeError, Judgement
from mia.judge.parse import parse_critic, parse_letter
from mia.llm.base import ChatBackend, LLMError, Message, SamplingParams
from mia.prompts import judge as prompts

NO_TRAJECTORY = "(no trajectory recorded)"


def truncate_middle(text: str, max_chars: int | None) -> str:
    """Keep the start and the end of an over-long trajectory (the plan and the answer)."""
    if not max_chars or len(text) <= max_chars:
        return text
    half = max_chars // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n...[{cut} characters omitted]...\n{text[-half:]}"


class PanelJudge:
    """Three critics + an arbiter on one chat backend; needs no ground truth."""

    name = "panel"

    def __init__(
        self,
        backend: ChatBackend,
        critic_params: SamplingParams | None = None,
        arbiter_params: SamplingParams | None = None,
        weights: Sequence[float] = (0.5, 0.3, 0.2),
        max_trajectory_chars: int | None = 20000,
    ) -> None:
        if len(weights) != 3:
            raise JudgeError(f"panel judge: need 3 critic weights, got {list(weights)}")
        self.backend = backend
        self.critic_params = critic_params or SamplingParams(temperature=0.1, max_tokens=1000)
        self.arbiter_params = arbiter_params or SamplingParams(temperature=0.0, max_tokens=16)
        self.weights = tuple(float(w) for w in weights)
        self.max_trajectory_chars = max_trajectory_chars

    def critic_messages(
        self, question: str, final_output: str, trajectory: str
    ) -> list[list[Message]]:
        fields = {"question": question, "trajectory": trajectory, "final_output": final_output}
        return [[{"role": "user", "content": t.format(**fields)}] for t in prompts.CRITIC_TEMPLATES]

    def arbiter_messages(
        self, question: str, final_output: str, trajectory: str, feedbacks: Sequence[str]
    ) -> list[Message]:
        w1, w2, w3 = (f"{w:g}" for w in self.weights)
        content = prompts.ARBITER_TEMPLATE.format(
            question=question,
            trajectory=trajectory,
            final_output=final_output,
            evaluator_1_feedback=feedbacks[0],
            evaluator_2_feedback=feedbacks[1],
            evaluator_3_feedback=feedbacks[2],
            w1=w1,
            w2=w2,
            w3=w3,
        )
        return [{"role": "user", "content": content}]

    async def _call(self, messages: list[Message], params: SamplingParams, who: str) -> str:
        try:
            result = await self.backend.chat(messages, replace(params))
        except LLMError as err:
            raise JudgeError(f"panel judge: {who} call failed: {err}") from err
        return result.text.strip()

    async def grade(
        self,
        question: str,
        prediction: str,
        golds: str | Sequence[str] | None = None,  # ignored: the panel never sees ground truth
        trajectory: str = "",
    ) -> Judgement:
        traj = truncate_middle(trajectory, self.max_trajectory_chars) or NO_TRAJECTORY
        calls = [
            self._call(m, self.critic_params, f"critic {i + 1} ({name})")
            for i, (m, name) in enumerate(
                zip(
                    self.critic_messages(question, prediction, traj),
                    prompts.CRITIC_NAMES,
                    strict=True,
                )
            )
        ]
        # Wait for all three even if one fails, so no critic is left running unobserved.
        done = await asyncio.gather(*calls, return_exceptions=True)
        for item in done:
            if isinstance(item, BaseException):
                raise item
        feedbacks = [str(item) for item in done]
        raw = await self._call(
            self.arbiter_messages(question, prediction, traj, feedbacks),
            self.arbiter_params,
            "arbiter",
        )
        letter = parse_letter(raw, "AB")
        if letter is None:
            raise JudgeError(f"panel judge: arbiter reply names no verdict A/B: {raw[:200]!r}")
        critics: list[dict[str, Any]] = []
        for name, weight, feedback in zip(
            prompts.CRITIC_NAMES, self.weights, feedbacks, strict=True
        ):
            score, reason = parse_critic(feedback)
            critics.append({"name": name, "weight": weight, "score": score, "reason": reason})
        scores = [c["score"] for c in critics]
        weighted = (
            sum(w * s for w, s in zip(self.weights, scores, strict=True)) / (10 * sum(self.weights))
            if all(s is not None for s in scores) and sum(self.weights) > 0
            else None
        )
        correct = letter == "A"
        detail: dict[str, Any] = {
            "is_correct": "correct" if correct else "incorrect",
            "raw_verdict": raw,
            "evaluator_1_feedback": feedbacks[0],
            "evaluator_2_feedback": feedbacks[1],
            "evaluator_3_feedback": feedbacks[2],
            "critics": critics,
            "weighted_score": weighted,
        }
        return Judgement(
            label="correct" if correct else "incorrect",
            score=1.0 if correct else 0.0,
            judge=self.name,
            detail=detail,
        )
