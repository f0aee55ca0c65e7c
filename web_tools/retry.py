"""Retries, rate limit and concurrency cap shared by every outgoing call of the gateway.

Serper, ddgs, page fetches (``/web_scrape``) and image downloads (``/image_search``) all go
through one :class:`Upstream`: one token bucket (``rate_limit_qps``), one concurrency cap
(``max_concurrency``) and one retry policy, so the knobs mean the same thing for every tool.
An attempt raises :class:`UpstreamError`; ``retryable`` ones (timeouts, connection errors, 429,
5xx) are tried again after a backoff or the upstream's ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from web_tools.ratelimit import TokenBucket

log = logging.getLogger("web_tools.retry")

T = TypeVar("T")


class UpstreamError(Exception):
    """A failed upstream call, already mapped to the status and error code we answer with.
    ``opaque``: the message is deliberately generic and is answered word for word (no attempt
    count appended: it would tell a refused address, never retried, from a refused connection)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        opaque: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.opaque = opaque


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_delay(
    attempt: int,
    retry_after: float | None,
    *,
    base: float,
    cap: float,
    retry_after_cap: float,
) -> float:
    """Wait before retry number ``attempt + 1``: Retry-After when given, else jittered backoff."""
    if retry_after is not None:
        return min(retry_after, retry_after_cap)
    backoff = min(cap, base * (2**attempt))
    return backoff * random.uniform(0.8, 1.0)  # jitter so parallel retries do not align


@dataclass
class RetryPolicy:
    max_retries: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_after_max_s: float = 30.0


class Upstream:
    """Runs attempts through the rate limiter and the concurrency cap, retrying what may be
    retried. ``on_call(kind)`` counts every attempt (for ``/health``'s stats)."""

    def __init__(
        self,
        limiter: TokenBucket,
        max_concurrency: int,
        retry: RetryPolicy,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        on_call: Callable[[str], None] | None = None,
    ) -> None:
        self._limiter = limiter
        self._slots = asyncio.Semaphore(max_concurrency)
        self.retry = retry
        self._sleep = sleep
        self._on_call = on_call

    async def run(self, kind: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``await attempt()`` until it succeeds, fails for good, or retries are spent (then
        the last error is raised with "(after N attempts)" appended)."""
        policy = self.retry
        last: UpstreamError | None = None
        for n in range(policy.max_retries + 1):
            await self._limiter.acquire()
            async with self._slots:
                if self._on_call is not None:
                    self._on_call(kind)
                try:
                    return await attempt()
                except UpstreamError as err:
                    if not err.retryable:
                        raise
                    last = err
            if n < policy.max_retries:
                delay = retry_delay(
                    n,
                    last.retry_after,
                    base=policy.backoff_base_s,
                    cap=policy.backoff_max_s,
                    retry_after_cap=policy.retry_after_max_s,
                )
                log.info("%s attempt %d failed (%s); retrying in %.2fs", kind, n + 1, last, delay)
                await self._sleep(delay)
        assert last is not None
        if last.opaque:
            raise UpstreamError(last.status, last.code, last.message, opaque=True)
        raise UpstreamError(
            last.status, last.code, f"{last.message} (after {policy.max_retries + 1} attempts)"
        )
