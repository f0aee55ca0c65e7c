"""Fetching pages (``/web_scrape``) and images (``/image_search``) from arbitrary web servers.

Only http and https (the request model refuses other schemes, and httpx refuses to follow a
redirect anywhere else), at most ``max_redirects`` redirects, a byte cap enforced while
streaming (a server that lies about Content-Length still cannot make us read more), and the
shared retry policy (timeouts, connection errors, 429 and 5xx are retried; other 4xx are not).
The client comes from :func:`web_tools.ssrf.guarded_client`: addresses that are not public are
refused at connect time. Every failure to reach a host (a refused address, DNS, a refused
connection, a timeout, TLS) answers the same :data:`UNREACHABLE` message, so the answers
cannot be used to map the network; the cause goes to the log.
Extraction uses trafilatura (main text as Markdown, boilerplate removed), imported lazily.
"""

from __future__ import annotations

import base64
import contextlib
import io
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from web_tools.retry import Upstream, UpstreamError
from web_tools.ssrf import BlockedAddress

log = logging.getLogger("web_tools.fetch")

HTML_TYPES = ("text/html", "application/xhtml+xml")
MAX_IMAGE_PIXELS = 40_000_000  # refuse decompression bombs before decoding
UNREACHABLE = "could not fetch the {what}"
EXTRACT_HINT = "/web_scrape needs trafilatura: pip install 'mia[web]' (or pip install trafilatura)"


@dataclass
class Fetched:
    url: str  # after redirects
    content_type: str  # media type only, lower case ("" when the server sent none)
    charset: str | None
    body: bytes


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


async def fetch(
    http: httpx.AsyncClient,
    upstream: Upstream,
    url: str,
    *,
    max_bytes: int,
    timeout_s: float,
    what: str = "page",
) -> Fetched:
    """GET ``url`` (redirects followed) -> its bytes, or an :class:`UpstreamError`."""

    async def attempt() -> Fetched:
        try:
            async with http.stream("GET", url, follow_redirects=True, timeout=timeout_s) as resp:
                status = resp.status_code
                if status == 429 or status >= 500:
                    raise UpstreamError(
                        502, "upstream_error", f"{what} {url} answered HTTP {status}",
                        retryable=True,
                    )  # fmt: skip
                if status >= 300:
                    raise UpstreamError(
                        502, "upstream_error", f"{what} {url} answered HTTP {status}"
                    )
                declared = resp.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise _too_large(what, url, max_bytes)
                chunks, total = [], 0
                async for chunk in resp.aiter_bytes():
                    total += len(chunk)
                    if total > max_bytes:
                        raise _too_large(what, url, max_bytes)
                    chunks.append(chunk)
                media, _, params = resp.headers.get("content-type", "").partition(";")
                charset = None
                for param in params.split(";"):
                    name, _, value = param.strip().partition("=")
                    if name.lower() == "charset" and value:
                        charset = value.strip("\"' ")
                return Fetched(str(resp.url), media.strip().lower(), charset, b"".join(chunks))
        except httpx.UnsupportedProtocol as err:
            raise UpstreamError(
                502, "upstream_error", f"{what} {url} redirected to a URL that is not http(s): {err}"
            ) from None  # fmt: skip
        except httpx.TooManyRedirects:
            raise UpstreamError(
                502, "upstream_error", f"{what} {url}: too many redirects"
            ) from None
        except httpx.HTTPError as err:
            raise _unreachable(what, url, err) from None

    return await upstream.run("fetch", attempt)


def _unreachable(what: str, url: str, err: httpx.HTTPError) -> UpstreamError:
    """The one answer for a host that could not be reached, whatever the cause: distinct
    messages (or status codes) would tell a closed port from an open one or a refused address
    from a live one. A refused address is final; transport failures are retried."""
    blocked = isinstance(err.__cause__, BlockedAddress)
    retryable = isinstance(err, httpx.TransportError) and not blocked
    log.info("%s %s %s: %s: %s", what, url, "refused" if blocked else "unreachable",
             type(err).__name__, err)  # fmt: skip
    return UpstreamError(
        502, "upstream_error", UNREACHABLE.format(what=what), retryable=retryable, opaque=True
    )


def _too_large(what: str, url: str, max_bytes: int) -> UpstreamError:
    return UpstreamError(
        502, "upstream_too_large", f"{what} {url} is larger than the {_size(max_bytes)} cap"
    )


def is_html(fetched: Fetched) -> bool:
    if fetched.content_type in HTML_TYPES:
        return True
    if fetched.content_type:  # a declared type that is not HTML
        return False
    head = fetched.body[:1024].lstrip().lower()  # undeclared: sniff, as browsers do
    return head.startswith((b"<!doctype html", b"<html"))


def extract_markdown(fetched: Fetched) -> dict[str, Any]:
    """Main content of an HTML page as Markdown (trafilatura), plus its title. CPU-bound: run
    it in a worker thread."""
    try:
        import trafilatura
    except ImportError:
        raise UpstreamError(503, "unavailable", EXTRACT_HINT) from None
    html: str | bytes = fetched.body
    if fetched.charset:
        # An unknown charset name: let trafilatura guess from the bytes.
        with contextlib.suppress(LookupError):
            html = fetched.body.decode(fetched.charset, errors="replace")
    markdown = trafilatura.extract(
        html,
        url=fetched.url,
        output_format="markdown",
        include_comments=False,
        include_links=False,
        with_metadata=False,
        favor_recall=True,
    )
    meta = trafilatura.extract_metadata(html, default_url=fetched.url)
    return {"title": (meta.title if meta and meta.title else "") or "", "markdown": markdown or ""}


def encode_image(data: bytes, size: int) -> tuple[str, int, int] | None:
    """Image bytes -> (base64 JPEG of ``size`` x ``size``, original width, height); None when
    the bytes are not an image we can decode (the reference sends 256x256)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                return None
            rgb = img.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=90)
    return base64.b64encode(out.getvalue()).decode("ascii"), width, height
