"""Config schemas of the memory baselines (``mia eval --help-config``, keys ``baselines.*``).

Defaults are the papers' published ones where a paper has the knob; where the reference's port
changed one, the help text says so (docs/baselines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mia.config import option, section
from mia.errors import MiaError


@dataclass
class BaselineLLMConfig:
    """Which LLM the baselines call: roles of an llm config (the embedded default or any
    OpenAI-compatible endpoint through ``overrides``)."""

    config: str | None = option(
        None,
        "configs/llm/<name>.yaml or a path; null = services.llm_config (the config the "
        "services run on, so the baselines share their LLM)",
    )
    memory_role: str = option(
        "manager",
        "role that writes memories: fact extraction and updates (mem0), note analysis and "
        "evolution (amem), insights (expel), strategy distillation (reasoningbank)",
    )
    planner_role: str = option(
        "planner", "role of the Planner that reads expel's insights and memento's cases"
    )
    overrides: dict[str, Any] = option(
        {}, "LLMConfig fields for both roles, e.g. {backend: openai, base_url: ..., model: qwen}"
    )
    max_tokens: int = option(512, "tokens per memory-writing LLM reply")


@dataclass
class Mem0Config:
    """Mem0 (classic pipeline): LLM fact extraction, then ADD / UPDATE / DELETE / NOOP."""

    max_facts: int = option(10, "facts kept from one extraction reply")
    similar_k: int = option(5, "existing facts shown to the update step per new fact (paper: 5)")
    top_k: int = option(5, "facts retrieved for a question")
    min_score: float = option(0.0, "cosine threshold for a retrieved fact")


@dataclass
class AMemConfig:
    """A-Mem: notes with keywords, tags and a context, linked to neighbours that evolve."""

    neighbours_k: int = option(
        5, "nearest notes shown to the evolution step (paper: 5; the reference's port: 2)"
    )
    top_k: int = option(3, "notes retrieved for a question (before their links are added)")
    follow_links: bool = option(True, "add the linked notes of each retrieved note")
    max_linked: int = option(3, "linked notes added at most, over all hits")


@dataclass
class ExpelConfig:
    """ExpeL: an insight list (ADD / EDIT / UPVOTE / DOWNVOTE) + similar successes as examples."""

    max_insights: int = option(20, "insights kept at most; ADD is refused when full (paper: 20)")
    new_importance: int = option(2, "votes of a freshly added insight (ExpeL's code: 2)")
    examples_k: int = option(2, "task-similar successful trajectories shown as examples")
    compare_k: int = option(
        3, "similar earlier trajectories of the other outcome (or successes) to contrast with"
    )


@dataclass
class MementoConfig:
    """Memento: a case bank of (question, plan, reward) fed to a meta-planner."""

    top_k: int = option(4, "similar cases retrieved for a question (paper: K=4 best)")


@dataclass
class ReasoningBankConfig:
    """ReasoningBank: strategy items distilled from successes and failures."""

    max_items: int = option(3, "strategy items kept from one trajectory (paper: at most 3)")
    top_k: int = option(1, "items retrieved for a question (paper: top-1)")


@dataclass
class BaselinesConfig:
    """The memory baselines of ``mia eval`` (policies mem0, amem, expel, memento,
    reasoningbank): in-process memories, one SQLite file per policy run."""

    llm: BaselineLLMConfig = section(BaselineLLMConfig, "the LLM the baselines call")
    embedder: str = option(
        "default", "sentence-transformers model or folder (default: all-MiniLM-L6-v2)"
    )
    trace_max_chars: int = option(
        4000, "a trajectory's trace is cut in the middle to this size in memory prompts"
    )
    mem0: Mem0Config = section(Mem0Config, "mem0: facts edited by ADD / UPDATE / DELETE / NOOP")
    amem: AMemConfig = section(AMemConfig, "amem: linked notes whose neighbours evolve")
    expel: ExpelConfig = section(
        ExpelConfig, "expel: insight list + similar successful examples, for the Planner"
    )
    memento: MementoConfig = section(
        MementoConfig, "memento: case bank of plans for the meta-planner"
    )
    reasoningbank: ReasoningBankConfig = section(
        ReasoningBankConfig, "reasoningbank: strategy items from successes and failures"
    )

    def validate(self) -> BaselinesConfig:
        checks = [
            (self.llm.max_tokens >= 1, "llm.max_tokens must be >= 1"),
            (self.trace_max_chars >= 0, "trace_max_chars must be >= 0"),
            (self.mem0.max_facts >= 1, "mem0.max_facts must be >= 1"),
            (self.mem0.similar_k >= 0, "mem0.similar_k must be >= 0"),
            (self.mem0.top_k >= 1, "mem0.top_k must be >= 1"),
            (self.amem.neighbours_k >= 0, "amem.neighbours_k must be >= 0"),
            (self.amem.top_k >= 1, "amem.top_k must be >= 1"),
            (self.amem.max_linked >= 0, "amem.max_linked must be >= 0"),
            (self.expel.max_insights >= 1, "expel.max_insights must be >= 1"),
            (self.expel.new_importance >= 1, "expel.new_importance must be >= 1"),
            (self.expel.examples_k >= 0, "expel.examples_k must be >= 0"),
            (self.expel.compare_k >= 0, "expel.compare_k must be >= 0"),
            (self.memento.top_k >= 1, "memento.top_k must be >= 1"),
            (self.reasoningbank.max_items >= 1, "reasoningbank.max_items must be >= 1"),
            (self.reasoningbank.top_k >= 1, "reasoningbank.top_k must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"baselines config: {message}")
        return self
