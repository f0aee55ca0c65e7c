"""What every MIA service checks before a route runs: where a request comes from, and how big,
deep and slow it may be.

- **Cross-site requests.** A web page the user opens can make the browser send requests to a
  service on 127.0.0.1. Three checks close that door without a token: the ``Host`` header must
  name this service (an IP address, ``localhost``, the bind address or an allowed host; a DNS
  rebinding attack carries the attacker's domain), a request with an ``Origin`` must come from
  the same origin (or an allowed host), and a request with a body must declare
  ``application/json`` (a cross-site form can only send form or text bodies).
- **Limits.** Bodies are capped in bytes and read within a timeout; JSON bodies must be UTF-8
  (RFC 8259), nested at most ``max_json_depth`` deep (checked before parsing), and hold no lone
  UTF-16 surrogate; request headers must arrive within a timeout (uvicorn has none).

:class:`ServiceLimits` holds every knob with its default; docs/security.md has the table.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
# Methods whose requests may change state: their bodies must be JSON.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ServiceLimits:
    """The request limits and cross-site settings of one service (docs/security.md)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = 64  # arrays/objects nested deeper are refused (422) before parsing
    header_timeout_s: float = 10.0  # a connection must send a whole request head within this
    body_timeout_s: float = 30.0  # ... and then its whole body within this (408)
    # Extra names (or ``*`` for any) accepted in ``Host`` and ``Origin``, beside IP addresses,
    # ``localhost`` and the bind address.
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)


class RequestRefused(Exception):
    """A request refused at the door: ``status`` and a message for the error envelope."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


# ------------------------------------------------------------------------------ Host and Origin


def _hostname(netloc: str) -> str:
    """``host[:port]`` or ``[v6]:port`` -> the lower-case host name ('' when malformed)."""
    try:
        return (urlsplit(f"//{netloc}").hostname or "").lower()
    except ValueError:
        return ""


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def local_names() -> frozenset[str]:
    """This machine's own names, accepted as ``Host`` when a service binds every interface."""
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(n for n in names if n)


def host_allowed(name: str, bind_host: str | None, allowed: tuple[str, ...]) -> bool:
    """May a request whose ``Host`` names ``name`` reach a service bound to ``bind_host``?

    An IP address is always fine: DNS rebinding needs a domain name, and a page on another IP
    is another origin. Names must be ``localhost`` (or under ``.localhost``), the bind address,
    an allowed host, or, for a wildcard bind, this machine's own name.
    """
    if not name:
        return False
    if "*" in allowed or name in allowed or _is_ip(name):
        return True
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    if bind_host is not None and name == bind_host.lower():
        return True
    return (bind_host or "") in WILDCARD_HOSTS and name in local_names()


def check_origin(
    headers: Any, method: str, bind_host: str | None, allowed: tuple[str, ...]
) -> None:
    """Raise :class:`RequestRefused` for a foreign ``Host`` or a cross-site request."""
    host = headers.get("host", "")
    if not host_allowed(_hostname(host), bind_host, allowed):
        raise RequestRefused(400, "the Host header does not name this service", "bad_host")
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin) if origin != "null" else None
        same = parts is not None and parts.netloc.lower() == host.lower()
        named = parts is not None and ("*" in allowed or (parts.hostname or "") in allowed)
        if not (same or named):
            raise RequestRefused(403, "cross-origin requests are refused", "cross_origin")
    # A browser marks what another site makes it send; following a link (a GET navigation) to
    # a page is fine, anything else is not.
    if headers.get("sec-fetch-site") == "cross-site" and not (
        method in ("GET", "HEAD") and headers.get("sec-fetch-mode") == "navigate"
    ):
        raise RequestRefused(403, "cross-site requests are refused", "cross_origin")


def body_media_type(headers: Any) -> str:
    """The body's media type, lower case, without parameters ('' when not declared)."""
    return (headers.get("content-type") or "").split(";", 1)[0].strip().lower()


def is_json_type(media: str) -> bool:
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def check_content_type(
    headers: Any, method: str, has_body: bool, exempt: bool, binary_types: tuple[str, ...] = ()
) -> None:
    """A request that may change state and carries a body must declare JSON, or one of the
    service's ``binary_types`` (none a browser form can send), else 415."""
    if method not in WRITE_METHODS or exempt:
        return
    if headers.get("content-type") is None and not has_body:
        return
    media = body_media_type(headers)
    if not is_json_type(media) and media not in binary_types:
        allowed = " or ".join(("application/json", *binary_types))
        raise RequestRefused(415, f"request bodies must be {allowed}", "unsupported_media_type")


# ------------------------------------------------------------------------------ JSON bodies

# Strings (with their escapes) are removed before brackets are counted: "[" inside a string
# is text, not nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a UTF-8 JSON text nest (0 for a scalar).

    Counted in C-speed passes (a regex, ``bytes.translate``, numpy), never by parsing: the
    parser itself is what deep nesting would exhaust.
    """
    brackets = _JSON_STRING.sub(b"", body).translate(None, _BRACKETS)
    if not brackets:
        return 0
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)].astype(np.int32)
    return int(np.cumsum(steps).max())


def check_json_body(body: bytes, max_depth: int) -> None:
    """Refuse a JSON body that is not UTF-8, nests too deep or holds a lone surrogate."""
    if not body:
        return
    raw_surrogate = not _is_utf8(body)
    depth = json_depth(body)
    if depth > max_depth:
        raise RequestRefused(
            422, f"JSON nested {depth} deep; at most {max_depth} levels", "too_deep"
        )
    where = lone_surrogate(body) or ("body" if raw_surrogate else None)
    if where is not None:
        raise RequestRefused(
            422, f"{where}: text holds a lone UTF-16 surrogate (not valid Unicode)"
        )


def _is_utf8(body: bytes) -> bool:
    """True for UTF-8; False for UTF-8 but for encoded lone surrogates; else refused.

    UTF-16 and UTF-32 are refused even where their bytes happen to be valid UTF-8 (ASCII text
    with NUL bytes between): ``json.loads`` would decode them as what they declare.
    """
    encoding = json.detect_encoding(body)
    if encoding.startswith(("utf-16", "utf-32")):
        raise RequestRefused(
            415, f"JSON bodies must be UTF-8, not {encoding.upper()}", "unsupported_media_type"
        )
    try:
        body.decode("utf-8")
        return True
    except UnicodeDecodeError:
        pass
    try:
        body.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise RequestRefused(400, "the body is not valid UTF-8", "bad_json") from None
    return False


# A JSON string escape of a UTF-16 surrogate, or the UTF-8-style bytes of one (json.loads
# decodes bytes with "surrogatepass", so both reach Python as a lone surrogate).
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def lone_surrogate(body: bytes) -> str | None:
    """Where a UTF-8 JSON body holds a string with a lone surrogate (``"\\ud800"``), else None.

    Such strings cannot be encoded as UTF-8, so SQLite, files and LLM requests would fail deep
    inside a route (a 500); they are refused at the door instead. Paired surrogates (an escaped
    emoji) are fine. The cheap byte scan keeps ordinary bodies from being parsed twice; callers
    bound the body's depth first, so the parse cannot exhaust the stack.
    """
    if not _SURROGATE_HINT.search(body):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the route answers 400/422 itself
    return _find_surrogate(data, "body")


def _find_surrogate(value: Any, where: str) -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        # The location is echoed in the error: a bad key is shown escaped, not as a surrogate.
        name = key.encode("utf-8", "backslashreplace").decode() if isinstance(key, str) else key
        here = f"{where}.{name}" if where != "body" else str(name)
        if isinstance(key, str) and _find_surrogate(key, here) is not None:
            return here
        found = _find_surrogate(item, here)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------------------------ slow clients


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request head is not complete
    ``timeout_s`` after its first byte (uvicorn alone waits forever: slowloris)."""

    class HeaderTimeoutH11(H11Protocol):
        _head_timer: Any = None

        def data_received(self, data: bytes) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout_s, self._head_timed_out)
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._stop_head_timer()  # a whole request head arrived

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not (
                self.transport.is_closing()
            ):
                self.transport.close()

    return HeaderTimeoutH11
