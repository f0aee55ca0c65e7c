"""Live web_tools gateways for the web_tools tests: settings that make retries quick, and
httpx clients on apps served on loopback ports."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from mia.http import ServerThread


def quick_settings(tmp_path: Path) -> dict[str, Any]:
    """WebToolsConfig keys of a test gateway: its cache under ``tmp_path``, no rate limit,
    5 s calls and millisecond backoff between retries."""
    return {
        "cache_path": str(tmp_path / "cache.sqlite"),
        "rate_limit_qps": 0.0,
        "timeout_s": 5.0,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.01,
    }


@contextlib.contextmanager
def live_clients(timeout: float) -> Iterator[Callable[[Any], httpx.Client]]:
    """Yields ``open(app)``: serve ``app`` on a loopback port and return an httpx client on it
    (``timeout`` seconds per request). Every client and server opened is closed at the end."""
    threads: list[ServerThread] = []
    clients: list[httpx.Client] = []

    def open_app(app: Any) -> httpx.Client:
        thread = ServerThread(app)
        threads.append(thread)
        client = httpx.Client(base_url=thread.start(), timeout=timeout)
        clients.append(client)
        return client

    try:
        yield open_app
    finally:
        for client in clients:
            client.close()
        for thread in threads:
            thread.stop()
