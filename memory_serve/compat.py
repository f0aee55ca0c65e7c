"""The reference system's route names (docs/reference.md) that the Memory Manager answers too.

Every alias of the service stands in :data:`ALIASES`: each serves the endpoint of the route it
names, with the same body, answer and tag. (The reference's field names are aliases of the wire
models in :mod:`mia.services.memory`.)
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter
from fastapi.routing import APIRoute

# The reference's name -> this service's route (both POST).
ALIASES = {"/batch_memory_save": "/memories"}


def reference_aliases(routers: Iterable[APIRouter]) -> APIRouter:
    """A router of the aliases whose route one of ``routers`` has (an absent route, such as a
    planner route without an LLM, has no alias either)."""
    routes = {
        r.path: r
        for router in routers
        for r in router.routes
        if isinstance(r, APIRoute) and "POST" in r.methods
    }
    aliases = APIRouter()
    for alias, path in ALIASES.items():
        route = routes.get(path)
        if route is None:
            continue
        aliases.add_api_route(
            alias,
            route.endpoint,
            methods=["POST"],
            response_model=route.response_model,
            response_model_exclude_unset=route.response_model_exclude_unset,
            tags=list(route.tags),
            # The operation id the alias has always had: <endpoint>_<alias path>.
            name=f"{route.endpoint.__name__}{alias.replace('/', '_')}",
        )
    return aliases
