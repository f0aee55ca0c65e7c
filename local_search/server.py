"""The Search-R1 ``POST /retrieve`` service over an opened index.

Wire format (exactly Search-R1's ``retrieval_server.py``):
request ``{"queries": [str, ...], "topk": int, "return_scores": bool}`` (topk defaults to the
server's ``--topk``, return_scores to false); response ``{"result": [[hit, ...] per query]}``
where a hit is ``{"document": {"id", "contents"}, "score": float}`` when return_scores is true
and just the document ``{"id", "contents"}`` when it is false.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from mia.http import DEFAULT_MAX_BODY_BYTES, ApiError, create_app
from mia.services.search import RetrieveRequest, RetrieveResponse

from .base import Retriever
from .config import ServeConfig


def create_search_app(
    retriever: Retriever,
    serve: ServeConfig | None = None,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    cfg = serve or ServeConfig()

    def health() -> dict[str, Any]:
        return {
            "index": retriever.manifest.info(),
            "default_topk": cfg.default_topk,
            "max_topk": cfg.max_topk,
            "max_queries": cfg.max_queries,
        }

    app = create_app("local_search", token=token, max_body_bytes=max_body_bytes, health=health)

    # A plain ``def``: FastAPI runs it in its thread pool, so a long batch never blocks /health.
    @app.post("/retrieve", response_model=RetrieveResponse)
    def retrieve(req: RetrieveRequest) -> dict[str, Any]:
        topk = cfg.default_topk if req.topk is None else req.topk
        if not 1 <= topk <= cfg.max_topk:
            raise ApiError(422, f"topk must be between 1 and {cfg.max_topk}, got {topk}")
        if len(req.queries) > cfg.max_queries:
            raise ApiError(
                422, f"at most {cfg.max_queries} queries per request, got {len(req.queries)}"
            )
        for i, q in enumerate(req.queries):
            if not q.strip():
                raise ApiError(422, f"queries.{i}: empty query")
        hits = retriever.search(req.queries, topk)
        if req.return_scores:
            result: list[list[Any]] = [
                [{"document": h.document(), "score": h.score} for h in row] for row in hits
            ]
        else:
            result = [[h.document() for h in row] for row in hits]
        return {"result": result}

    return app
