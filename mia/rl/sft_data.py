"""Supervised examples for :mod:`mia.rl.sft`: chat conversations -> token ids + loss mask.

A conversation is tokenised by REPLAYING it through :class:`mia.agent.TokenPolicy`, the policy
the agent loop trains and rolls out with, so the ids are exactly the ones a rollout of the same
conversation holds (there is no second renderer to drift from it):

- the prompt is the chat template's rendering of the messages before the first assistant turn,
  with the generation prompt (mask 0);
- each assistant turn is the tokenizer's encoding of its text followed by the end-of-turn token
  (mask 1: the model learns to end its turns, after a tool call too);
- every run of other messages (tool observations, revised plans, the planner's judge prompt) is
  the template's delta tokens, as the loop injects them (mask 0).

Messages after the last assistant turn teach nothing and are dropped. A conversation whose
assistant text the loop could not have produced (text after ``</tool_call>``, a turn that does
not survive encode/decode) is refused with a clear error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.llm.base import ChatResult, SamplingParams

Message = dict[str, Any]


@dataclass
class TokenizedChat:
    """One conversation as the policy sees it (the token view of a rollout)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    source: str = ""  # e.g. "<row id>:messages"
    rollout_logprobs: list[float] | None = None  # collate() reads it; never set for SFT

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def loss_mask(self) -> list[int]:
        """Per input token: 1 on assistant tokens, 0 elsewhere (aligned with input_ids)."""
        return [0] * len(self.prompt_ids) + self.response_mask

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def n_trained(self) -> int:
        return sum(self.response_mask)

    def truncated(self, max_length: int) -> TokenizedChat:
        """Cut to ``max_length`` tokens (the prompt must fit)."""
        keep = max_length - len(self.prompt_ids)
        if keep <= 0:
            raise MiaError(f"{self.source}: the prompt alone has {len(self.prompt_ids)} tokens")
        return TokenizedChat(
            self.prompt_ids, self.response_ids[:keep], self.response_mask[:keep], self.source
        )


class _Teacher:
    """The 'engine' of the replay: it returns the gold assistant turn queued for it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.queued: list[int] | None = None

    async def generate_ids(self, prompt_ids: list[int], params: SamplingParams) -> ChatResult:
        ids, self.queued = self.queued, None
        if ids is None:
            raise MiaError("sft: internal error: no assistant turn queued")
        return ChatResult(text="", token_ids=list(ids), finish_reason="stop")


class ChatTokenizer:
    """Tokenises conversations exactly as :class:`mia.agent.TokenPolicy` renders them."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        from mia.agent import TokenPolicy

        self.tokenizer = tokenizer
        self.teacher = _Teacher(tokenizer)
        self.policy = TokenPolicy(
            self.teacher, tokenizer, chat_template_kwargs=chat_template_kwargs or {}
        )
        if len(self.policy.eot_ids) != 1 or self.policy.eot_ids[0] not in self.policy.eos_ids:
            raise MiaError(
                "sft: the chat template's end of turn is not one special token (ChatML-like "
                "templates such as Qwen2.5's and SmolLM2's are supported)"
            )

    def encode(self, messages: Sequence[Message], source: str = "") -> TokenizedChat:
        return asyncio.run(self._encode(list(messages), source))

    def encode_many(
        self, convs: Sequence[tuple[str, Sequence[Message]]]
    ) -> list[TokenizedChat | MiaError]:
        """Encode ``(source, messages)`` pairs; a failing one yields its MiaError instead."""

        async def run() -> list[TokenizedChat | MiaError]:
            out: list[TokenizedChat | MiaError] = []
            for source, messages in convs:
                try:
                    out.append(await self._encode(list(messages), source))
                except MiaError as err:
                    out.append(err)
            return out

        return asyncio.run(run())

    async def _encode(self, messages: list[Message], source: str) -> TokenizedChat:
        from mia.agent.trajectory import Trajectory
        from mia.trace import content_text

        where = source or "conversation"
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
        if "assistant" not in roles:
            raise MiaError(f"{where}: no assistant turn to train on")
        first = roles.index("assistant")
        last = len(roles) - 1 - roles[::-1].index("assistant")
        if first == 0:
            raise MiaError(f"{where}: starts with an assistant turn (no prompt)")
        policy = self.policy
        traj = Trajectory(question="", messages=[dict(m) for m in messages[:first]])
        await policy.begin(traj)
        params = SamplingParams()
        i = first
        while i <= last:
            if roles[i] == "assistant":
                content = messages[i].get("content")
                if not isinstance(content, str):
                    content = content_text(content)
                self.teacher.queued = policy.encode(content) + list(policy.eot_ids)
                gen = await policy.generate(traj, params)
                if gen.text != content:
                    raise MiaError(
                        f"{where}: assistant turn {i} is not what the agent loop would keep "
                        f"(text after </tool_call>, or it does not survive tokenisation)"
                    )
                i += 1
                continue
            j = i
            while roles[j] != "assistant":
                j += 1
            policy.commit(traj, policy.prepare(traj, [dict(m) for m in messages[i:j]], "context"))
            i = j
        assert traj.prompt_ids is not None
        return TokenizedChat(
            list(traj.prompt_ids),
            list(traj.response_ids or []),
            list(traj.response_mask or []),
            source,
        )


# ----------------------------------------------------------------------------- rows


def load_rows(paths: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """Rows (one mapping each) of one or more JSONL / JSON-list / parquet files."""
    from mia.rl.__main__ import load_samples

    items = [paths] if isinstance(paths, str | Path) else list(paths)
    rows: list[dict[str, Any]] = []
    for p in items:
        rows += load_samples(p)
    return rows


def has_images(messages: Iterable[Message]) -> bool:
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") not in (None, "text") for part in content
        ):
            return True
    return False


@dataclass
class DataReport:
    """What tokenisation kept and dropped."""

    conversations: int = 0
    kept: int = 0
    images: int = 0  # skipped: image parts (text-only token mode)
    too_long: int = 0  # the prompt alone exceeded max_length
    truncated: int = 0  # cut to max_length
    errors: list[str] = field(default_factory=list)
    tokens: int = 0
    trained_tokens: int = 0

    def summary(self) -> str:
        parts = [f"{self.kept}/{self.conversations} conversations"]
        parts.append(f"{self.tokens} tokens ({self.trained_tokens} trained)")
        for label, n in (
            ("with images skipped", self.images),
            ("truncated", self.truncated),
            ("prompt too long", self.too_long),
            ("refused", len(self.errors)),
        ):
            if n:
                parts.append(f"{n} {label}")
        return ", ".join(parts)


def conversations(
    rows: Sequence[dict[str, Any]], fields: Sequence[str], dedupe: bool = True
) -> list[tuple[str, list[Message]]]:
    """``(source, messages)`` per row and field, in row order; a missing field is an error.
    ``dedupe`` keeps the first of identical conversations (e.g. one question's planner chat
    in the rows of its with-plan and without-plan transcripts)."""
    out = []
    seen: set[str] = set()
    for n, row in enumerate(rows):
        rid = str(row.get("id", n))
        for name in fields:
            msgs = row.get(name)
            if msgs is None:
                raise MiaError(f"row {rid}: no field {name!r} (fields: {sorted(row)})")
            if isinstance(msgs, str):
                msgs = json.loads(msgs)  # parquet stores nested chats as JSON text
            if not isinstance(msgs, list):
                raise MiaError(f"row {rid}: field {name!r} must be a list of messages")
            if dedupe:
                key = json.dumps(msgs, sort_keys=True, ensure_ascii=False)
                if key in seen:
                    continue
                seen.add(key)
            out.append((f"{rid}:{name}", msgs))
    return out


def tokenize_rows(
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    fields: Sequence[str] = ("messages",),
    max_length: int | None = None,
    skip_images: bool = True,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[TokenizedChat], DataReport]:
    """Tokenise every conversation of ``rows``; see :class:`DataReport` for what is dropped."""
    chat = ChatTokenizer(tokenizer, chat_template_kwargs)
    convs = conversations(rows, fields)
    report = DataReport(conversations=len(convs))
    todo = []
    for source, msgs in convs:
        if has_images(msgs):
            if not skip_images:
                raise MiaError(
                    f"{source}: has images; token-mode SFT is text-only (set "
                    "data.skip_images=true to skip such conversations)"
                )
            report.images += 1
            continue
        todo.append((source, msgs))
    out: list[TokenizedChat] = []
    for item in chat.encode_many(todo):
        if isinstance(item, MiaError):
            report.errors.append(str(item))
            continue
        if max_length is not None and item.n_tokens > max_length:
            if len(item.prompt_ids) >= max_length:
                report.too_long += 1
                continue
            item = item.truncated(max_length)
            report.truncated += 1
        out.append(item)
        report.tokens += item.n_tokens
        report.trained_tokens += item.n_trained
    report.kept = len(out)
    return out, report
