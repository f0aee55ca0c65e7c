"""The local_search contract (Search-R1's ``POST /retrieve``): request and response models shared
by the service (``local_search``) and its client, the agent's ``search`` tool.

Request ``{"queries": [str, ...], "topk": int, "return_scores": bool}``; response
``{"result": [[hit, ...] per query]}`` where a hit is ``{"document": {"id", "contents"},
"score": float}`` with scores, the document itself without.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # Search-R1 clients may send more fields

    queries: list[StrictStr] = Field(min_length=1, description="one or more search queries")
    topk: StrictInt | None = Field(default=None, description="passages per query")
    return_scores: StrictBool = Field(
        default=False, description="wrap each document as {document, score}"
    )


class Document(BaseModel):
    id: str | int
    contents: str


class ScoredDocument(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[ScoredDocument]] | list[list[Document]]
