"""The serve contract: ``/execute`` and ``/continue`` request and response models, shared by
the Executor service (``serve``) and its client, :class:`ExecutorClient`.

``/plan`` and ``/replan`` are the reference's routes (docs/reference.md §3.2, §3.3): the same runs,
answered in the reference's shape (``prompt``: the reflection prompt wrapping the trace,
``trace``, ``history_messages``: the chat after the first user prompt) plus our fields; their
``/replan`` takes that history (not the whole conversation) with ``plan``, and both take a
question's images from ``data_id`` (``serve.images_from``) when the client sends none."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mia.services.base import ServiceClient


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


_Text = Annotated[str, AfterValidator(_not_blank)]  # a string that is not all white space


def _caption() -> Any:
    return Field(default=None, description="accepted for compatibility; not shown to the Executor")


class _Request(BaseModel):
    # Reference clients send extra fields (mem contexts, ...): ignore them.
    model_config = ConfigDict(extra="ignore")

    question: _Text = Field(description="the question the Executor answers")
    images: list[str] | str | None = Field(
        default=None, description="question images: base64 strings or data URLs"
    )
    data_id: str | int | None = Field(
        default=None, description="question id; the image-search cache folder name"
    )


class ExecuteRequest(_Request):
    plan: str = Field(description="the Planner's plan ('' for none)")
    image_caption: str | list[str] | None = _caption()
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="this run's sampling temperature; null = the service's (llm.sampling)",
    )
    seed: int | None = Field(
        default=None, ge=0, description="this run's sampling seed (with a temperature > 0)"
    )


class ContinueRequest(_Request):
    messages: list[dict[str, Any]] = Field(
        min_length=2, description="the conversation returned by /execute (or /continue)"
    )
    replan: _Text = Field(description="the supplementary plan")


class ReferenceReplanRequest(_Request):
    """``/replan``: the reference's body. ``messages`` is the history its ``/plan`` returned
    (starting at the first assistant turn); a whole conversation (system + prompt first, as
    ``/continue`` takes) is accepted too."""

    plan: str = Field(default="", description="the plan the history ran ('' for none)")
    messages: list[dict[str, Any]] = Field(
        min_length=1, description="history_messages of /plan (or the whole conversation)"
    )
    replan: _Text = Field(description="the supplementary plan")
    image_caption: str | list[str] | None = _caption()


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class ToolCallInfo(BaseModel):
    turn: int
    attempt: int
    name: str | None
    arguments: dict[str, Any] | None
    ok: bool
    error_kind: str | None
    error: str | None


class ExecuteResponse(BaseModel):
    answer: str = Field(description="the final answer ('' when the run ended without one)")
    trace: str = Field(description="readable trace (for /continue: the new turns only)")
    messages: list[dict[str, Any]] = Field(description="the whole conversation, images inline")
    tool_calls: list[ToolCallInfo]
    turns: int = Field(description="assistant turns in this call")
    usage: Usage
    tool_errors: list[str] = Field(description="tool services that failed in this call")
    tool_error: bool
    stop_reason: str = Field(description="answer | max_turns | context_budget | ...")
    forced_answer: bool = Field(description="the model was told to answer now")
    replanned: bool
    data_id: str | None


class ReferenceResponse(ExecuteResponse):
    """``/plan`` and ``/replan``: the reference's fields first, then ours."""

    prompt: str = Field(description="the Planner's reflection prompt wrapping ``trace``")
    history_messages: list[dict[str, Any]] = Field(
        description="the conversation after the first user prompt (what /replan takes back)"
    )


# ---------------------------------------------------------------------------- client


class ExecutorClient(ServiceClient):
    """serve: the (frozen) Executor runs a plan (``/execute``) and continues (``/continue``);
    both answer :class:`ExecuteResponse`."""

    service = "serve"

    async def execute(
        self,
        question: str,
        plan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> ExecuteResponse:
        fields: dict[str, Any] = {"question": question, "plan": plan}
        if data_id is not None:
            fields["data_id"] = data_id
        if images:
            fields["images"] = list(images)
        if temperature is not None:
            fields["temperature"] = temperature
        if seed is not None:
            fields["seed"] = seed
        body = self.build(ExecuteRequest, fields, "/execute")
        return await self.send("POST", "/execute", body, ExecuteResponse)

    async def continue_(
        self,
        question: str,
        messages: Sequence[Mapping[str, Any]],
        replan: str,
        *,
        data_id: str | None = None,
        images: Sequence[str] | None = None,
    ) -> ExecuteResponse:
        fields: dict[str, Any] = {
            "question": question,
            "messages": [dict(m) for m in messages],
            "replan": replan,
        }
        if data_id is not None:
            fields["data_id"] = data_id
        if images:
            fields["images"] = list(images)
        body = self.build(ContinueRequest, fields, "/continue")
        return await self.send("POST", "/continue", body, ExecuteResponse)
