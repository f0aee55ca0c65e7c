"""Tunables of the web search gateway.

The dataclass defaults mirror ``configs/web_tools/serve.yaml``; a YAML file given with
``--config`` overrides them and explicit CLI flags override both. The Serper key is deliberately
not part of the config: it only ever comes from the environment (``SERPER_KEY_ID``) so it never
lands in a file, a repr or a log line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.errors import MiaError

DEFAULT_SERPER_URL = "https://google.serper.dev/search"
DEFAULT_TTL_S = 7 * 24 * 3600  # the reference's Redis CACHE_TTL (604800 s)


@dataclass
class WebToolsConfig:
    serper_url: str = DEFAULT_SERPER_URL
    # None: $MIA_HOME/web_tools/search_cache.sqlite; "none": no cache at all.
    cache_path: str | None = None
    ttl_s: float = DEFAULT_TTL_S
    # Outgoing Serper calls (every retry counts): token bucket + a cap on calls in flight.
    rate_limit_qps: float = 10.0
    rate_limit_burst: int = 10
    max_concurrency: int = 8
    timeout_s: float = 15.0
    max_retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 30.0
    include_answer_box: bool = True
    include_knowledge_graph: bool = True

    def validate(self) -> WebToolsConfig:
        checks = [
            (self.ttl_s >= 0, "ttl_s must be >= 0"),
            (self.rate_limit_qps >= 0, "rate_limit_qps must be >= 0 (0 = unlimited)"),
            (self.rate_limit_burst >= 1, "rate_limit_burst must be >= 1"),
            (self.max_concurrency >= 1, "max_concurrency must be >= 1"),
            (self.timeout_s > 0, "timeout_s must be > 0"),
            (self.max_retries >= 0, "max_retries must be >= 0"),
            (self.backoff_base_s >= 0 and self.backoff_max_s >= 0, "backoff must be >= 0"),
            (self.retry_after_max_s >= 0, "retry_after_max_s must be >= 0"),
            (self.serper_url.startswith(("http://", "https://")), "serper_url must be http(s)"),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"web_tools config: {message}")
        return self


def load_config(path: str | Path | None = None, **overrides: Any) -> WebToolsConfig:
    """Defaults <- YAML file (if given) <- ``overrides`` whose value is not None."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_yaml(Path(path)))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(WebToolsConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise MiaError(f"web_tools config: unknown keys {unknown} (known: {sorted(known)})")
    return WebToolsConfig(**values).validate()


def _read_yaml(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    if not path.is_file():
        raise MiaError(f"web_tools config file not found: {path}")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # omegaconf raises several types for bad YAML
        raise MiaError(f"cannot read web_tools config {path}: {err}") from None
    if not isinstance(data, dict):
        raise MiaError(f"web_tools config {path} must be a mapping")
    return {str(k): v for k, v in data.items()}
