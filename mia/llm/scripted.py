"""A scripted chat backend for tests: canned replies in order (or from a function), every
prompt recorded so tests can assert exact prompts. Not a fake of a paid API: it stands in for
an LLM where a test checks the plumbing around it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mia.llm.base import ChatResult, LLMError, Message, SamplingParams


class ScriptedChat:
    """Replies from ``replies`` (a list consumed in order, or ``fn(messages) -> str``)."""

    def __init__(
        self,
        replies: list[str] | Callable[[list[Message]], str],
        name: str = "scripted",
    ) -> None:
        self.name = name
        self._replies = replies
        self._lock = asyncio.Lock()
        self.calls: list[dict[str, Any]] = []

    async def chat(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> ChatResult:
        async with self._lock:
            self.calls.append({"messages": [dict(m) for m in messages], "params": params})
            if callable(self._replies):
                text = self._replies(messages)
            else:
                if not self._replies:
                    raise LLMError(
                        f"{self.name}: script exhausted after {len(self.calls) - 1} calls"
                    )
                text = self._replies.pop(0)
        return ChatResult(text=text, completion_tokens=len(text.split()))

    async def aclose(self) -> None:
        return None
