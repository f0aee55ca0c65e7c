"""Running the service's coroutines together: all of them, or a bounded number at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def gather_all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Await all, results in order; the first failure cancels the rest and is re-raised as is
    (so an ApiError keeps its status instead of turning into an exception group)."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(_as_coro(c)) for c in coros]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw


async def bounded(limit: int, jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run coroutine factories with at most ``limit`` in flight, results in order."""
    sem = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await job()

    return await gather_all([one(j) for j in jobs])
