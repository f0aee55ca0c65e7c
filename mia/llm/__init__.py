"""One async chat interface (``mia.llm.base``) with OpenAI-compatible HTTP, in-process transformers and scripted backends."""

from __future__ import annotations

from typing import Any

from mia.llm.base import ChatBackend, ChatResult, LLMError, Message, SamplingParams
from mia.llm.config import LLMConfig, build_backend, roles_from_config
from mia.llm.think import strip_think

__all__ = [
    "ChatBackend",
    "ChatResult",
    "LLMConfig",
    "LLMError",
    "LocalChat",
    "Message",
    "OpenAIChat",
    "SamplingParams",
    "ScriptedChat",
    "build_backend",
    "roles_from_config",
    "strip_think",
]

_LAZY = {
    "OpenAIChat": "mia.llm.openai_backend",
    "LocalChat": "mia.llm.local_backend",
    "ScriptedChat": "mia.llm.scripted",
}


def __getattr__(name: str) -> Any:
    # Backends import openai / torch; load them only when asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mia.llm' has no attribute {name!r}")
