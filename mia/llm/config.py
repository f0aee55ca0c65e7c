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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.llm.base import ChatBackend, SamplingParams
from mia.paths import config_dir

ROLES = ("manager", "planner", "executor", "judge")
BACKENDS = ("openai", "local", "scripted")
CONFIG_DIR = config_dir("llm")


def llm_config_path(name: str | Path) -> Path:
    """A YAML file, or a name in ``configs/llm/`` (``embedded`` -> ``configs/llm/embedded.yaml``)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    named = CONFIG_DIR / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
    if named.is_file():
        return named
    raise MiaError(f"llm config not found: {name} (also looked for {named})")


def load_llm_config(name: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An llm config (``common`` + ``roles``) as a plain dict: a mapping, a YAML file or a name
    in ``configs/llm/``."""
    if isinstance(name, Mapping):
        return dict(name)
    from omegaconf import OmegaConf

    path = llm_config_path(name)
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(data, dict):
        raise MiaError(f"llm config {path}: expected a mapping")
    return data


@dataclass
class LLMConfig:
    """One role's LLM. Defaults mirror ``configs/llm/embedded.yaml``."""

    backend: str = "local"
    name: str | None = None
    # openai
    base_url: str | None = None
    model: str = "qwen"
    api_key_env: str | None = None
    timeout: float = 600.0
    max_retries: int = 3
    backoff: float = 1.0
    concurrency: int = 16
    extra_body: dict[str, Any] | None = None
    return_token_ids: bool = True
    # shared by openai and local
    chat_template_kwargs: dict[str, Any] | None = None
    strip_think: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    # local ("embedded" = the embedded default model, built on first use)
    model_path: str | None = "embedded"
    device: str = "cpu"
    dtype: str = "auto"  # auto = bfloat16 where native, else float32 (mia.precision)
    max_batch_size: int = 8
    batch_wait_ms: float = 5.0
    # scripted (tests and dry runs)
    replies: list[str] | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "llm") -> LLMConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MiaError(f"{where}: unknown LLM config key(s) {unknown} (known: {sorted(known)})")
        cfg = cls(**dict(data))
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "llm") -> None:
        if self.backend not in BACKENDS:
            raise MiaError(f"{where}: backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise MiaError(f"{where}: the openai backend needs base_url")
        if self.backend == "local" and not self.model_path:
            raise MiaError(f"{where}: the local backend needs model_path (or 'embedded')")
        if self.backend == "scripted" and self.replies is None:
            raise MiaError(f"{where}: the scripted backend needs replies")
        sampling_fields = {f.name for f in dataclasses.fields(SamplingParams)}
        bad = sorted(set(self.sampling) - sampling_fields)
        if bad:
            raise MiaError(
                f"{where}: unknown sampling key(s) {bad} (known: {sorted(sampling_fields)})"
            )

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.sampling)


def _as_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict from a dict, a dataclass or an OmegaConf node (interpolations resolved)."""
    if cfg is None:
        return {}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return dict(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(cfg, Mapping):
        return {k: _as_dict(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}
    raise MiaError(f"expected a mapping for the LLM config, got {type(cfg).__name__}")


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
    key = (str(path), cfg.device, cfg.dtype, cfg.max_batch_size, cfg.batch_wait_ms)
    with _LOCAL_LOCK:  # two roles resolving at once must not load the model twice
        chat = _LOCAL_CACHE.get(key)
        if chat is None:
            chat = LocalChat(
                path,
                device=cfg.device,
                dtype=cfg.dtype,
                max_batch_size=cfg.max_batch_size,
                batch_wait_ms=cfg.batch_wait_ms,
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
