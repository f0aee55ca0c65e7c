"""The chat interface every role (manager, planner, executor, judge) talks through.

A backend turns OpenAI-style ``messages`` into one assistant reply. Backends: ``openai`` (any
OpenAI-compatible HTTP server, e.g. vLLM), ``local`` (in-process transformers, the embedded
default) and ``scripted`` (tests: canned replies, recorded prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mia.errors import MiaError

# OpenAI chat format: {"role": "system|user|assistant|tool", "content": str | list[part]}
Message = dict[str, Any]


class LLMError(MiaError):
    """An LLM call failed after its retries (timeout, 5xx, connection error, bad reply)."""


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stop: list[str] | None = None
    presence_penalty: float = 0.0
    seed: int | None = None
    logprobs: bool = False


@dataclass
class ChatResult:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Exact ids/logprobs of the reply when the backend knows them (local backend, vLLM).
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ChatBackend(Protocol):
    """One async chat call. Implementations must be safe under concurrent calls."""

    name: str

    async def chat(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> ChatResult: ...

    async def aclose(self) -> None: ...
