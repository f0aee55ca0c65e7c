"""Trajectory -> workflow summary (docs/reference.md §4.3).

``llm`` mode: the trace (``mia.trace``) goes to the manager LLM with the compression prompt and the
numbered "purpose (input -> output)" steps after its reasoning are kept. ``rules`` mode writes the
same kind of steps without an LLM (:func:`mia.trace.rule_summary`: the queries, the passages
found, the sentence in which the Executor concluded): instant and deterministic, the setting for
small Managers such as the embedded default. ``identity`` mode keeps the formatted trace itself
(the RAG baseline of the paper).
"""

from __future__ import annotations

from typing import Any

from memory_serve.config import CompressConfig
from memory_serve.llms import sampling
from mia.llm.base import ChatBackend, LLMError, SamplingParams
from mia.llm.think import text_after_think
from mia.prompts.manager import compress_prompt
from mia.trace import format_trace, rule_summary, truncate_words


class Compressor:
    def __init__(self, cfg: CompressConfig, llm: ChatBackend | None) -> None:
        if cfg.mode == "llm" and llm is None:
            raise ValueError("compress.mode=llm needs a manager LLM")
        self.cfg = cfg
        self.llm = llm

    def trace(self, question: str, messages: list[dict[str, Any]]) -> str:
        return format_trace(question, messages, max_tool_words=self.cfg.max_tool_words)

    def messages(self, trace: str) -> list[dict[str, Any]]:
        """The exact chat sent to the manager LLM (tests assert it)."""
        return [{"role": "user", "content": compress_prompt(trace, self.cfg.summary_max_words)}]

    def params(self) -> SamplingParams | None:
        assert self.llm is not None
        return sampling(self.llm, temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens)

    async def summary(
        self, question: str, messages: list[dict[str, Any]], trace: str | None
    ) -> str:
        """The workflow summary of a finished trajectory (``trace``: a client's own trace text,
        used instead of the messages by the llm and identity modes)."""
        if self.cfg.mode == "rules":
            return rule_summary(question, messages)
        return await self.summarise(trace if trace is not None else self.trace(question, messages))

    async def summarise(self, trace: str) -> str:
        if self.cfg.mode == "identity":
            return trace
        assert self.llm is not None
        result = await self.llm.chat(self.messages(trace), self.params())
        summary = text_after_think(result.text)
        if not summary:
            if self.cfg.on_empty != "trace":
                raise LLMError(f"{self.llm.name}: empty workflow summary")
            summary = trace
        if self.cfg.truncate_summary_words is not None:
            summary = truncate_words(summary, self.cfg.truncate_summary_words)
        return summary
