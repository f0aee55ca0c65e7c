"""The Executor loop: think -> tool call -> observe ... -> answer, with one replan.

Used by training (``mia.rl`` episodes, with :class:`TokenPolicy`), serving (``serve``, with
:class:`ChatPolicy`) and evaluation. Per turn:

1. Stop when this run used ``max_turns`` turns, or no context is left.
2. Generate (``max_tokens`` clipped to the context left); cut the text after ``</tool_call>``.
3. No ``<tool_call>``: the turn is final; the answer is extracted the reward's way.
4. A call past ``max_tool_calls``: inject the "answer now" turn instead of running it.
5. Otherwise run it (per-tool timeout; every failure becomes an error observation), truncate
   the text, and inject it as ``<tool_response>`` -- unless that would leave less than
   ``answer_reserve_tokens`` of ``context_budget``: then the "answer now" turn replaces it (as the
   reference does near its context limit).

A model that calls a tool after the "answer now" turn ends the run without an answer.
:meth:`ExecutorLoop.continue_with_plan` drops the last answer (the assistant text from
``<answer>`` on), injects the revised-plan turn and runs again with a fresh turn budget.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mia.errors import MiaError
from mia.llm.base import Message, SamplingParams
from mia.prompts import executor as prompts
from mia.trace import truncate_words
from mia.vision import ImageSource

from . import protocol
from .config import AgentConfig
from .images import content_with_images, fill_image_placeholders, message_images, prepare_image
from .policy import Policy
from .tools import Tool, ToolArgumentError, ToolContext, ToolOutput, ToolServiceError, ToolSet
from .trajectory import (
    ANSWER_NOW,
    OBSERVATION,
    REPLAN,
    Attempt,
    ToolCallRecord,
    Trajectory,
    count_revised_plans,
)

log = logging.getLogger("mia.agent")

# Why a run stopped.
STOP_ANSWER = "answer"
STOP_LENGTH = "length"  # final reply cut by max_tokens (answer extracted all the same)
STOP_MAX_TURNS = "max_turns"
STOP_CONTEXT = "context_budget"
STOP_IGNORED_ANSWER_NOW = "tool_call_after_answer_now"


class ReplanLimitError(MiaError):
    """The trajectory already used its revised plans (``max_replans``)."""


@dataclass
class ExecutorTask:
    """One question for the Executor. ``images``: bytes, base64, data URLs, paths or PIL."""

    question: str
    images: list[ImageSource] = field(default_factory=list)
    plan: str | None = None
    data_id: str | None = None
    image_caption: str | None = None
    # This run's sampling, over the loop's (None: the loop's): a caller that wants several
    # different answers to one question (TTRL's Executor-alone vote) samples them.
    temperature: float | None = None
    seed: int | None = None

    def sampling(self) -> dict[str, Any]:
        """The run's overrides of the loop's sampling parameters."""
        over = {"temperature": self.temperature, "seed": self.seed}
        return {k: v for k, v in over.items() if v is not None}

    @classmethod
    def coerce(cls, task: ExecutorTask | Mapping[str, Any]) -> ExecutorTask:
        if isinstance(task, ExecutorTask):
            return task
        data = dict(task)
        images = data.get("images") or []
        if not isinstance(images, list | tuple):
            images = [images]
        data_id = data.get("data_id")
        return cls(
            question=str(data["question"]),
            images=list(images),
            plan=data.get("plan"),
            data_id=None if data_id is None else str(data_id),
            image_caption=data.get("image_caption"),
        )  # sampling only from an ExecutorTask: a dataset row's "seed" column is not one


def sampling_for(policy: Policy, cfg: AgentConfig) -> SamplingParams:
    """The policy's defaults with the agent config's overrides and stop strings."""
    return replace(policy.default_params(), **cfg.sampling, stop=list(cfg.stop) or None)


class ExecutorLoop:
    """``await ExecutorLoop(policy, tools, cfg).run(task) -> Trajectory``.

    Stateless between runs (every rollout's state lives in its Trajectory), so one loop serves
    any number of concurrent rollouts.
    """

    def __init__(
        self,
        policy: Policy,
        tools: ToolSet | Sequence[Tool] = (),
        cfg: AgentConfig | None = None,
    ) -> None:
        self.policy = policy
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.cfg = (cfg or AgentConfig()).validate()
        self.params = sampling_for(policy, self.cfg)

    # ------------------------------------------------------------------ entry points
    def budget(self) -> int:
        limit = getattr(self.policy, "max_context", None)
        return min(self.cfg.context_budget, limit) if limit else self.cfg.context_budget

    def build_messages(self, task: ExecutorTask) -> tuple[list[Message], list[Any]]:
        """The system + user turns for ``task`` and the prepared question images."""
        cfg = self.cfg
        images = [prepare_image(src, cfg.image_size) for src in task.images]
        tools = self.tools.available(len(images))
        system = prompts.system_prompt([t.schema() for t in tools])
        text = prompts.user_prompt(task.question, task.plan, len(images), cfg.prompt_variant)
        user = content_with_images(text, images, cfg.image_format)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], images

    async def run(self, task: ExecutorTask | Mapping[str, Any]) -> Trajectory:
        task = ExecutorTask.coerce(task)
        if not task.question.strip():
            raise MiaError("the question is empty")
        messages, images = self.build_messages(task)
        traj = Trajectory(
            question=task.question,
            data_id=task.data_id,
            plan=task.plan,
            messages=messages,
            images=list(images),
            num_question_images=len(images),
        )
        traj.attempts.append(Attempt(plan=task.plan, start_message=1))
        if over := task.sampling():
            traj.state["sampling"] = over
        await self.policy.begin(traj)
        await self._drive(traj)
        return traj

    def resume(
        self,
        question: str,
        messages: Sequence[Message],
        *,
        images: Sequence[ImageSource] = (),
        data_id: str | None = None,
        plan: str | None = None,
    ) -> Trajectory:
        """A trajectory rebuilt from a finished conversation (the service's ``/continue``), ready
        for :meth:`continue_with_plan`. Chat policies only: tokens cannot be recovered from text.
        Bare image placeholders (``{"type": "image"}``) take ``images`` in order."""
        if getattr(self.policy, "token_exact", False):
            raise MiaError("a token-mode trajectory cannot be rebuilt from messages")
        prepared = [prepare_image(src, self.cfg.image_size) for src in images]
        msgs, _ = fill_image_placeholders(list(messages), prepared, self.cfg.image_format)
        _check_messages(msgs)
        traj = Trajectory(question=question, data_id=data_id, plan=plan, messages=msgs)
        traj.images = message_images(msgs)
        first_user = traj.first_user_index()
        traj.num_question_images = len(message_images(msgs[: first_user + 1]))
        traj.turns = sum(1 for m in msgs if m.get("role") == "assistant")
        traj.attempts = [Attempt(plan=plan, start_message=first_user)]
        for i, m in enumerate(msgs):
            if i > first_user and count_revised_plans([m]):
                traj.attempts.append(Attempt(plan=None, start_message=i))
        # Per-question tool limits (image search once) count the calls already made.
        counts: dict[str, int] = {}
        for text in traj.assistant_texts():
            parsed = protocol.parse_turn(text)
            if parsed.call is not None:
                counts[parsed.call.name] = counts.get(parsed.call.name, 0) + 1
        traj.state["tool_counts"] = counts
        last = traj.assistant_texts()[-1]
        traj.final_text = last
        traj.answer = traj.attempts[-1].answer = protocol.extract_answer(last)
        traj.stop_reason = traj.attempts[-1].stop_reason = STOP_ANSWER
        return traj

    async def continue_with_plan(self, traj: Trajectory, replan: str) -> Trajectory:
        """Drop the last answer, inject the revised plan, continue. Mutates and returns
        ``traj``; the first attempt stays in ``traj.attempts[0]``."""
        if not replan or not replan.strip():
            raise MiaError("the revised plan is empty")
        if len(traj.attempts) - 1 >= self.cfg.max_replans:
            raise ReplanLimitError(
                f"this trajectory was already replanned {len(traj.attempts) - 1} time(s) "
                f"(max_replans={self.cfg.max_replans})"
            )
        idx = max((i for i, m in enumerate(traj.messages) if m["role"] == "assistant"), default=-1)
        if idx == -1:
            raise MiaError("nothing to continue: the conversation has no assistant turn")
        if idx != len(traj.messages) - 1:
            raise MiaError("the conversation must end with the Executor's (assistant) turn")
        message = {"role": "user", "content": prompts.revised_plan_block(replan)}
        dry = self.policy.prepare(traj, [message], REPLAN)
        need = self.policy.context_tokens(traj) + dry.n_tokens + self.cfg.answer_reserve_tokens
        if need > self.budget():
            # As the reference's training loop: a revised plan that does not fit is skipped and
            # the first answer stands.
            traj.state["replan_skipped"] = STOP_CONTEXT
            log.info("revised plan skipped: %d tokens needed, budget %d", need, self.budget())
            return traj
        traj.messages[idx] = {**traj.messages[idx], "content": self.policy.drop_answer(traj)}
        traj.replan = replan
        traj.answer = ""
        injection = self.policy.prepare(traj, [message], REPLAN)
        self.policy.commit(traj, injection)
        traj.messages.append(message)
        traj.attempts.append(Attempt(plan=replan, start_message=len(traj.messages) - 1))
        await self._drive(traj)
        return traj

    # ------------------------------------------------------------------ the loop
    async def _drive(self, traj: Trajectory) -> None:
        cfg = self.cfg
        attempt = traj.attempts[-1]
        traj.stop_reason, traj.forced_answer = "", False
        answer_now = False
        while True:
            if attempt.turns >= cfg.max_turns:
                self._stop(traj, STOP_MAX_TURNS)
                return
            room = self.budget() - self.policy.context_tokens(traj)
            if room < 1:
                self._stop(traj, STOP_CONTEXT)
                return
            params = replace(
                self.params,
                max_tokens=max(1, min(self.params.max_tokens, room)),
                **traj.state.get("sampling", {}),
            )
            gen = await self.policy.generate(traj, params)
            attempt.turns += 1
            traj.turns += 1
            traj.prompt_tokens += gen.prompt_tokens
            traj.completion_tokens += gen.completion_tokens
            traj.messages.append({"role": "assistant", "content": gen.text})
            traj.final_text = gen.text
            parsed = protocol.parse_turn(gen.text)
            if not parsed.has_tool_call:
                # A reply cut by max_tokens still counts as final (the reference's behaviour);
                # the stop reason tells the two apart.
                reason = STOP_LENGTH if gen.finish_reason == "length" else STOP_ANSWER
                self._stop(traj, reason, protocol.extract_answer(gen.text))
                return
            if answer_now:
                self._stop(traj, STOP_IGNORED_ANSWER_NOW)
                return
            if attempt.tool_calls >= cfg.max_tool_calls:
                answer_now = self._inject_answer_now(traj)
                continue
            if attempt.turns >= cfg.max_turns:
                self._stop(traj, STOP_MAX_TURNS)  # no turn left to read the result
                return
            attempt.tool_calls += 1
            output = await self._dispatch(traj, parsed)
            message = self._observation(traj, output)
            injection = self.policy.prepare(traj, [message], OBSERVATION)
            after = self.policy.context_tokens(traj) + injection.n_tokens
            if after + cfg.answer_reserve_tokens > self.budget():
                answer_now = self._inject_answer_now(traj)
                continue
            self.policy.commit(traj, injection)
            traj.messages.append(message)
            traj.images.extend(output.images)

    def _inject_answer_now(self, traj: Trajectory) -> bool:
        message = {"role": "user", "content": prompts.ANSWER_NOW_PROMPT}
        injection = self.policy.prepare(traj, [message], ANSWER_NOW)
        self.policy.commit(traj, injection)
        traj.messages.append(message)
        traj.forced_answer = traj.attempts[-1].forced_answer = True
        return True

    def _stop(self, traj: Trajectory, reason: str, answer: str = "") -> None:
        attempt = traj.attempts[-1]
        traj.stop_reason = attempt.stop_reason = reason
        traj.answer = attempt.answer = answer

    # ------------------------------------------------------------------ tools
    async def _dispatch(self, traj: Trajectory, parsed: protocol.ParsedTurn) -> ToolOutput:
        record = ToolCallRecord(
            turn=traj.turns,
            attempt=len(traj.attempts) - 1,
            name=None,
            arguments=None,
            raw=parsed.raw_call or "",
            ok=False,
        )
        start = time.perf_counter()
        call = parsed.call
        available = [t.name for t in self.tools.available(traj.num_question_images)]
        if call is None:
            output = ToolOutput(parsed.error or "Error: invalid tool call", error=True,
                                kind=parsed.error_kind)  # fmt: skip
        else:
            record.name, record.arguments = call.name, call.arguments
            record.strict_json, record.repaired = call.strict_json, call.repaired
            tool = self.tools.get(call.name) if call.name in available else None
            if tool is None:
                output = ToolOutput(
                    protocol.unknown_tool_error(call.name, available),
                    error=True,
                    kind=protocol.UNKNOWN_TOOL,
                )
            else:
                counts = traj.state.setdefault("tool_counts", {})
                ctx = ToolContext(
                    data_id=traj.data_id,
                    num_images=traj.num_question_images,
                    counts=dict(counts),
                    state=traj.state.setdefault("tools", {}),
                )
                counts[tool.name] = counts.get(tool.name, 0) + 1
                output = await self._call(tool, call.arguments, ctx)
        output.text = self._truncate(output)
        record.duration_s = round(time.perf_counter() - start, 4)
        record.ok = not output.error
        record.error_kind = output.kind if output.error else None
        record.error = output.text if output.error else None
        record.result_chars = len(output.text)
        record.images = len(output.images)
        traj.tool_calls.append(record)
        if output.error and output.kind in protocol.TOOL_FAILURES:
            traj.tool_errors.append(f"{record.name}: {output.text.removeprefix('Error: ')}")
        return output

    async def _call(self, tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        timeout = tool.timeout_s or self.cfg.tool_timeout_s
        try:
            clean = tool.validate(args)
            output = await asyncio.wait_for(tool(clean, ctx), timeout)
        except ToolArgumentError as err:
            return ToolOutput(
                protocol.bad_arguments_error(tool.name, str(err)),
                error=True,
                kind=protocol.BAD_ARGUMENTS,
            )
        except ToolServiceError as err:
            return ToolOutput(f"Error: {err}", error=True, kind=protocol.SERVICE)
        except TimeoutError:
            return ToolOutput(
                protocol.timeout_error(tool.name, timeout), error=True, kind=protocol.TIMEOUT
            )
        except Exception as err:  # a buggy tool must not end the rollout
            log.exception("tool %s failed", tool.name)
            return ToolOutput(
                protocol.internal_error(tool.name, err), error=True, kind=protocol.INTERNAL
            )
        if not isinstance(output, ToolOutput):
            return ToolOutput(
                protocol.internal_error(tool.name, TypeError(f"returned {type(output).__name__}")),
                error=True,
                kind=protocol.INTERNAL,
            )
        if output.error and output.kind is None:
            output.kind = protocol.INTERNAL
        return output

    def _truncate(self, output: ToolOutput) -> str:
        if output.images:  # never cut through the image placeholders
            return output.text
        text = truncate_words(output.text, self.cfg.tool_output_max_words)
        return protocol.truncate_chars(text, self.cfg.tool_output_max_chars, self.cfg.truncate_side)

    def _observation(self, traj: Trajectory, output: ToolOutput) -> Message:
        cfg = self.cfg
        if output.text.count(prompts.IMAGE_TOKEN) != len(output.images):
            # A tool that did not place its images: list them after the text, in order.
            text = prompts.strip_image_tokens(output.text)
            output.text = text + "".join("\n" + prompts.IMAGE_TOKEN for _ in output.images)
        if cfg.observation_role == "tool":
            content = content_with_images(output.text, output.images, cfg.image_format)
            return {"role": "tool", "content": content}
        text = protocol.format_tool_response(output.text)
        return {
            "role": "user",
            "content": content_with_images(text, output.images, cfg.image_format),
        }


_ROLES = ("system", "user", "assistant", "tool")


def _check_messages(messages: list[Message]) -> None:
    if not messages:
        raise MiaError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise MiaError(f"messages[{i}]: needs a role in {_ROLES}")
        content = m.get("content")
        if not isinstance(content, str | list) and content is not None:
            raise MiaError(f"messages[{i}]: content must be a string or a list of parts")
    if not any(m["role"] == "user" for m in messages):
        raise MiaError("messages has no user turn (the question prompt)")
    if messages[-1]["role"] != "assistant":
        raise MiaError("messages must end with the Executor's (assistant) turn")
