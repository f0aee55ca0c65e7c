"""MIA's token-exact policy over veRL's rollout servers.

veRL 0.9 hands an agent loop an LLM server client (``LLMServerClient``) whose
``generate(request_id, *, prompt_ids, sampling_params, image_data=...)`` returns a
``TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``). :class:`ServerEngine` wraps it
as the engine :class:`mia.agent.TokenPolicy` drives (``generate_ids(prompt_ids, params,
multimodal) -> ChatResult``), so the Executor loop and the Planner's conversation run
unchanged on veRL: the prompt is rendered once, every turn continues the running ids, injected
turns are the chat template's delta tokens, images are expanded to one pad per merged patch.

Sampling: temperature, top-p and top-k are veRL's (its rollout settings, greedy in
validation), because veRL's actor scores the sampled tokens at the rollout temperature; the
loop contributes ``max_tokens`` (per turn, clipped to the room left), stop strings, the
presence penalty and seeds. :class:`BudgetPolicy` caps each conversation at veRL's
``rollout.prompt_length`` (the prompt) and ``rollout.response_length`` (everything after it),
so veRL pads without cutting a turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from mia.agent.policy import TokenPolicy
from mia.agent.trajectory import Trajectory
from mia.errors import MiaError
from mia.llm.base import ChatResult, LLMError, SamplingParams

# Keys of veRL's per-request sampling dict that veRL owns (AgentLoopWorker.generate_sequences).
VERL_OWNED = ("temperature", "top_p", "top_k", "repetition_penalty", "logprobs")


def sampling_defaults(sampling_params: Mapping[str, Any], max_tokens: int) -> SamplingParams:
    """MIA's sampling defaults for a rollout from veRL's sampling dict."""
    return SamplingParams(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        max_tokens=int(max_tokens),
        logprobs=bool(sampling_params.get("logprobs", False)),
    )


class ServerEngine:
    """``generate_ids`` over veRL's server client for ONE rollout (``request_id`` keeps its
    turns on one server: prefix caching). ``sampling``: veRL's dict for this rollout.
    ``hf_config``: the model's config (image pad id and vision sizes for Qwen2.5-VL)."""

    def __init__(
        self,
        server: Any,
        tokenizer: Any,
        *,
        request_id: str,
        sampling: Mapping[str, Any],
        hf_config: Any = None,
        eos_ids: set[int] | None = None,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()
        self.request_id = request_id
        self.sampling = dict(sampling)
        self.hf_config = hf_config
        self.max_context: int | None = None
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = set(eos_ids or ()) | ({int(eos)} if isinstance(eos, int) else set())
        # Per rollout, for veRL's metrics.
        self.calls = 0
        self.generate_s = 0.0
        self.preempted: int | None = None
        self.extra_fields: dict[str, Any] = {}

    def request(self, params: SamplingParams) -> dict[str, Any]:
        """veRL's sampling dict for one turn: veRL's keys as given, the loop's per-turn ones."""
        sp = {k: self.sampling[k] for k in VERL_OWNED if k in self.sampling}
        sp["max_tokens"] = int(params.max_tokens)
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.presence_penalty:
            sp["presence_penalty"] = float(params.presence_penalty)
        if params.seed is not None:
            sp["seed"] = int(params.seed)
        return sp

    async def generate_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        p = params if params is not None else SamplingParams()
        images = list(multimodal.get("images") or []) if multimodal else None
        t0 = time.perf_counter()
        out = await self.server.generate(
            request_id=self.request_id,
            prompt_ids=[int(t) for t in prompt_ids],
            sampling_params=self.request(p),
            image_data=images or None,
        )
        self.generate_s += time.perf_counter() - t0
        self.calls += 1
        if getattr(out, "stop_reason", None) == "aborted":
            raise LLMError("veRL aborted the generation (weights are being updated)")
        if getattr(out, "num_preempted", None) is not None:
            self.preempted = (self.preempted or 0) + int(out.num_preempted)
        extra = dict(getattr(out, "extra_fields", None) or {})
        if not self.extra_fields:  # as veRL's ToolAgentLoop: the first turn's, then the newest
            self.extra_fields.update(extra)  # policy version (partial rollouts)
        elif extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]
        ids = [int(t) for t in out.token_ids]
        lps = [float(x) for x in out.log_probs] if getattr(out, "log_probs", None) else None
        ended = bool(ids) and ids[-1] in self.eos_ids
        finish = "length" if len(ids) >= p.max_tokens and not ended else "stop"
        with self.tokenizer_lock:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return ChatResult(
            text=text,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            token_ids=ids,
            logprobs=lps,
        )

    generate = generate_ids


class BudgetPolicy(TokenPolicy):
    """A :class:`TokenPolicy` for one veRL rollout: the rendered prompt must fit
    ``prompt_length`` (a longer one is an error: cutting a chat prompt would break its
    template and its image pads) and the conversation after it gets ``response_length``
    tokens (the loop's context budget is the prompt plus that)."""

    def __init__(
        self, engine: Any, *, prompt_length: int, response_length: int, **kwargs: Any
    ) -> None:
        super().__init__(engine, **kwargs)
        self.prompt_length = int(prompt_length)
        self.response_length = int(response_length)
        self.max_context = None

    async def begin(self, traj: Trajectory) -> None:
        await super().begin(traj)
        n = len(traj.prompt_ids or [])
        if n > self.prompt_length:
            raise MiaError(
                f"the rendered prompt has {n} tokens, more than actor_rollout_ref.rollout."
                f"prompt_length={self.prompt_length} (data.max_prompt_length): raise it"
            )
        self.max_context = n + self.response_length
