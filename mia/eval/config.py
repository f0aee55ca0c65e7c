"""Tunables of ``mia eval``; defaults mirror ``configs/eval/default.yaml``.

``load_eval_config`` merges: dataclass defaults <- a YAML file <- ``key=value`` overrides
(OmegaConf dot paths, e.g. ``memory.top_k=3 judge.mode=em``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mia.config import load_config
from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("eval")
ORDERS = ("online", "batched")
MODALITIES = ("all", "text-only", "text-image")


@dataclass
class MemoryOptions:
    # Memories retrieved per question (positives AND negatives) by /plan and /memory;
    # None = memory_serve's own default (2 + 2, the paper's).
    top_k: int | None = None
    # /replan retrieval: the reference's inference driver asks with mem_top_k=0.
    replan_top_k: int = 0
    # A fresh run empties the memory first (the reference calls /clear_memory at start);
    # false evaluates on top of what the service already holds. Resumed runs never clear.
    clear_on_start: bool = True


@dataclass
class ServicesOptions:
    """What ``--start-services`` starts (local_search, serve, memory_serve on loopback)."""

    index: str | None = None  # local_search index folder (python -m local_search build)
    image_cache: list[str] = field(default_factory=list)  # image-search cache roots for serve
    llm_config: str = "embedded"  # configs/llm/<name>.yaml or a path: executor/manager/planner
    # Torch threads per LLM service process; None = half the CPU cores (at least 1), so the
    # Executor and the Manager do not fight over the same cores.
    threads: int | None = None
    startup_timeout_s: float = 900.0
    memory_overrides: list[str] = field(default_factory=list)  # key=value for memory_serve
    serve_overrides: list[str] = field(default_factory=list)  # key=value for serve


@dataclass
class EvalConfig:
    dataset: str | None = None  # QA file: .jsonl / .json / .parquet (mia.data.formats.load_qa)
    offset: int = 0  # skip this many questions (after the modality filter)
    limit: int | None = None  # then take at most this many
    modality: str = "all"  # all | text-only | text-image
    policies: list[str] = field(default_factory=lambda: ["mia"])  # none | plan_only | mia | rag
    order: str = "online"  # online: memory grows per question; batched: frozen per batch
    batch_size: int = 8  # batched order: questions per frozen-memory batch
    workers: int = 4  # questions in flight at once
    reflect: bool = True  # planner policies: /judge_replan, then at most one /replan
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    # A judge config (mia.judge.JudgeConfig fields; configs/judge/*.yaml).
    judge: dict[str, Any] = field(default_factory=lambda: {"type": "rules", "mode": "contains"})
    # Where an llm/panel judge gets its LLM: a role of an llm config, with field overrides.
    judge_llm: dict[str, Any] = field(
        default_factory=lambda: {"config": "embedded", "role": "judge", "overrides": {}}
    )
    request_timeout_s: float = 1800.0  # per HTTP call (a plan or an Executor run)
    plot: bool = True  # write accuracy.png
    services: ServicesOptions = field(default_factory=ServicesOptions)

    def validate(self) -> EvalConfig:
        from mia.eval.policies import POLICIES

        checks = [
            (self.offset >= 0, "offset must be >= 0"),
            (self.limit is None or self.limit >= 1, "limit must be >= 1 or null"),
            (self.modality in MODALITIES, f"modality must be one of {MODALITIES}"),
            (bool(self.policies), "policies must not be empty"),
            (self.order in ORDERS, f"order must be one of {ORDERS}"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.workers >= 1, "workers must be >= 1"),
            (self.memory.top_k is None or self.memory.top_k >= 0, "memory.top_k must be >= 0"),
            (self.memory.replan_top_k >= 0, "memory.replan_top_k must be >= 0"),
            (self.request_timeout_s > 0, "request_timeout_s must be > 0"),
            (
                self.services.threads is None or self.services.threads >= 1,
                "services.threads must be >= 1 or null",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"eval config: {message}")
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise MiaError(f"eval config: unknown policy {unknown[0]!r} (known: {POLICIES})")
        if len(set(self.policies)) != len(self.policies):
            raise MiaError("eval config: a policy is listed twice")
        return self


def load_eval_config(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> EvalConfig:
    """Defaults <- YAML ``path`` (a file or a name in configs/eval/) <- ``key=value`` overrides."""
    return load_config(EvalConfig, path, overrides, group="eval", where="eval config")
