"""MIA's service contracts: one module per service holds its wire models (pydantic), shared by
the server that answers them and the client that sends them, plus that client.

- :mod:`mia.services.base` — :class:`ServiceClient` (bearer token, retries on connection
  failures, one pool per event loop) and :class:`ServiceError` (the ``{"error": {...}}`` envelope);
- :mod:`mia.services.web` — web_tools ``/search``.

The role trainers, the Planner flow and the evaluation harness talk to the services only
through these clients, so a route's payload is written once.
"""

from mia.services.base import (
    DEFAULT_TIMEOUT_S,
    ExecutorClient,
    MemoryClient,
    RequestFailed,
    RewardClient,
    RouteMissing,
    ServiceClient,
    ServiceError,
    ServiceUnavailable,
)

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
]
