"""The memory_serve contract: request and response models of every route, shared by the
service (``memory_serve``) and its client (:class:`mia.services.memory.client.MemoryClient`).

Field names follow docs/memory_serve.md; the reference's names are accepted as aliases
(``used_memory_indices``, ``memory_indices``, ``temp_messages``, ``save_path``, ...) so its
scripts can talk to this service. Batch routes take one object or a JSON list of them.

Where an answer carries a reference field name, it has the reference's type and meaning
(docs/reference.md §3.1, §3.2): ``need_replan`` is ``"yes"``/``"no"`` text (the boolean is
``replan_needed``), ``/memory`` also answers the TTRL driver's ``prompt`` and ``indices``, and
``/replan``'s ``pos_indices``/``neg_indices`` are always empty, as there. Our typed extras
(``positive_ids``, ``planner``, ...) sit beside them under their own names.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Modality = Literal["text-only", "text-image"]
Category = Literal[
    "location",
    "human",
    "time",
    "career",
    "process",
    "definition",
    "event",
    "function",
    "property",
    "others",
]
Rule = Literal["random", "first", "shortest", "longest", "choice"]
Caption = str | list[str] | None
Judgement = str | bool | int | None
MAX_TOP_K = 100

MODALITIES: tuple[str, ...] = Modality.__args__  # type: ignore[attr-defined]
CATEGORIES: tuple[str, ...] = Category.__args__  # type: ignore[attr-defined]
# Bounds on the JSON a memory keeps (``extra``, a rollout's ``messages``): serialisers give up
# near 256 levels, and the store and its backups hold the same bounds.
MAX_JSON_DEPTH = 32
MAX_EXTRA_CHARS = 1_000_000  # ``extra`` as JSON text


def check_depth(value: Any, name: str, limit: int = MAX_JSON_DEPTH) -> None:
    """ValueError when ``value`` nests deeper than ``limit`` (a scalar is 0, ``{"a": 1}`` 1)."""
    stack = [(value, 1)]
    while stack:  # iterative: a deep value must not exhaust Python's recursion limit here
        item, level = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if level > limit:
            raise ValueError(f"{name} is nested deeper than {limit} levels")
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children)


def extra_json(extra: Any, name: str = "extra", depth: int = MAX_JSON_DEPTH) -> str:
    """``extra`` as stored: a JSON object, bounded in depth and size (ValueError otherwise)."""
    if not isinstance(extra, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(extra).__name__}")
    check_depth(extra, name, depth)
    try:
        text = json.dumps(extra, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} is not JSON: {err}") from None
    if len(text) > MAX_EXTRA_CHARS:
        raise ValueError(f"{name} is {len(text)} characters of JSON, at most {MAX_EXTRA_CHARS}")
    return text


def _aliases(*names: str) -> Any:
    return AliasChoices(*names)


class _Request(BaseModel):
    # Unknown fields are ignored (reference clients send extras such as "images").
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class ChatMessage(BaseModel):
    """An OpenAI-style chat message; extra keys (tool_calls, name, ...) are kept."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[Any] | None = ""


def dump_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [m.model_dump() for m in messages]


# ----------------------------------------------------------------------------- retrieval / plan


class MemoryQuery(_Request):
    question: str = Field(min_length=1)
    image_caption: Caption = None
    data_id: str = ""
    mem_top_k: int | None = Field(
        default=None, ge=0, le=MAX_TOP_K, validation_alias=_aliases("mem_top_k", "top_k")
    )
    pass_num: int = Field(default=0, ge=0, le=10_000)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=1.0)
    category: Category | None = None  # skip the classifier and use this bucket
    modality: Modality | None = None  # default: text-image iff a caption is given
    # /memory only: also return how every retrieved memory was scored (``explain``).
    explain: bool = False
    # /plan only: write a plan only when memory holds something for the question (``memory``)
    # or a failed similar question (``failure``); else the answer has plan "" and planner "none".
    plan_if: Literal["always", "memory", "failure"] = "always"


class ScoredMemory(BaseModel):
    """One retrieved memory and the numbers that ranked it (``/memory`` with ``explain``)."""

    rank: int  # 1 = first
    id: int
    question: str
    workflow_summary: str
    judgement: str
    usage_count: int
    success_count: int
    similarity: float  # raw mixed cosine
    normalised: float  # min-max normalised over the bucket
    win_rate: float
    score: float  # similarity_weight * normalised + win_rate_weight * win_rate


class RetrievalExplain(BaseModel):
    modality: str
    category: str
    bucket_size: int
    # The bucket's raw similarity range used by the min-max normalisation (None: empty bucket).
    similarity_min: float | None
    similarity_max: float | None
    caption_used: bool  # the query had a caption: sim = qw*cos(q) + cw*cos(caption)
    question_weight: float
    caption_weight: float
    similarity_weight: float
    win_rate_weight: float
    min_similarity: float | None
    top_k: int
    pass_num: int
    positives: list[ScoredMemory]
    negatives: list[ScoredMemory]


class MemoryResponse(BaseModel):
    context: str
    positive_ids: list[int]
    negative_ids: list[int]
    # Reference names of the same ids (§3.1).
    pos_indices: list[int]
    neg_indices: list[int]
    # The TTRL driver's names (§3.2): the memory text and the union of both sides' ids.
    prompt: str
    indices: list[int]
    explain: RetrievalExplain | None = None  # only when asked (absent otherwise)


class PlanResponse(BaseModel):
    plan: str
    messages: list[dict[str, Any]]
    memory_ids: list[int]
    positive_ids: list[int]
    negative_ids: list[int]
    pos_indices: list[int]
    neg_indices: list[int]
    context: str
    # Which LLM wrote it ("manager" = cold start; "none": no plan, as ``plan_if`` asked).
    planner: Literal["manager", "planner", "none"]


class JudgeReplanRequest(_Request):
    workflow: str = Field(min_length=1, validation_alias=_aliases("workflow", "trace"))
    past_messages: list[ChatMessage] = Field(min_length=1)
    memory_ids: list[int] = Field(
        default_factory=list, validation_alias=_aliases("memory_ids", "memory_indices")
    )


class BestPlanResponse(PlanResponse):
    """``/best_plan``: several sampled plans, one picked by the manager LLM."""

    selected_plan_number: str  # "1".."n", the reference's JSON-schema enum value
    all_plans: list[str]


class JudgeReplanResponse(BaseModel):
    need_replan: Literal["yes", "no"]  # the reference's text
    replan_needed: bool  # the same decision as a boolean
    decision: Literal["yes", "no"]
    messages: list[dict[str, Any]]
    planner: Literal["manager", "planner"]


class ReplanRequest(MemoryQuery):
    past_messages: list[ChatMessage] = Field(min_length=1)


class ReplanResponse(BaseModel):
    replan: str
    messages: list[dict[str, Any]]
    planner: Literal["manager", "planner"]
    pos_indices: list[int]  # always [] (the reference's replan prompt holds no memories)
    neg_indices: list[int]  # always []
    memory_ids: list[int]  # what the cold-start decision looked at (ours)


class ReplanTrainRequest(_Request):
    question: str = Field(min_length=1)
    plan: str = ""
    trace: str = Field(default="", validation_alias=_aliases("trace", "workflow"))
    mem_context1: str = Field(
        default="", validation_alias=_aliases("mem_context1", "memories_context", "memory")
    )
    mem_context2: str = ""  # accepted for compatibility; unused (as in the reference)
    data_id: str = ""
    image_caption: Caption = None


class ReplanTrainResponse(BaseModel):
    replan: Literal[True] = True
    content: str


# ----------------------------------------------------------------------------- writes


class _TrajectoryFields(_Request):
    data_id: str = ""
    question: str = Field(min_length=1)
    image_caption: Caption = None
    plan: str = ""
    messages: list[ChatMessage] = Field(
        default_factory=list, validation_alias=_aliases("messages", "temp_messages")
    )
    judgement: Judgement = None
    # No-ground-truth runs: the panel's verdict and its feedback.
    judgement_nogt: Judgement = None
    judgement_data: dict[str, Any] | None = None
    evaluator_1_feedback: str | None = None
    evaluator_2_feedback: str | None = None
    evaluator_3_feedback: str | None = None
    used_memory_ids: list[int] = Field(
        default_factory=list,
        validation_alias=_aliases("used_memory_ids", "used_memory_indices", "memory_ids"),
    )
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("judgement", "judgement_nogt", mode="before")
    @classmethod
    def _judgement_type(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str | bool | int):
            raise ValueError("judgement must be 'correct'/'incorrect' or a boolean")
        return v

    @field_validator("extra", "judgement_data", mode="before")
    @classmethod
    def _bounded_extra(cls, v: Any, info: ValidationInfo) -> Any:
        # Both end up in the memory's extra, judgement_data one level down.
        if isinstance(v, dict):
            nested = info.field_name == "judgement_data"
            extra_json(v, str(info.field_name), MAX_JSON_DEPTH - nested)
        return v

    @field_validator("messages", mode="before")
    @classmethod
    def _bounded_messages(cls, v: Any) -> Any:
        check_depth(v, "messages")  # a rollout keeps them
        return v


class TrajectoryItem(_TrajectoryFields):
    """A finished trajectory for ``/memories`` (``/batch_memory_save``)."""

    workflow_summary: str | None = None  # given: skip compression
    trace: str | None = None  # given: skip trace formatting
    source: str = ""
    category: Category | None = None
    modality: Modality | None = None


class WriteOutcome(BaseModel):
    action: Literal["inserted", "replaced", "kept_existing"]
    id: int
    replaced_id: int | None
    credited_ids: list[int]
    evicted_ids: list[int]
    category: str
    modality: str


class SaveMemoriesResponse(BaseModel):
    status: Literal["success"] = "success"
    results: list[WriteOutcome]


class FindMemoriesRequest(_Request):
    """Which stored memories came from these trajectories (``/memories/find``): lets a client
    that crashed between "trajectory finished" and "write acknowledged" check before retrying,
    so a write keyed by ``data_id`` (+ ``source``) is never duplicated."""

    data_ids: list[str] = Field(min_length=1, max_length=100_000)
    source: str | None = None  # only memories written with this source


class FoundMemory(BaseModel):
    id: int
    data_id: str
    question: str
    judgement: str
    source: str
    created_at: float


class FindMemoriesResponse(BaseModel):
    memories: list[FoundMemory]


class MemoryRow(BaseModel):
    """A stored memory as the inspector lists it (``GET /memories``)."""

    id: int
    data_id: str
    question: str
    image_caption: str
    workflow_summary: str
    judgement: str
    usage_count: int
    success_count: int
    win_rate: float
    modality: str
    category: str
    created_at: float
    source: str


class MemoryPage(BaseModel):
    total: int  # memories matching the filters
    offset: int
    limit: int
    memories: list[MemoryRow]


class MemoryUse(BaseModel):
    """A trajectory that used (was credited with) a memory."""

    id: int
    question: str
    data_id: str
    success: bool
    source: str
    result_id: int | None  # the memory that trajectory became (None: not stored)
    created_at: float


class MemoryDetail(BaseModel):
    memory: MemoryRow
    plan: str
    extra: dict[str, Any]
    uses: int  # all recorded uses (``history`` holds the latest)
    history: list[MemoryUse]

    @field_validator("extra", mode="before")
    @classmethod
    def _showable(cls, v: Any) -> Any:
        # A store written before extra was bounded may hold one no serialiser can write out:
        # the memory is still shown, with a note instead of that extra.
        try:
            check_depth(v, "extra")
        except ValueError as err:
            return {"error": f"{err}; not shown"}
        return v


class RunInfo(BaseModel):
    id: str  # the run file's path under the runs folder
    kind: Literal["ttrl", "eval"]
    name: str
    modified: float


class RunsResponse(BaseModel):
    root: str
    runs: list[RunInfo]
    truncated: bool


class RunDetail(RunInfo):
    rows: list[dict[str, Any]]  # ttrl: one per batch; eval: one per policy


# ---- the OpenAI-compatible proxy (``memory_serve --proxy``; docs/proxy.md)


class ProxyChatRequest(BaseModel):
    """What the proxy reads of ``/v1/chat/completions``; the body goes upstream as sent."""

    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    model: str | None = None


class FeedbackRequest(BaseModel):
    """``POST /v1/feedback``: a task's outcome (``correct`` or a ``judgement``)."""

    model_config = ConfigDict(extra="ignore")
    task_id: str | None = Field(default=None, max_length=200)  # the X-MIA-Task-Id header
    completion_id: str | None = Field(default=None, max_length=500)  # or a completion's id
    correct: bool | None = None
    judgement: str | None = Field(default=None, max_length=50)
    feedback: str | None = Field(default=None, max_length=10_000)  # kept with the memory


class FeedbackResponse(BaseModel):
    status: str
    task_id: str
    result: WriteOutcome


class TaskInfo(BaseModel):
    """``GET /v1/tasks/{id}``: a proxied task and what became of it."""

    task_id: str
    question: str
    plan: str
    memory_ids: list[int]
    turns: int
    status: str  # open | failed (the last upstream exchange failed) | recording | recorded
    result: WriteOutcome | None
    created_at: float


class RolloutItem(_TrajectoryFields):
    """One TTRL rollout for ``/memory_bank_save``."""

    slow_plan: str = ""


class BankSaveResponse(BaseModel):
    status: Literal["success"] = "success"
    buffered: int
    ids: list[int]


class ConsolidateRequest(_Request):
    seed: int | None = None  # default: ttrl.seed from the config


class ConsolidateResponse(BaseModel):
    status: Literal["success"] = "success"
    questions: int
    saved_positives: int
    saved_negatives: int
    saved_plan_pairs: int
    results: list[WriteOutcome]


class BatchEvaluateRequest(_Request):
    output_dir: str | None = None  # default: ttrl.output_dir
    rules: list[Rule] | None = None  # default: ttrl.rules
    step: int | None = None  # recorded in every output row
    seed: int | None = None


class BatchEvaluateResponse(BaseModel):
    status: Literal["success"] = "success"
    processed_count: int
    accuracy: dict[str, float | None]
    files: dict[str, str]
    choice_fallbacks: int
    message: str


# ----------------------------------------------------------------------------- persistence

PersistFormat = Literal["auto", "sqlite", "json", "dir"]


class SaveRequest(_Request):
    path: str | None = Field(default=None, validation_alias=_aliases("path", "save_path"))
    format: PersistFormat = "auto"


class SaveResponse(BaseModel):
    status: Literal["success"] = "success"
    format: Literal["sqlite", "json", "dir"]
    files: list[str]
    memories: int
    plan_pairs: int


class LoadRequest(_Request):
    path: str = Field(min_length=1, validation_alias=_aliases("path", "load_path"))
    format: PersistFormat = "auto"
    mode: Literal["replace", "merge"] = "replace"  # merge: JSON imports only
    reembed: bool = False  # a SQLite copy made with another embedder: re-embed it


class LoadResponse(BaseModel):
    status: Literal["success"] = "success"
    format: Literal["sqlite", "json", "dir"]
    memories: int
    plan_pairs: int
    imported: int


class ClearRequest(_Request):
    rollouts: bool = True  # also empty the TTRL rollout buffer


class ClearResponse(BaseModel):
    status: Literal["success"] = "success"
    message: str


class StatsResponse(BaseModel):
    memories: int
    plan_pairs: int
    buckets: dict[str, dict[str, int]]
    buffered_rollouts: int
    buffered_questions: int
    embedder: str
    dim: int
    db_path: str
    compress_mode: str
    classifier: bool
