"""web_tools' guard against server-side request forgery: ``GET /web_scrape`` and the image
fetcher of ``GET /image_search`` must not reach loopback, private, link-local or metadata
addresses, however the URL spells them or wherever a redirect points, and every failure to
reach a host answers the same generic error (no port scanning through the messages).

Real services on loopback: the gateway, a "secret" admin server that must never be reached,
and a "public" server (on loopback too, so it is made public with the allow-list, port only)
that redirects wherever it is told."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from PIL import Image

from mia.errors import MiaError
from mia.http import ServerThread
from web_tools.config import WebToolsConfig, load_config
from web_tools.ddgs_engine import DdgsCall
from web_tools.server import build_app
from web_tools.ssrf import (
    AllowList,
    AllowRule,
    BlockedAddress,
    GuardedBackend,
    parse_allow_rule,
    refusal,
)

SECRET = "TOP-SECRET-ADMIN-CREDENTIALS-7f3a"
GENERIC = {"error": {"code": "upstream_error", "message": "could not fetch the page"}}
PAGE = "<html><head><title>Hello</title></head><body><article><p>{}</p></article></body></html>"


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), (0, 0, 255)).save(buf, format="PNG")
    return buf.getvalue()


def secret_app(hits: Counter[str]) -> FastAPI:
    """An internal admin service: every request to it is counted (the tests want zero)."""
    app = FastAPI(title="secret")

    @app.middleware("http")
    async def count(request: Request, call_next):  # type: ignore[no-untyped-def]
        hits[request.url.path] += 1
        return await call_next(request)

    @app.get("/admin")
    async def admin() -> Response:
        return Response(PAGE.format(f"The admin password is {SECRET}."), media_type="text/html")

    @app.get("/img.png")
    async def image() -> Response:
        return Response(png(), media_type="image/png")

    return app


def public_app() -> FastAPI:
    app = FastAPI(title="public")

    @app.get("/page")
    async def page() -> Response:
        text = "A public page about rivers, bridges and the towns along their banks."
        return Response(PAGE.format(text), media_type="text/html")

    @app.get("/redirect")
    async def redirect(to: str) -> Response:
        return RedirectResponse(to, status_code=302)

    @app.get("/slow")
    async def slow() -> Response:
        await asyncio.sleep(3)
        return Response(PAGE.format("late"), media_type="text/html")

    @app.get("/img.png")
    async def image() -> Response:
        return Response(png(), media_type="image/png")

    return app


@pytest.fixture(scope="module")
def secret() -> Iterator[tuple[Counter[str], int]]:
    hits: Counter[str] = Counter()
    thread = ServerThread(secret_app(hits))
    with thread:
        yield hits, thread.port


@pytest.fixture(scope="module")
def public() -> Iterator[int]:
    thread = ServerThread(public_app())
    with thread:
        yield thread.port


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


Gateway = Callable[..., httpx.Client]


@pytest.fixture
def gateway(public: int) -> Iterator[Gateway]:
    """Starts a gateway whose allow-list holds the public server's port plus ``allow``."""
    with contextlib.ExitStack() as stack:

        def start(
            *, allow: tuple[str, ...] = (), ddgs: DdgsCall | None = None, **overrides: Any
        ) -> httpx.Client:
            settings = {
                "cache_path": "none",
                "rate_limit_qps": 0.0,
                "timeout_s": 5.0,
                "max_retries": 1,
                "backoff_base_s": 0.001,
                "backoff_max_s": 0.01,
                "fetch_allow_hosts": [f"127.0.0.1:{public}", *allow],
                **overrides,
            }
            config = WebToolsConfig(**settings)
            url = stack.enter_context(ServerThread(build_app(config, ddgs_call=ddgs)))
            return stack.enter_context(httpx.Client(base_url=url, timeout=60))

        yield start


def scrape(client: httpx.Client, url: str) -> httpx.Response:
    return client.get("/web_scrape", params={"url": url})


REFUSED = [
    "http://127.0.0.1:{secret}/admin",
    "http://localhost:{secret}/admin",
    "http://LOCALHOST:{secret}/admin",
    "http://127.1:{secret}/admin",
    "http://2130706433:{secret}/admin",
    "http://0x7f.1:{secret}/admin",
    "http://0.0.0.0:{secret}/admin",
    "http://[::ffff:127.0.0.1]:{secret}/admin",
    "http://[::1]:{secret}/admin",
    "https://127.0.0.1:{secret}/admin",
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    # A "public" host (allow-listed by port) redirecting inside:
    "http://127.0.0.1:{public}/redirect?to=http://127.0.0.1:{secret}/admin",
    "http://127.0.0.1:{public}/redirect?to=http://localhost:{secret}/admin",
    "http://127.0.0.1:{public}/redirect?to=http://169.254.169.254/latest/meta-data/",
]


@pytest.mark.parametrize("template", REFUSED)
def test_internal_targets_get_the_generic_answer_and_no_connection(
    template: str,
    gateway: Gateway,
    secret: tuple[Counter[str], int],
    public: int,
    caplog: pytest.LogCaptureFixture,
):
    hits, port = secret
    hits.clear()
    caplog.set_level(logging.INFO, logger="web_tools.fetch")
    client = gateway()
    resp = scrape(client, template.format(secret=port, public=public))
    assert (resp.status_code, resp.json()) == (502, GENERIC)
    assert SECRET not in resp.text and not hits
    # Refused by the guard before connecting (not a timeout, not a refused connection).
    assert any(" refused: " in r.getMessage() for r in caplog.records), caplog.text


def test_unreachable_answers_alike_whatever_the_cause(
    gateway: Gateway, secret: tuple[Counter[str], int], public: int
):
    """A refused address, an open and a closed internal port, a closed allow-listed port (a
    real refused connection, retried), a name that does not resolve and a timeout: one answer."""
    hits, port = secret
    hits.clear()
    closed = closed_port()
    client = gateway(allow=(f"127.0.0.1:{closed}",), timeout_s=0.5)
    urls = [
        f"http://127.0.0.1:{port}/admin",  # open, internal
        f"http://127.0.0.1:{closed_port()}/admin",  # closed, internal
        f"http://127.0.0.1:{closed}/admin",  # closed, allow-listed: the connection is refused
        "http://no-such-host.invalid/",  # DNS failure
        f"http://127.0.0.1:{public}/slow",  # read timeout
    ]
    answers = {url: scrape(client, url) for url in urls}
    for url, resp in answers.items():
        assert (resp.status_code, resp.json()) == (502, GENERIC), url
    assert len({(r.status_code, r.content) for r in answers.values()}) == 1
    assert not hits


def test_image_fetcher_is_guarded_too(
    gateway: Gateway, secret: tuple[Counter[str], int], public: int
):
    hits, port = secret
    hits.clear()
    inside = f"http://127.0.0.1:{port}/img.png"
    images = [inside, f"http://127.0.0.1:{public}/redirect?to={inside}",
              "http://169.254.169.254/img.png", f"http://127.0.0.1:{public}/img.png"]  # fmt: skip

    def ddgs(kind: str, query: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"title": f"image {i}", "image": url, "url": "https://p.example/"}
                for i, url in enumerate(images)]  # fmt: skip

    client = gateway(ddgs=ddgs)
    resp = client.get("/image_search", params={"q": "x", "engine": "ddgs", "max_results": 4})
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    assert result["stat"] == {"found": 4, "returned": 1}
    assert [r["image_url"] for r in result["results"]] == [images[-1]]
    assert not hits


def test_allow_list_reopens_named_hosts(gateway: Gateway, secret: tuple[Counter[str], int]):
    hits, port = secret
    hits.clear()
    by_port = gateway(allow=(f"127.0.0.1:{port}",))
    resp = scrape(by_port, f"http://127.0.0.1:{port}/admin")
    assert resp.status_code == 200 and SECRET in resp.json()["result"]["markdown_content"]
    # An address entry covers every spelling that resolves to it.
    assert scrape(by_port, f"http://127.1:{port}/admin").status_code == 200
    # A name entry covers that name only (whatever it resolves to), not the bare address.
    by_name = gateway(allow=("localhost",))
    assert scrape(by_name, f"http://localhost:{port}/admin").status_code == 200
    assert scrape(by_name, f"http://127.0.0.1:{port}/admin").json() == GENERIC
    by_range = gateway(allow=("127.0.0.0/8",))
    assert scrape(by_range, f"http://0x7f.1:{port}/admin").status_code == 200
    assert scrape(by_range, "http://169.254.169.254/").json() == GENERIC
    assert hits["/admin"] == 4


# --- the network backend, without the service --------------------------------------------------


class RecordingBackend(httpcore.AsyncNetworkBackend):
    """Stands in for the real connections: records where the guard connects."""

    def __init__(self) -> None:
        self.connects: list[tuple[str, int]] = []

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any):  # type: ignore[override]
        self.connects.append((host, port))
        return httpcore.AsyncMockStream([])

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def connect(backend: GuardedBackend, host: str, port: int = 80) -> None:
    asyncio.run(backend.connect_tcp(host, port, timeout=1.0))


@pytest.mark.parametrize("host", ["169.254.169.254", "fd00:ec2::254", "127.1", "0.0.0.0"])
def test_refused_addresses_are_never_connected(host: str):
    inner = RecordingBackend()
    with pytest.raises(BlockedAddress):
        connect(GuardedBackend(AllowList(), inner), host)
    assert inner.connects == []


def test_connects_to_the_checked_address_not_the_name():
    """One resolution per connection; the connection goes to the address that was checked,
    so a second DNS answer (rebinding) is never asked for. An answer that mixes a public and
    a private address is refused as a whole."""
    answers = {"public.example": ["93.184.215.14"], "rebind.example": ["93.184.215.14", "10.0.0.1"]}
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[host]

    inner = RecordingBackend()
    backend = GuardedBackend(AllowList(), inner, resolve)
    connect(backend, "public.example", 443)
    assert (asked, inner.connects) == (["public.example"], [("93.184.215.14", 443)])
    with pytest.raises(BlockedAddress, match="10.0.0.1"):
        connect(backend, "rebind.example")
    assert len(inner.connects) == 1


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.255.255.254", "10.1.2.3", "172.16.0.1", "192.168.1.1",
        "169.254.169.254", "169.254.170.2", "169.254.1.1", "100.64.0.1", "100.100.100.200",
        "168.63.129.16", "0.0.0.0", "0.1.2.3", "224.0.0.1", "239.255.255.250",
        "255.255.255.255", "240.0.0.1", "192.0.0.192", "192.0.2.1", "198.18.0.1",
        "::1", "::", "fe80::1", "fe80::1%eth0", "fc00::1", "fd00:ec2::254", "ff02::1",
        "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:100.64.0.1",
        "::127.0.0.1", "::8.8.8.8", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::1",
        "2002:7f00:1::", "2002:a9fe:a9fe::", "2001:db8::1", "100::1", "fec0::1",
    ],
)  # fmt: skip
def test_refused_address_table(address: str):
    assert refusal(address) is not None


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.8.8",
     "64:ff9b::808:808", "2002:808:808::"],
)  # fmt: skip
def test_public_address_table(address: str):
    assert refusal(address) is None


def test_refusal_reasons():
    assert refusal("169.254.169.254") == "cloud metadata endpoint"
    assert refusal("::ffff:127.0.0.1") == "loopback (as 127.0.0.1)"
    assert refusal("64:ff9b::a00:1") == "private (as 10.0.0.1)"
    assert refusal("100.64.0.1") == "shared address space"


def test_allow_rules_parse_and_match():
    assert parse_allow_rule(" Intranet.Example. ") == AllowRule(name="intranet.example")
    assert parse_allow_rule("10.0.0.5:8080").port == 8080
    assert parse_allow_rule("[::1]:8080").port == 8080
    assert str(parse_allow_rule("fd00::/8").network) == "fd00::/8"
    for bad in ["", "a b", "10.0.0.0/33", "host:0", "host:x", "[::1]8080", "10.0.0.1/8"]:
        with pytest.raises(ValueError):
            parse_allow_rule(bad)
    allow = AllowList(["intranet.example", "10.0.0.5:8080", "192.168.0.0/16"])
    assert allow.allows("INTRANET.example.", 443, ip_address("10.9.9.9"))
    assert allow.allows("anything", 8080, ip_address("10.0.0.5"))
    assert allow.allows("x", 8080, ip_address("::ffff:10.0.0.5"))
    assert not allow.allows("anything", 8081, ip_address("10.0.0.5"))
    assert allow.allows("x", 1, ip_address("192.168.3.4"))
    assert not allow.allows("other.example", 443, ip_address("10.9.9.9"))


def test_allow_list_config_is_checked():
    assert WebToolsConfig().fetch_allow_hosts == []
    assert load_config(None, fetch_allow_hosts=["localhost:8080"]).fetch_allow_hosts == [
        "localhost:8080"
    ]
    with pytest.raises(MiaError, match="fetch_allow_hosts: 'not a host!' is not a host name"):
        load_config(None, fetch_allow_hosts=["not a host!"])


def test_cli_flag_feeds_the_allow_list(tmp_path: Path):
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MIA_HOME": str(tmp_path), "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "web_tools", "serve", "--port", "0", "--cache", "none"]
    bad = subprocess.run(
        [*cmd, "--fetch-allow-host", "localhost:8080", "--fetch-allow-host", "bad host"],
        env=env, cwd=repo, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "web_tools: error: web_tools config: fetch_allow_hosts: 'bad host' is not a host name, "
        "IP address or CIDR range"
    )
