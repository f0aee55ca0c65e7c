"""The reward server contract (``/register_gts``, ``/compute_gt_reward``): request and response
models shared by the server (``ttrl_streaming.reward_server``) and :class:`RewardClient`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mia.services.base import ServiceClient

Scalar = str | int | float
DataId = str | int


def _answers(value: Scalar | list[Scalar]) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = [str(v).strip() for v in items]
    if not out or not all(out):
        raise ValueError("ground_truth must be a non-empty string or a list of non-empty strings")
    return out


def _data_id(value: DataId) -> str:
    text = str(value).strip()
    if not text:
        raise ValueError("data_id must not be empty")
    return text


class GTEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data_id: DataId
    ground_truth: Scalar | list[Scalar]

    def normalised(self) -> tuple[str, list[str]]:
        return _data_id(self.data_id), _answers(self.ground_truth)


class RegisterRequest(BaseModel):
    """``{"entries": [...]}`` or a single ``{"data_id", "ground_truth"}``."""

    model_config = ConfigDict(extra="forbid")
    entries: list[GTEntry] | None = None
    data_id: DataId | None = None
    ground_truth: Scalar | list[Scalar] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> RegisterRequest:
        single = self.data_id is not None or self.ground_truth is not None
        if self.entries is not None and single:
            raise ValueError("send either entries or one data_id + ground_truth, not both")
        if self.entries is None:
            if self.data_id is None or self.ground_truth is None:
                raise ValueError('expected {"entries": [{"data_id", "ground_truth"}, ...]}')
            self.entries = [GTEntry(data_id=self.data_id, ground_truth=self.ground_truth)]
        if not self.entries:
            raise ValueError("entries must not be empty")
        for entry in self.entries:  # raise here so bad entries are a 422, not a 500
            entry.normalised()
        return self


class RegisterResponse(BaseModel):
    status: str = "ok"
    registered: int
    total: int


class EpisodeRecord(BaseModel):
    """Wire form of :class:`mia.rewards.PlannerEpisodeRecord`."""

    model_config = ConfigDict(extra="forbid")
    plan: str
    decision: str
    replan: str | None = None
    answer_first: str = ""
    answer_final: str = ""
    replanned: bool = False
    question: str = ""
    trace_first: str = ""
    trace_final: str = ""
    reflected: bool = True  # false: no reflection turn, no decision to score


class ComputeRewardRequest(BaseModel):
    """The reference shape (``extra_info.messages``) or the native one (``record``). Unknown
    top-level fields are kept and passed to the reward function (``ctx.request``)."""

    model_config = ConfigDict(extra="allow")
    data_id: DataId | None = None
    data_source: str | None = None
    solution_str: str | None = None
    question: str | None = None
    extra_info: dict[str, Any] | None = None
    record: EpisodeRecord | None = None


class ComputeRewardResponse(BaseModel):
    score: float
    judgement: str | None = None
    format_score: float | None = None
    decision_score: float | None = None
    is_answer1_correct: bool | None = None
    is_answer2_correct: bool | None = None
    data_source: str | None = None
    data_id: str
    extras: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------------- client


class RewardClient(ServiceClient):
    """The pluggable reward server (``/register_gts``, ``/compute_gt_reward``)."""

    service = "reward_server"

    async def register(
        self, entries: Sequence[tuple[str, Sequence[str] | str]]
    ) -> RegisterResponse:
        """``/register_gts``: ``(data_id, ground truth)`` pairs (one answer or several)."""
        fields = {
            "entries": [
                {"data_id": str(i), "ground_truth": list(g) if not isinstance(g, str) else g}
                for i, g in entries
            ]
        }
        body = self.build(RegisterRequest, fields, "/register_gts")
        return await self.send("POST", "/register_gts", body, RegisterResponse)

    async def compute(
        self,
        data_id: str,
        record: EpisodeRecord | Mapping[str, Any],
        question: str = "",
        **extra: Any,
    ) -> ComputeRewardResponse:
        """``/compute_gt_reward`` of one episode; ``extra``: more top-level fields (the reward
        function reads them, e.g. ``data_source``)."""
        fields = {"data_id": data_id, "record": record, "question": question, **extra}
        body = self.build(ComputeRewardRequest, fields, "/compute_gt_reward")
        return await self.send("POST", "/compute_gt_reward", body, ComputeRewardResponse)
