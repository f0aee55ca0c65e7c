"""The ``mia eval`` config schema (``mia eval --help-config`` lists every key).

Every default lives here; ``configs/eval/*.yaml`` hold only what differs. ``load_eval_config``
merges: defaults <- a YAML file <- ``key=value`` overrides (dot paths, e.g.
``memory.top_k=3 judge.mode=em``; :func:`mia.config.load_config`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mia.baselines.config import BaselinesConfig
from mia.config import load_config, option, section
from mia.errors import MiaError
from mia.judge import JudgeConfig
from mia.paths import config_dir

CONFIG_DIR = config_dir("eval")
ORDERS = ("online", "batched")
MODALITIES = ("all", "text-only", "text-image")
EXPECTED_ANSWERS = ("right", "wrong")


@dataclass
class MemoryOptions:
    """How the policies use memory_serve."""

    top_k: int | None = option(
        None,
        "memories per question (positives AND negatives) by /plan and /memory; null = "
        "memory_serve's own default (2 + 2, the paper's)",
    )
    replan_top_k: int = option(
        0, "/replan retrieval (the reference's inference driver asks with mem_top_k=0)"
    )
    plan_without_memory: bool = option(
        True,
        "mia: false = a question for which /memory finds nothing (e.g. under "
        "store.retrieval.min_similarity) gets no plan and the Executor answers alone, as in "
        "none; plan_only is unaffected",
    )
    plan_without_failure: bool = option(
        True,
        "mia: false = a question for which /memory finds no failed question (only successes, "
        "or nothing) gets no plan and the Executor answers alone, as in none: plans where "
        "memory shows the Executor failing; plan_only is unaffected",
    )
    drop_leaked_plans: bool = option(
        False,
        "mia: true = a plan that names an entity of a retrieved memory's question which the "
        "question itself lacks is not used (the Executor answers alone, as in none; the plan "
        "is noted in planner_errors)",
    )
    remember_expected: bool = option(
        False,
        "a failed question's memory also keeps the expected answer (the first gold) and the "
        "sentence of a search result the Executor read that held it (mia.trace.answer_evidence), "
        "shown to the Planner under the failure; false = the reference's memory, which keeps no "
        "ground truth",
    )
    expected_answers: str = option(
        "right",
        "with remember_expected: right = a failed question's memory keeps its own expected "
        "answer | wrong = a wrong one of the same kind instead: another question's answer of "
        "the same relation (another entity's value), drawn from the dataset with a fixed seed "
        "per question (mia.eval.templates.wrong_answers; a question with no such answer "
        "remembers none) -- a control: does the Planner read the answer or the workflow?",
    )
    ground_truth: bool = option(
        True,
        "true = a memory is labelled correct or incorrect by the judge, against the gold "
        "answers | false = labelled without ground truth (the majority vote's no-GT rule, "
        "nogt_samples) and with no expected answer, whatever remember_expected says: what a "
        "user without gold answers has. The reported accuracy is the judge's either way",
    )
    nogt_samples: int = option(
        3,
        "ground_truth=false: answers per question behind its memory's label: the question's "
        "own answer and nogt_samples - 1 more Executor runs with the same guide, sampled at "
        "nogt_temperature; the memory is correct when every answer agrees (SQuAD-normalised), "
        "as TTRL's no-GT gate remembers a question whose answers disagree as a failure "
        "(docs/ttrl.md); >= 2 (a lone answer always agrees with itself)",
    )
    nogt_temperature: float = option(
        0.8, "ground_truth=false: the Executor's sampling temperature for the extra answers"
    )
    clear_on_start: bool = option(
        True,
        "a fresh run empties the memory first (the reference calls /clear_memory at start); "
        "false evaluates on top of what the service holds; a resumed run never clears",
    )


@dataclass
class ServicesOptions:
    """What ``--start-services`` starts (local_search, serve, memory_serve on loopback)."""

    index: str | None = option(
        None, "local_search index folder (python -m local_search build; or --index)"
    )
    image_cache: list[str] = option([], "image-search cache roots for serve (or --image-cache)")
    llm_config: str = option(
        "embedded",
        "configs/llm/<name>.yaml or a path: the executor/manager/planner roles (or --llm-config)",
    )
    threads: int | None = option(
        None,
        "torch threads per LLM service process; null = every core "
        "(mia.eval.supervisor.default_threads)",
    )
    startup_timeout_s: float = option(900.0, "seconds to wait for the services to come up")
    memory_overrides: list[str] = option(
        [], "key=value for memory_serve, e.g. [planner.max_tokens=200]"
    )
    serve_overrides: list[str] = option([], "key=value for serve, e.g. [agent.max_turns=10]")


@dataclass
class JudgeLLMConfig:
    """Where an llm/panel judge gets its LLM: a role of an llm config, with field overrides."""

    config: str = option("embedded", "configs/llm/<name>.yaml or a path")
    role: str = option("judge", "the role of that config")
    overrides: dict[str, Any] = option(
        {}, "LLMConfig fields, e.g. {backend: openai, base_url: ..., model: qwen}"
    )


@dataclass
class EvalConfig:
    """``mia eval``: memory policies on a QA set through running (or started) services."""

    dataset: str | None = option(
        None, "QA file: .jsonl / .json / .parquet (e.g. a world's test.jsonl; or --data)"
    )
    offset: int = option(0, "skip this many questions (after the modality filter)")
    limit: int | None = option(None, "then evaluate at most this many; null = all")
    modality: str = option("all", "all | text-only | text-image")
    policies: list[str] = option(
        ["mia"],
        "none | plan_only | mia | rag | feedback | mem0 | amem | expel | memento | "
        "reasoningbank, run one after another (or --policy)",
    )
    order: str = option(
        "online",
        "online: memory grows question by question (reference) | batched: memory frozen "
        "within each batch, written after it",
    )
    batch_size: int = option(8, "batched order: questions per frozen-memory batch")
    workers: int = option(4, "questions in flight at once")
    parallel_policies: bool = option(
        False,
        "run policies that share no memory store at the same time (each with its own workers): "
        "a local LLM decodes their requests in one batch. Policies on one store keep their order",
    )
    reflect: bool = option(True, "planner policies: /judge_replan, then at most one /replan")
    memory: MemoryOptions = section(MemoryOptions, "memory retrieval and clearing")
    judge: JudgeConfig = section(
        JudgeConfig, "the judge (configs/judge/*.yaml keys; or --judge rules|llm|panel|FILE)"
    )
    judge_llm: JudgeLLMConfig = section(
        JudgeLLMConfig, "an llm/panel judge's LLM (or --judge-url/--judge-model)"
    )
    request_timeout_s: float = option(1800.0, "seconds per HTTP call (one plan, one Executor run)")
    plot: bool = option(True, "write accuracy.png")
    services: ServicesOptions = section(ServicesOptions, "--start-services only")
    baselines: BaselinesConfig = section(
        BaselinesConfig, "the memory baselines (policies mem0, amem, expel, memento, reasoningbank)"
    )

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
            (
                self.memory.expected_answers in EXPECTED_ANSWERS,
                f"memory.expected_answers must be one of {EXPECTED_ANSWERS}",
            ),
            (
                self.memory.expected_answers == "right" or self.memory.remember_expected,
                "memory.expected_answers=wrong needs memory.remember_expected=true (no expected "
                "answer is remembered otherwise)",
            ),
            (self.memory.nogt_samples >= 2, "memory.nogt_samples must be >= 2"),
            (
                0.0 <= self.memory.nogt_temperature <= 2.0,
                "memory.nogt_temperature must be in [0, 2]",
            ),
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
        self.baselines.validate()
        return self


def load_eval_config(
    path: str | os.PathLike[str] | None = None, overrides: Sequence[str] = ()
) -> EvalConfig:
    """Defaults <- YAML ``path`` (a file or a name in configs/eval/) <- ``key=value`` overrides."""
    return load_config(EvalConfig, path, overrides, group="eval", where="eval config")
