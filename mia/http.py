"""Shared FastAPI pieces for every MIA service.

One place for: the error envelope ``{"error": {"code", "message"}}`` (4xx for bad input, never a
bare traceback), optional bearer-token auth, the cross-site guard (``Host`` and ``Origin``
checks, JSON-only bodies), the request limits (body size, JSON depth, header and body read
timeouts), ``GET /health``, and starting uvicorn on loopback (port 0 = ephemeral, the bound port
written to ``--port-file`` so tests and the demo can find it). docs/security.md lists every
limit with its default.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import hmac
import html
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mia.errors import MiaError
from mia.http_guard import (
    DEFAULT_MAX_BODY_BYTES,
    RequestRefused,
    ServiceLimits,
    body_media_type,
    check_content_type,
    check_json_body,
    check_origin,
    header_timeout_protocol,
    lone_surrogate,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServiceLimits", "lone_surrogate"]

log = logging.getLogger("mia.http")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    502: "upstream_error",
    503: "unavailable",
    504: "upstream_timeout",
    507: "insufficient_storage",
}


class ApiError(Exception):
    """Raise inside a route to answer ``status`` with the error envelope."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _STATUS_CODES.get(status, "error")


def error_response(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"code": code or _STATUS_CODES.get(status, "error"), "message": message}},
    )


# ----------------------------------------------------------------------------- browser sessions
#
# A browser cannot put a bearer token on a page load, so services with pages (memory_serve's
# inspector) exchange it once for a session cookie: the login form (``POST /login``, the token
# in the body, never in a URL) or ``GET <page>?token=T`` (for scripts; the answer redirects to
# the same URL without the token). The cookie holds an HMAC of the token, not the token; it is
# HttpOnly (page scripts cannot read it) and SameSite=Strict (other sites cannot make the
# browser send it), and a request authenticated by it that changes anything (not GET/HEAD) must
# also carry ``X-MIA-UI: 1``, a header a cross-site form cannot set.

BROWSER_HEADER = "x-mia-ui"
LOGIN_PATH = "/login"
# Pages may load only what the service itself serves: no CDN, no inline script.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body>
<h1>{title}</h1>
<p>This service needs its bearer token (the one given with <code>--token-file</code> or the
environment variable).</p>
<p id="login-error" style="color: #b00">{error}</p>
<form method="post" action="{action}">
<input type="hidden" name="next" value="{next}">
<label>Token <input id="login-token" type="password" name="token" autocomplete="off" autofocus
required></label>
<button id="login-submit" type="submit">Sign in</button>
</form></body></html>
"""


def session_cookie_name(port: int | None) -> str:
    """Cookies are shared by every port of a host: one name per service port."""
    return f"mia_session_{port or 0}"


def session_value(token: str) -> str:
    """The cookie's value: proof of the token without the token itself."""
    return hmac.new(token.encode(), b"mia-browser-session-v1", hashlib.sha256).hexdigest()


def login_page(title: str, next_path: str, error: str = "", status: int = 401) -> HTMLResponse:
    page = _LOGIN_PAGE.format(
        title=html.escape(title),
        error=html.escape(error),
        action=LOGIN_PATH,
        next=html.escape(next_path, quote=True),
    )
    return HTMLResponse(page, status_code=status, headers={"Content-Security-Policy": PAGE_CSP})


def _safe_next(value: str | None, default: str) -> str:
    """A local path to go back to after signing in (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    return value


def _signed_in(request: Request, target: str, token: str) -> Response:
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        session_cookie_name(request.url.port),
        session_value(token),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return resp


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


async def _read_body(request: Request, limits: ServiceLimits) -> bytes:
    """The request's body, read here (so the route gets it cached) within the size cap and the
    body timeout; b"" for a request without one."""
    length = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if length is None and not chunked:
        return b""
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise RequestRefused(400, "invalid Content-Length header") from None
        if declared > limits.max_body_bytes:
            raise RequestRefused(413, f"request body over {limits.max_body_bytes} bytes")
        if declared == 0:
            return b""

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise RequestRefused(413, f"request body over {limits.max_body_bytes} bytes")
        return bytes(body)

    try:
        body = await asyncio.wait_for(read(), limits.body_timeout_s)
    except TimeoutError:
        raise RequestRefused(
            408, f"the request body did not arrive within {limits.body_timeout_s:g} s"
        ) from None
    request._body = body  # starlette caches the body here for later reads
    return body


def create_app(
    title: str,
    *,
    token: str | None = None,
    max_body_bytes: int | None = None,
    limits: ServiceLimits | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
    version: str = "0.1.0",
    pages: tuple[str, ...] = (),
    binary_types: tuple[str, ...] = (),
) -> FastAPI:
    """A FastAPI app with MIA's envelope, auth, cross-site guard, limits and ``GET /health``.

    ``token``: when set, every route except ``/health`` needs ``Authorization: Bearer <token>``.
    ``limits``: body size, JSON depth, read timeouts and allowed hosts (:class:`ServiceLimits`);
    ``max_body_bytes`` overrides its body size. ``binary_types``: media types accepted as
    request bodies beside JSON (not checked as JSON).
    ``health``: extra fields for the health payload (called per request).
    ``pages``: path prefixes of browser pages; with a token they turn on browser sessions (see
    above): ``POST /login``, ``?token=`` on a page, the session cookie, and a sign-in form
    instead of a JSON 401 when a page is opened without one.
    """
    if token is not None and not token:
        # An empty token would silently disable auth: a configuration mistake, never intended.
        raise MiaError(f"{title}: the bearer token is empty; unset it to run without a token")
    app = FastAPI(title=title, version=version)
    app.state.token = token
    limits = limits or ServiceLimits()
    if max_body_bytes is not None:
        limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)
    app.state.limits = limits
    app.state.bind_host = None  # set by run_app / ServerThread: the Host check needs it
    _add_error_handlers(app)
    _add_guard(app, pages, binary_types)
    if pages:
        _add_login(app, pages)

    @app.get("/health")
    async def _health() -> dict[str, Any]:
        payload: dict[str, Any] = {"status": "ok", "service": title}
        if health is not None:
            payload.update(health())
        return payload

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as the envelope; an unhandled one as a 500 whose details stay in the log."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                return error_response(400, f"malformed JSON body: {err.get('msg')}", "bad_json")
        return error_response(422, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", app.title)
        # The exception's text may hold server paths or data: it goes to the log, not the client.
        return error_response(500, f"internal error ({type(exc).__name__}); see the service log")


def _is_page(pages: tuple[str, ...], path: str) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in pages)


def _authorize(app: FastAPI, request: Request, pages: tuple[str, ...]) -> Response | None:
    """None when the request may go on, else the answer: the bearer token, or (services with
    pages) the browser session cookie, ``?token=`` on a page, or the sign-in form."""
    token = app.state.token
    path = request.url.path
    if not token or path == "/health" or (pages and path == LOGIN_PATH):
        return None
    got = request.headers.get("authorization", "")
    if hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
        return None
    if not pages:
        return error_response(401, "missing or wrong bearer token")
    cookie = request.cookies.get(session_cookie_name(request.url.port), "")
    if cookie and hmac.compare_digest(cookie.encode(), session_value(token).encode()):
        if request.method not in ("GET", "HEAD") and request.headers.get(BROWSER_HEADER) != "1":
            return error_response(403, f"a browser session request needs {BROWSER_HEADER}: 1")
        return None
    page = request.method == "GET" and _is_page(pages, path)
    given = request.query_params.get("token")
    if given is not None and page:
        if hmac.compare_digest(given.encode(), token.encode()):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            return _signed_in(request, path + (f"?{urlencode(rest)}" if rest else ""), token)
        return login_page(app.title, path, "wrong token")
    if page:
        return login_page(app.title, path)
    return error_response(401, "missing or wrong bearer token")


def _add_guard(app: FastAPI, pages: tuple[str, ...], binary_types: tuple[str, ...]) -> None:
    """The middleware every request passes first: origin, auth, then the body's limits."""

    @app.middleware("http")
    async def _guard(request: Request, call_next):  # type: ignore[no-untyped-def]
        limits: ServiceLimits = app.state.limits
        method, headers = request.method, request.headers
        try:
            check_origin(headers, method, app.state.bind_host, limits.allowed_hosts)
            denied = _authorize(app, request, pages)
            if denied is not None:
                return denied
            body = await _read_body(request, limits)
            login = bool(pages) and request.url.path == LOGIN_PATH
            check_content_type(headers, method, bool(body), login, binary_types)
            json_body = bool(body) and not login and body_media_type(headers) not in binary_types
            if json_body and len(body) > 256 * 1024:
                # Big bodies are scanned off the event loop (other requests keep flowing).
                await asyncio.to_thread(check_json_body, body, limits.max_json_depth)
            elif json_body:
                check_json_body(body, limits.max_json_depth)
        except RequestRefused as refused:
            resp = error_response(refused.status, refused.message, refused.code)
            if refused.status in (408, 413):
                # The rest of the body may never come (or is not wanted): close the connection
                # instead of waiting to read it.
                resp.headers["connection"] = "close"
            return resp
        return await call_next(request)


def _add_login(app: FastAPI, pages: tuple[str, ...]) -> None:
    @app.post(LOGIN_PATH, include_in_schema=False)
    async def _login(request: Request) -> Response:
        """The sign-in form's target: a form body ``token=...&next=/path``."""
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        target = _safe_next((form.get("next") or [""])[0], pages[0])
        given = (form.get("token") or [""])[0].strip()
        token = app.state.token
        if not token:
            return RedirectResponse(target, status_code=303)
        if not hmac.compare_digest(given.encode(), token.encode()):
            return login_page(app.title, target, "wrong token")
        return _signed_in(request, target, token)


def add_server_args(parser: argparse.ArgumentParser, default_port: int, env_prefix: str) -> None:
    """``--host --port --port-file --token/--token-file --max-body-bytes`` with env fallbacks.

    The bearer token comes from ``--token-file PATH`` (first line of the file), ``--token T`` or
    ``{env_prefix}_TOKEN`` (never logged). ``--token`` shows in ``ps``, so it warns; an empty
    token from any source is refused (it would silently disable auth): a MiaError, which the
    service's CLI prints as one line before exiting with code 2.
    """
    env_token = f"{env_prefix}_TOKEN"
    parser.add_argument("--host", default=os.environ.get(f"{env_prefix}_HOST", "127.0.0.1"))
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get(f"{env_prefix}_PORT", default_port))
    )
    parser.add_argument(
        "--port-file", default=None, help="write the bound port here (for --port 0)"
    )
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument(
        "--token",
        # argparse also runs string defaults through ``type``: an empty env var is caught too.
        type=_nonempty_token(f"--token or {env_token}"),
        action=_VisibleTokenAction,
        default=os.environ.get(env_token),
        help=f"bearer token (visible in ps: prefer --token-file or {env_token})",
    )
    tokens.add_argument(
        "--token-file",
        dest="token",
        type=read_token_file,
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="read the bearer token from this file (its first line)",
    )
    defaults = ServiceLimits()
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    parser.add_argument(
        "--max-json-depth",
        type=int,
        default=defaults.max_json_depth,
        help="refuse JSON bodies nested deeper than this (422)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=defaults.header_timeout_s,
        metavar="S",
        help="close a connection whose request head takes longer than this",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=defaults.body_timeout_s,
        metavar="S",
        help="answer 408 when a request body takes longer than this",
    )
    parser.add_argument(
        "--allowed-hosts",
        default=os.environ.get(f"{env_prefix}_ALLOWED_HOSTS", ""),
        metavar="H1,H2",
        help="extra host names accepted in Host/Origin besides IP addresses, localhost and the "
        f"bind address ('*': any; env {env_prefix}_ALLOWED_HOSTS)",
    )


def server_limits(args: argparse.Namespace) -> ServiceLimits:
    """The :class:`ServiceLimits` given on the command line of :func:`add_server_args`."""
    hosts = tuple(h.strip().lower() for h in args.allowed_hosts.split(",") if h.strip())
    return ServiceLimits(
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        allowed_hosts=hosts,
    )


def _nonempty_token(source: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not value.strip():
            raise MiaError(
                f"empty bearer token ({source}): unset it to run without a token, or give one"
            )
        return value

    return check


class _VisibleTokenAction(argparse.Action):
    """``--token T``: works, but any local user can read it in ``ps``; say so once."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(
            f"{parser.prog}: warning: --token is visible to other users in `ps`; "
            "prefer --token-file PATH or the environment variable",
            file=sys.stderr,
            flush=True,
        )
        setattr(namespace, self.dest, values)


def read_token_file(path: str) -> str:
    """The bearer token in ``path``: its first line, surrounding whitespace removed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise MiaError(f"cannot read --token-file {path}: {reason}") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise MiaError(f"--token-file {path} is empty: it must hold the bearer token")
    return token


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listen now, before the port file is written: a client that reads the file connects into
    # the backlog instead of being refused while uvicorn is still starting.
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app: FastAPI, host: str) -> uvicorn.Config:
    """uvicorn's settings for ``app`` bound to ``host``: the Host check learns the bind
    address, and slow request heads are cut off (:class:`ServiceLimits`)."""
    app.state.bind_host = host
    limits: ServiceLimits = getattr(app.state, "limits", None) or ServiceLimits()
    protocol = header_timeout_protocol(limits.header_timeout_s)
    return uvicorn.Config(app, log_level="warning", access_log=False, http=protocol)


def run_app(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    port_file: str | None = None,
    limits: ServiceLimits | None = None,
) -> None:
    """Serve ``app`` until interrupted. With ``port=0`` an ephemeral port is chosen;
    ``limits`` (e.g. :func:`server_limits` of the command line) replaces the app's."""
    if limits is not None:
        app.state.limits = limits
    if host in ("0.0.0.0", "::", "") and not app.state.token:
        log.warning(
            "%s: listening on every interface without a bearer token: anyone on the network "
            "can use it (give --token-file)",
            app.title,
        )
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    if port_file:
        tmp = Path(f"{port_file}.tmp")
        tmp.write_text(str(bound))
        os.replace(tmp, port_file)
    log.info("%s listening on http://%s:%d", app.title, host, bound)
    print(f"{app.title} listening on http://{host}:{bound}", flush=True)
    server = uvicorn.Server(_uvicorn_config(app, host))
    server.run(sockets=[sock])


class ServerThread:
    """Run a real uvicorn server for ``app`` on an ephemeral loopback port in a thread.

    Used by tests and by in-process callers: ``with ServerThread(app) as url: ...``.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1") -> None:
        self.app = app
        self.host = host
        self.sock = bind_socket(host, 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(_uvicorn_config(app, host))
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server for {self.app.title} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for_port_file(
    path: str | os.PathLike[str], timeout: float = 60.0, proc: Any = None
) -> int:
    """Wait until a service started with ``--port-file`` has written its port."""
    path = Path(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text().strip()
            if text:
                return int(text)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service exited with code {proc.returncode} before listening")
        time.sleep(0.05)
    raise TimeoutError(f"no port written to {path} within {timeout}s")
