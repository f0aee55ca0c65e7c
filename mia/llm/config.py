"""Building chat backends from config: one :class:`LLMConfig` per role.

A Hydra ``llm`` group (``configs/llm/*.yaml``) holds ``common`` (fields every role shares) and
``roles`` (``manager``, ``planner``, ``executor``, ``judge``: per-role overrides).
:func:`roles_from_config` turns it into ``{role: ChatBackend}``. Local models are cached by
``(path, device, dtype, batching)``, so roles pointing at the same model share one loaded copy
(and one batching worker) while keeping their own sampling defaults.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.config import from_dict, load_dict, option, plain, resolve_path
from mia.errors import MiaError
from mia.llm.base import ChatBackend, SamplingParams
from mia.paths import config_dir

ROLES = ("manager", "planner", "executor", "judge")
BACKENDS = ("openai", "local", "scripted")
CONFIG_DIR = config_dir("llm")


def llm_config_path(name: str | Path) -> Path:
    """A YAML file, or a name in ``configs/llm/`` (``embedded`` -> ``configs/llm/embedded.yaml``)."""
    return resolve_path(name, "llm")


def load_llm_config(name: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An llm config (``common`` + ``roles``) as a plain dict: a mapping, a YAML file or a name
    in ``configs/llm/`` (:func:`role_configs` checks it)."""
    return load_dict(name, group="llm")


@dataclass
class LLMConfig:
    """One role's LLM (``configs/llm/*.yaml``: ``common`` + ``roles``; serve's ``llm``)."""

    backend: str = option("local", "local (in-process transformers) | openai | scripted (tests)")
    name: str | None = option(None, "label in logs and errors; null = the role's name")
    base_url: str | None = option(None, "openai: the server's /v1 URL (vLLM or any OpenAI API)")
    model: str = option("qwen", "openai: the served model's name")
    api_key_env: str | None = option(
        None, "openai: name of an env var holding the API key; vLLM needs none"
    )
    timeout: float = option(600.0, "openai: seconds per request")
    max_retries: int = option(
        3, "openai: retries on timeouts, connection errors, 408/429/5xx and garbage replies"
    )
    backoff: float = option(1.0, "openai: first retry delay in seconds (doubles, with jitter)")
    concurrency: int = option(16, "openai: requests in flight per role")
    extra_body: dict[str, Any] | None = option(
        None, "openai: extra fields of every request body (server-specific options)"
    )
    return_token_ids: bool = option(
        True, "openai: ask vLLM for the prompt and reply token ids (exact usage counts)"
    )
    chat_template_kwargs: dict[str, Any] | None = option(
        None, "passed to the chat template, e.g. {enable_thinking: false} for Qwen3"
    )
    strip_think: bool = option(
        False, "drop a <think>...</think> block: consumers keep the text after </think>"
    )
    sampling: dict[str, Any] = option(
        {}, "default sampling (mia.llm.SamplingParams: temperature, top_p, max_tokens, ...)"
    )
    model_path: str | None = option(
        "embedded",
        'local: a Hugging Face model folder; "embedded" = the built-in SmolLM2-135M-Instruct',
    )
    device: str = option("cpu", "local: torch device")
    dtype: str = option(
        "auto", "local: auto (bfloat16 where native, else float32; mia.precision) | float32 | ..."
    )
    max_batch_size: int = option(8, "local: concurrent requests decoded together")
    batch_wait_ms: float = option(
        5.0, "local: how long the worker waits for more requests before decoding"
    )
    prefix_cache_mb: float = option(
        0.0,
        "local: MiB of KV kept from recent prompts and replies; a new prompt starts after its "
        "longest common prefix with them (an agent's system prompt and earlier turns); 0 = off",
    )
    repeat_stop: int = option(
        0,
        "local: end a reply (finish reason length) once its last N tokens repeat one n-gram "
        "of at most N/4 tokens, instead of decoding the loop to max_tokens; 0 = off",
    )
    replies: list[str] | None = option(None, "scripted: the replies, in order")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "llm") -> LLMConfig:
        return from_dict(cls, data, where)

    def validate(self, where: str = "llm") -> LLMConfig:
        if self.backend not in BACKENDS:
            raise MiaError(f"{where}: backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise MiaError(f"{where}: the openai backend needs base_url")
        if self.backend == "local" and not self.model_path:
            raise MiaError(f"{where}: the local backend needs model_path (or 'embedded')")
        if self.backend == "scripted" and self.replies is None:
            raise MiaError(f"{where}: the scripted backend needs replies")
        if self.prefix_cache_mb < 0:
            raise MiaError(f"{where}: prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.repeat_stop < 0 or 0 < self.repeat_stop < 4:
            raise MiaError(f"{where}: repeat_stop must be 0 or >= 4, got {self.repeat_stop}")
        sampling_fields = {f.name for f in dataclasses.fields(SamplingParams)}
        bad = sorted(set(self.sampling) - sampling_fields)
        if bad:
            raise MiaError(
                f"{where}: unknown sampling key(s) {bad} (known: {sorted(sampling_fields)})"
            )
        return self

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.sampling)


def _as_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict from a dict, a dataclass or an OmegaConf node (interpolations resolved)."""
    if cfg is not None and not isinstance(cfg, Mapping) and not dataclasses.is_dataclass(cfg):
        try:
            from omegaconf import DictConfig

            ok = isinstance(cfg, DictConfig)
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            ok = False
        if not ok:
            raise MiaError(f"expected a mapping for the LLM config, got {type(cfg).__name__}")
    return plain(cfg)


_LOCAL_CACHE: dict[tuple[Any, ...], Any] = {}
_LOCAL_LOCK = threading.Lock()


def resolve_model_path(model_path: str) -> Path:
    """``"embedded"`` -> the embedded default model folder (built once); else the path itself."""
    if model_path == "embedded":
        from mia.models.embedded import embedded_model_dir

        return Path(embedded_model_dir())
    return Path(model_path).expanduser()


def _shared_local(cfg: LLMConfig) -> Any:
    from mia.llm.local_backend import LocalChat

    path = resolve_model_path(str(cfg.model_path)).resolve()
    key = (
        str(path), cfg.device, cfg.dtype, cfg.max_batch_size, cfg.batch_wait_ms,
        cfg.prefix_cache_mb, cfg.repeat_stop,
    )  # fmt: skip
    with _LOCAL_LOCK:  # two roles resolving at once must not load the model twice
        chat = _LOCAL_CACHE.get(key)
        if chat is None:
            chat = LocalChat(
                path,
                device=cfg.device,
                dtype=cfg.dtype,
                max_batch_size=cfg.max_batch_size,
                batch_wait_ms=cfg.batch_wait_ms,
                prefix_cache_mb=cfg.prefix_cache_mb,
                repeat_stop=cfg.repeat_stop,
            )
            _LOCAL_CACHE[key] = chat
    return chat


def clear_local_cache() -> None:
    """Forget cached local models (tests; freeing memory between stages)."""
    with _LOCAL_LOCK:
        for chat in _LOCAL_CACHE.values():
            chat._engine.close()
        _LOCAL_CACHE.clear()


def build_backend(cfg: LLMConfig | Mapping[str, Any], name: str | None = None) -> ChatBackend:
    """A chat backend for one role config (``LLMConfig`` or a mapping of its fields)."""
    if not isinstance(cfg, LLMConfig):
        cfg = LLMConfig.from_mapping(_as_dict(cfg), where=f"llm.{name}" if name else "llm")
    else:
        cfg.validate()
    label = cfg.name or name
    defaults = cfg.sampling_params()
    if cfg.backend == "openai":
        from mia.llm.openai_backend import OpenAIChat

        return OpenAIChat(
            str(cfg.base_url),
            cfg.model,
            api_key_env=cfg.api_key_env,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            backoff=cfg.backoff,
            concurrency=cfg.concurrency,
            chat_template_kwargs=cfg.chat_template_kwargs,
            strip_think=cfg.strip_think,
            extra_body=cfg.extra_body,
            return_token_ids=cfg.return_token_ids,
            defaults=defaults,
            name=label,
        )
    if cfg.backend == "local":
        return _shared_local(cfg).with_options(
            name=label,
            defaults=defaults,
            chat_template_kwargs=cfg.chat_template_kwargs or {},
            strip_think=cfg.strip_think,
        )
    from mia.llm.scripted import ScriptedChat

    return ScriptedChat(list(cfg.replies or []), name=label or "scripted")


def role_configs(cfg: Any) -> dict[str, LLMConfig]:
    """``{role: LLMConfig}`` from an ``llm`` config with ``common`` and ``roles`` sections."""
    data = _as_dict(cfg)
    unknown = sorted(set(data) - {"common", "roles"})
    if unknown:
        raise MiaError(f"llm config: unknown section(s) {unknown} (expected 'common' and 'roles')")
    common = _as_dict(data.get("common"))
    roles = _as_dict(data.get("roles"))
    if not roles:
        raise MiaError("llm config: no roles defined (expected roles.manager/planner/...)")
    out = {}
    for role, override in roles.items():
        merged = {**common, **_as_dict(override)}
        if "sampling" in common and "sampling" in (override or {}):
            merged["sampling"] = {**common["sampling"], **override["sampling"]}
        out[role] = LLMConfig.from_mapping(merged, where=f"llm.roles.{role}")
    return out


def roles_from_config(cfg: Any) -> dict[str, ChatBackend]:
    """``{role: ChatBackend}`` for every role in an ``llm`` config (local models shared)."""
    return {role: build_backend(c, name=role) for role, c in role_configs(cfg).items()}
