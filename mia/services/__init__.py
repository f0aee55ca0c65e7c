"""MIA's service contracts: one module per service holds its wire models (pydantic), shared by
the server that answers them and the client that sends them, plus that client.

- :mod:`mia.services.base` — :class:`ServiceClient` (bearer token, retries on connection
  failures, one pool per event loop), :class:`SyncClient` (any async client's methods for
  blocking code: ``memory.sync.plan(q)``) and :class:`ServiceError` (the ``{"error": {...}}``
  envelope);
- :mod:`mia.services.memory` — memory_serve (retrieval, plans, writes, TTRL, persistence): a
  package of its wire models (``memory.models``) and its client (``memory.client``);
- :mod:`mia.services.search` — local_search (Search-R1 ``/retrieve``; its client is the agent's
  ``search`` tool);
- :mod:`mia.services.rewards` — the reward server;
- :mod:`mia.services.streaming` — the TTRL streaming server;
- :mod:`mia.services.serve` — serve (``/execute``, ``/continue``);
- :mod:`mia.services.web` — web_tools ``/search``, ``/image_search``, ``/web_scrape``.

The role trainers, the Planner flow and the evaluation harness talk to the services only
through these clients, so a route's payload is written once. A client method takes typed
arguments (or the request model) and returns the route's response model; each is a coroutine,
written once, and blocking code runs it through :class:`SyncClient`.
"""

from mia.services.base import (
    DEFAULT_TIMEOUT_S,
    RequestFailed,
    RouteMissing,
    ServiceClient,
    ServiceError,
    ServiceUnavailable,
    SyncClient,
)
from mia.services.memory import MemoryClient
from mia.services.rewards import RewardClient
from mia.services.serve import ExecutorClient

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ExecutorClient",
    "MemoryClient",
    "RequestFailed",
    "RewardClient",
    "RouteMissing",
    "ServiceClient",
    "ServiceError",
    "ServiceUnavailable",
    "SyncClient",
]
