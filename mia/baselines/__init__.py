"""Memory baselines of ``mia eval``: Mem0, A-Mem, ExpeL, Memento and ReasoningBank behind the
one interface MIA's memory has (retrieve for a question; write a finished, judged trajectory).
See docs/baselines.md for what each does and how it differs from its paper.

``build_memory(name, cfg, path, memory_llm, embedder)`` opens one baseline on a SQLite file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mia.baselines.base import (
    BaselineMemory,
    Finished,
    ItemStore,
    LLMCaller,
    Retrieval,
    WriteResult,
    parse_json,
)
from mia.baselines.config import BaselinesConfig
from mia.embedding import Embedder
from mia.errors import MiaError
from mia.llm.base import ChatBackend

BASELINES = ("mem0", "amem", "expel", "memento", "reasoningbank")
PLANNER_BASELINES = ("expel", "memento")  # their context feeds a Planner


def build_memory(
    name: str,
    cfg: BaselinesConfig,
    path: str | Path,
    llm: ChatBackend,
    embedder: Embedder,
) -> BaselineMemory:
    """Baseline ``name`` on the SQLite file ``path`` (created if missing)."""
    from mia.baselines.amem import AMemMemory
    from mia.baselines.expel import ExpelMemory
    from mia.baselines.mem0 import Mem0Memory
    from mia.baselines.memento import MementoMemory
    from mia.baselines.reasoningbank import ReasoningBankMemory

    classes: dict[str, Any] = {
        "mem0": (Mem0Memory, cfg.mem0),
        "amem": (AMemMemory, cfg.amem),
        "expel": (ExpelMemory, cfg.expel),
        "memento": (MementoMemory, cfg.memento),
        "reasoningbank": (ReasoningBankMemory, cfg.reasoningbank),
    }
    if name not in classes:
        raise MiaError(f"unknown memory baseline {name!r} (known: {BASELINES})")
    cls, sub = classes[name]
    store = ItemStore(path, embedder)
    caller = LLMCaller(llm, cfg.llm.max_tokens)
    return cls(store, caller, sub, cfg.trace_max_chars)  # type: ignore[no-any-return]


__all__ = [
    "BASELINES",
    "PLANNER_BASELINES",
    "BaselineMemory",
    "BaselinesConfig",
    "Finished",
    "Retrieval",
    "WriteResult",
    "build_memory",
    "parse_json",
]
