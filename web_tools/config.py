"""The web search gateway's config schema (``python -m web_tools serve --help-config``).

Every default lives here; a YAML file given with ``--config`` overrides them and explicit CLI
flags override both. The Serper key is deliberately not part of the config: it only ever comes
from the environment (``SERPER_KEY_ID``) so it never lands in a file, a repr or a log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.config import from_dict, load_dict, option
from mia.errors import MiaError
from web_tools.ssrf import AllowList

DEFAULT_SERPER_URL = "https://google.serper.dev/search"
DEFAULT_SERPER_IMAGES_URL = "https://google.serper.dev/images"
ENGINES = ("serper", "ddgs")
DEFAULT_TTL_S = 7 * 24 * 3600  # the reference's Redis CACHE_TTL (604800 s)


@dataclass
class WebToolsConfig:
    """The web search gateway (``python -m web_tools serve``). The Serper key is never part of
    it: it only comes from the environment (``SERPER_KEY_ID``)."""

    default_engine: str = option(
        "serper",
        "engine when a request names none: serper (needs SERPER_KEY_ID) or ddgs (keyless, "
        "needs the web extra; the reference's default)",
    )
    serper_url: str = option(
        DEFAULT_SERPER_URL, "Serper search endpoint (or env SERPER_URL / --serper-url)"
    )
    serper_images_url: str = option(
        DEFAULT_SERPER_IMAGES_URL, "Serper image search endpoint (/image_search, engine serper)"
    )
    ddgs_backend: str = option(
        "brave", "ddgs text backend(s), comma-separated (brave as the reference; auto = all)"
    )
    cache_path: str | None = option(
        None, 'SQLite cache; null = $MIA_HOME/web_tools/search_cache.sqlite; "none" = no cache'
    )
    ttl_s: float = option(DEFAULT_TTL_S, "cache lifetime in seconds (7 days, as the reference)")
    rate_limit_qps: float = option(
        10.0,
        "outgoing calls per second, all tools together (Serper, ddgs, page and image fetches; "
        "retries count); 0 = unlimited",
    )
    rate_limit_burst: int = option(10, "token bucket size of the rate limit")
    max_concurrency: int = option(8, "outgoing calls in flight at once, all tools together")
    timeout_s: float = option(15.0, "seconds per outgoing call (Serper, ddgs, a page, an image)")
    max_retries: int = option(3, "retries on timeouts, connection errors, 429 and 5xx")
    backoff_base_s: float = option(
        0.5, "first retry wait; doubles (capped), or Retry-After when Serper sends it"
    )
    backoff_max_s: float = option(8.0, "cap on one retry wait")
    retry_after_max_s: float = option(30.0, "cap on a Retry-After wait")
    include_answer_box: bool = option(True, "Serper answerBox as the first result")
    include_knowledge_graph: bool = option(
        True, "Serper knowledgeGraph as a result before the organic ones"
    )
    scrape_max_bytes: int = option(
        5 * 1024 * 1024, "/web_scrape: a page larger than this many bytes is refused (502)"
    )
    image_max_bytes: int = option(
        5 * 1024 * 1024, "/image_search: an image larger than this many bytes is dropped"
    )
    image_size: int = option(256, "/image_search: images are resized to this square (pixels)")
    user_agent: str = option(
        "Mozilla/5.0 (compatible; mia-web-tools/1.0)",
        "User-Agent header of page and image fetches",
    )
    fetch_allow_hosts: list[str] = option(
        [],
        "hosts that page and image fetches may reach although their address is not public "
        "(loopback, private, link-local, metadata... are refused otherwise): a host name "
        "(exact match of the URL's host; any address it resolves to), an IP address (any name "
        "resolving to it) or a CIDR range; a name or an address may end in :PORT "
        "([v6]:PORT) to open only that port (or --fetch-allow-host, repeated)",
    )

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
            (
                self.serper_images_url.startswith(("http://", "https://")),
                "serper_images_url must be http(s)",
            ),
            (
                self.default_engine in ENGINES,
                f"default_engine must be one of {', '.join(ENGINES)}",
            ),
            (bool(self.ddgs_backend.strip()), "ddgs_backend must not be empty"),
            (self.scrape_max_bytes >= 1, "scrape_max_bytes must be >= 1"),
            (self.image_max_bytes >= 1, "image_max_bytes must be >= 1"),
            (16 <= self.image_size <= 2048, "image_size must be in 16..2048"),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"web_tools config: {message}")
        try:
            AllowList(self.fetch_allow_hosts)
        except ValueError as err:
            raise MiaError(f"web_tools config: fetch_allow_hosts: {err}") from None
        return self


def load_config(path: str | Path | None = None, **overrides: Any) -> WebToolsConfig:
    """Defaults <- YAML file (or a name in configs/web_tools/) <- ``overrides`` whose value is
    not None (the command-line flags)."""
    data = load_dict(path, group="web_tools")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(WebToolsConfig, data, "web_tools config")
