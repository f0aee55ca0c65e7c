"""The two policy kinds behind the one Executor loop.

The loop (parsing, limits, tools, replan) is written once; a policy only knows how to generate
the next assistant turn and how to append injected turns to the running context.

- :class:`ChatPolicy` wraps any :class:`mia.llm.ChatBackend` (vLLM/OpenAI over HTTP, the local
  backend, scripted replies): each turn sends the whole ``messages`` list. Segments carry text,
  plus ids/logprobs only when the backend returned them for an unmodified reply.
- :class:`TokenPolicy` is token-in/token-out over an engine with
  ``async generate_ids(prompt_ids, params) -> ChatResult`` (the in-process
  :class:`mia.llm.local_backend.LocalChat`; a vLLM engine can implement the same method). The
  prompt is rendered once; each turn continues the running ids; injected turns are appended as
  the chat template's delta tokens (veRL's trick: render a fixed dummy conversation with and
  without the new messages and tokenise the difference), so the conversation is never
  re-tokenised and ``decode(prompt_ids + response_ids)`` is exactly the rendered conversation.
  Images (Qwen2.5-VL): each ``<|image_pad|>`` the template renders is expanded to one pad per
  merged patch (:func:`mia.vision.expand_image_pads`) and the images' pixel values and grids
  travel with the trajectory (``traj.multimodal``) to the engine and to the trainer.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, Protocol

from mia.errors import MiaError
from mia.llm.base import ChatBackend, LLMError, Message, SamplingParams
from mia.trace import content_text

from . import protocol
from .images import is_image_part, message_images
from .trajectory import ASSISTANT, END_OF_TURN, Segment, Trajectory


@dataclass
class Generation:
    """One assistant turn as it enters the conversation (``text``, already cut after the first
    ``</tool_call>``) and the backend's raw reply."""

    text: str
    raw_text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Injection:
    """Turns the loop is about to inject, rendered by the policy so the loop can check the
    context budget before committing them."""

    kind: str
    messages: list[Message]
    text: str
    token_ids: list[int] | None
    n_tokens: int
    # Token mode with images: the injected images (PIL), pixel values and grids, in order.
    images: MultimodalInputs | None = None


@dataclass
class MultimodalInputs:
    """Images of a token-mode conversation in the order their pads appear: the PIL images
    (for engines that run their own processor, e.g. vLLM), and per image its pixel values
    ``[patches, dim]`` and grid ``(t, h, w)`` (what the transformers engine and the trainer
    feed Qwen2.5-VL)."""

    images: list[Any]
    pixel_values: list[Any]
    grids: list[Any]

    def __len__(self) -> int:
        return len(self.images)

    def extend(self, other: MultimodalInputs) -> None:
        self.images += other.images
        self.pixel_values += other.pixel_values
        self.grids += other.grids

    def as_inputs(self) -> dict[str, Any]:
        """``{"pixel_values", "image_grid_thw", "images"}`` for ``generate_ids(multimodal=)``
        and the policy batch."""
        import torch

        return {
            "pixel_values": torch.cat(self.pixel_values),
            "image_grid_thw": torch.cat([g.reshape(-1, 3) for g in self.grids]).long(),
            "images": list(self.images),
        }


class Policy(Protocol):
    token_exact: bool
    max_context: int | None

    def default_params(self) -> SamplingParams: ...

    async def begin(self, traj: Trajectory) -> None: ...

    async def generate(self, traj: Trajectory, params: SamplingParams) -> Generation: ...

    def prepare(self, traj: Trajectory, messages: list[Message], kind: str) -> Injection: ...

    def commit(self, traj: Trajectory, injection: Injection) -> None: ...

    def drop_answer(self, traj: Trajectory) -> str: ...

    def context_tokens(self, traj: Trajectory) -> int: ...


def _count_images(messages: list[Message]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if is_image_part(part)
    )


# ---------------------------------------------------------------------------- chat policy


class ChatPolicy:
    """Any chat backend; the context size is the backend's token count when it reports one,
    else an estimate (``chars_per_token``, ``image_tokens`` per image)."""

    token_exact = False

    def __init__(
        self,
        backend: ChatBackend,
        *,
        chars_per_token: float = 3.0,
        image_tokens: int = 256,
        max_context: int | None = None,
    ) -> None:
        self.backend = backend
        self.chars_per_token = chars_per_token
        self.image_tokens = image_tokens
        self.max_context = max_context or getattr(backend, "max_context", None)

    def default_params(self) -> SamplingParams:
        defaults = getattr(self.backend, "defaults", None)
        return replace(defaults) if isinstance(defaults, SamplingParams) else SamplingParams()

    def estimate(self, messages: list[Message]) -> int:
        chars = sum(len(content_text(m.get("content"))) for m in messages)
        return (
            math.ceil(chars / self.chars_per_token)
            + 4 * len(messages)
            + self.image_tokens * _count_images(messages)
        )

    async def begin(self, traj: Trajectory) -> None:
        traj.token_mode = False
        traj.state["chat_context"] = self.estimate(traj.messages)

    def context_tokens(self, traj: Trajectory) -> int:
        if "chat_context" not in traj.state:  # a trajectory rebuilt from messages
            traj.state["chat_context"] = self.estimate(traj.messages)
        return int(traj.state["chat_context"])

    async def generate(self, traj: Trajectory, params: SamplingParams) -> Generation:
        res = await self.backend.chat(traj.messages, params)
        raw = text = res.text
        start = text.find(protocol.TOOL_CALL_OPEN)
        if (
            res.finish_reason == "stop"
            and start != -1
            and protocol.TOOL_CALL_CLOSE not in text[start:]
            and protocol.TOOL_CALL_CLOSE in (params.stop or [])
        ):
            text += protocol.TOOL_CALL_CLOSE  # the server consumed our stop string
        text = protocol.cut_after_tool_call(text)
        same = text == raw and res.token_ids is not None
        traj.segments.append(
            Segment(
                ASSISTANT,
                text,
                1,
                list(res.token_ids) if same and res.token_ids is not None else None,
                list(res.logprobs) if same and res.logprobs is not None else None,
            )
        )
        reply = {"role": "assistant", "content": text}
        if res.prompt_tokens:
            traj.state["chat_context"] = res.prompt_tokens + (
                res.completion_tokens or self.estimate([reply])
            )
        else:
            traj.state["chat_context"] = self.context_tokens(traj) + self.estimate([reply])
        return Generation(text, raw, res.finish_reason, res.prompt_tokens, res.completion_tokens)

    def prepare(self, traj: Trajectory, messages: list[Message], kind: str) -> Injection:
        text = "\n".join(content_text(m.get("content")) for m in messages)
        return Injection(kind, list(messages), text, None, self.estimate(messages))

    def commit(self, traj: Trajectory, injection: Injection) -> None:
        traj.segments.append(Segment(injection.kind, injection.text, 0))
        traj.state["chat_context"] = self.context_tokens(traj) + injection.n_tokens

    def drop_answer(self, traj: Trajectory) -> str:
        idx = _last_assistant_message(traj)
        text = content_text(traj.messages[idx].get("content"))
        cut = text.find(protocol.ANSWER_OPEN)
        if cut == -1:
            return text
        kept = text[:cut]
        for seg in reversed(traj.segments):
            if seg.kind == ASSISTANT:
                seg.text, seg.token_ids, seg.logprobs = kept, None, None
                break
        dropped = self.estimate([{"role": "assistant", "content": text[cut:]}]) - 4
        traj.state["chat_context"] = max(0, self.context_tokens(traj) - dropped)
        return kept


def _last_assistant_message(traj: Trajectory) -> int:
    for i in range(len(traj.messages) - 1, -1, -1):
        if traj.messages[i].get("role") == "assistant":
            return i
    raise MiaError("the conversation has no assistant turn")


# ---------------------------------------------------------------------------- token policy

# traj.state key of a token-mode trajectory's images (MultimodalInputs).
MM_STATE = "multimodal"

# Stand-ins for the dummy conversation whose renderings give the template's fixed pieces.
_DUMMY_SYSTEM = "MIA-DUMMY-SYSTEM"
_DUMMY_USER = "MIA-DUMMY-USER"
_DUMMY_ASSISTANT = "MIA-DUMMY-ASSISTANT"


class TokenPolicy:
    """Token-in/token-out over an engine with ``generate_ids``.

    ``tokenizer`` defaults to ``engine.tokenizer``; ``tokenizer_lock`` to
    ``engine.tokenizer_lock`` (the engine's worker thread uses the same tokenizer).

    Images (question images and tool-result images) need a Qwen2.5-VL engine: its config
    (``engine.hf_config`` or ``engine.model.config``) gives the image pad id and the vision
    tower's patch / merge sizes. Every rendered ``<|image_pad|>`` is expanded to one pad per
    merged patch, images are preprocessed with :func:`mia.vision.preprocess_images` (the
    Qwen2-VL processor's numerics; ``image_processor`` overrides ``min_pixels`` /
    ``max_pixels``), and each generation call gets ``multimodal=`` every image so far
    (``pixel_values``, ``image_grid_thw`` and the PIL ``images``). Image pads inside injected
    turns are injected tokens (mask 0) like the rest of the observation.
    """

    token_exact = True

    def __init__(
        self,
        engine: Any,
        tokenizer: Any = None,
        *,
        tokenizer_lock: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        defaults: SamplingParams | None = None,
        image_processor: dict[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(engine, "generate_ids", None)):
            raise MiaError(
                "TokenPolicy: the engine needs an async generate_ids(prompt_ids, params)"
            )
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if self.tokenizer is None:
            raise MiaError("TokenPolicy: no tokenizer (pass one or use an engine that has one)")
        self.lock = tokenizer_lock or getattr(engine, "tokenizer_lock", None) or threading.Lock()
        if chat_template_kwargs is None:
            chat_template_kwargs = getattr(engine, "chat_template_kwargs", None)
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.defaults = defaults
        self.max_context = getattr(engine, "max_context", None)
        self.image_processor = dict(image_processor or {})
        self._vision: dict[str, int] | None = _vision_settings(engine, self.tokenizer)
        self._init_template()

    # ---- tokenizer helpers (all under the lock)
    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        with self.lock:
            try:
                return self.tokenizer.apply_chat_template(
                    messages,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    **self.template_kwargs,
                )
            except Exception as err:  # jinja errors: bad roles, images for a text model
                raise MiaError(f"TokenPolicy: chat template failed: {err}") from err

    def encode(self, text: str) -> list[int]:
        with self.lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )

    def _init_template(self) -> None:
        base = [
            {"role": "system", "content": _DUMMY_SYSTEM},
            {"role": "user", "content": _DUMMY_USER},
        ]
        self._dummy = base + [{"role": "assistant", "content": _DUMMY_ASSISTANT}]
        full = self.render(self._dummy, False)
        gen_prompt = self.render(base, True)
        at = full.rfind(_DUMMY_ASSISTANT)
        if at == -1 or full[:at] != gen_prompt:
            raise MiaError(
                "TokenPolicy: the chat template does not put the assistant reply right after the "
                "generation prompt; token mode needs a template like ChatML/Qwen2.5"
            )
        self._dummy_prefix = full
        tail = full[at + len(_DUMMY_ASSISTANT) :]  # e.g. "<|im_end|>\n"
        tail_ids = self.encode(tail)
        eos: set[int] = set()
        for value in (
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(getattr(getattr(self.engine, "model", None), "generation_config", None),
                    "eos_token_id", None),
        ):  # fmt: skip
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list | tuple):
                eos.update(int(v) for v in value)
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        if tail_ids and tail_ids[0] in special | eos:
            self.eot_ids = tail_ids[:1]
            eos.add(tail_ids[0])
        else:
            self.eot_ids = tail_ids
        self.eot_text = self.decode(self.eot_ids)
        if not tail.startswith(self.eot_text):
            raise MiaError("TokenPolicy: cannot locate the end-of-turn token in the chat template")
        self.after_eot = tail[len(self.eot_text) :]  # injected with the next turn
        self.eos_ids = eos

    def default_params(self) -> SamplingParams:
        if self.defaults is not None:
            return replace(self.defaults)
        defaults = getattr(self.engine, "defaults", None)
        return replace(defaults) if isinstance(defaults, SamplingParams) else SamplingParams()

    # ---- policy protocol
    async def begin(self, traj: Trajectory) -> None:
        traj.prompt_text = self.render(traj.messages, True)
        ids = self.encode(traj.prompt_text)
        images = message_images(traj.messages) if _count_images(traj.messages) else []
        if images:
            mm = self._preprocess(images)
            ids = self._expand(ids, mm)
            traj.state[MM_STATE] = mm
        traj.prompt_ids = ids
        traj.token_mode = True
        traj.state["pending"] = ""

    # ---- images
    def _preprocess(self, images: list[Any]) -> MultimodalInputs:
        if self._vision is None:
            raise MiaError(
                "TokenPolicy: this engine's model takes no images (token mode with images needs "
                "a Qwen2.5-VL model); use a vision model or drop the images"
            )
        from mia.vision import preprocess_images

        v = self._vision
        kwargs = {
            "patch_size": v["patch_size"],
            "temporal_patch_size": v["temporal_patch_size"],
            "merge_size": v["merge_size"],
        }
        for key in ("min_pixels", "max_pixels"):
            if key in self.image_processor:
                kwargs[key] = int(self.image_processor[key])
        pixels, grids = [], []
        for img in images:  # one at a time: per-image pixel rows and grids
            out = preprocess_images([img], **kwargs)
            pixels.append(out["pixel_values"])
            grids.append(out["image_grid_thw"])
        return MultimodalInputs(list(images), pixels, grids)

    def _expand(self, ids: list[int], mm: MultimodalInputs) -> list[int]:
        from mia.vision import expand_image_pads

        assert self._vision is not None
        pad = self._vision["image_token_id"]
        if sum(1 for t in ids if t == pad) != len(mm):
            raise MiaError(
                f"TokenPolicy: the chat template rendered {sum(1 for t in ids if t == pad)} "
                f"image pad token(s) for {len(mm)} image(s)"
            )
        grid = [g.reshape(-1, 3)[0].tolist() for g in mm.grids]
        return list(
            expand_image_pads(ids, grid, merge_size=self._vision["merge_size"], image_token_id=pad)
        )

    def context_tokens(self, traj: Trajectory) -> int:
        return traj.context_length()

    async def generate(self, traj: Trajectory, params: SamplingParams) -> Generation:
        if traj.prompt_ids is None:
            raise MiaError("TokenPolicy: the trajectory has no prompt ids (begin() not called)")
        ids = traj.input_ids
        assert ids is not None
        mm = traj.state.get(MM_STATE)
        if mm is not None and len(mm):
            res = await self.engine.generate_ids(ids, params, multimodal=mm.as_inputs())
        else:
            res = await self.engine.generate_ids(ids, params)
        if res.token_ids is None:
            raise LLMError("TokenPolicy: the engine returned no token ids")
        toks = [int(t) for t in res.token_ids]
        ended = bool(toks) and toks[-1] in self.eos_ids
        body = toks[:-1] if ended else toks
        keep = self._keep(body, params.stop or [])
        if keep < len(body):
            ended = False
        kept = body[:keep]
        gen_ids = kept + toks[-1:] if ended else kept
        lps = list(res.logprobs[: len(gen_ids)]) if res.logprobs is not None else None
        content = self.decode(kept)
        traj.segments.append(Segment(ASSISTANT, self.decode(gen_ids), 1, gen_ids, lps))
        if not ended:
            traj.segments.append(Segment(END_OF_TURN, self.eot_text, 0, list(self.eot_ids)))
        traj.state["pending"] = self.after_eot
        return Generation(content, res.text, res.finish_reason, len(ids), len(toks))

    def _prefix_tokens(self, body: list[int], chars: int, through: bool) -> int:
        """Tokens of ``body`` to keep so the decoded prefix ends at ``chars``: the fewest that
        reach it (``through``) or the most that stay within it."""
        lengths = _LazyDecodedLengths(self, body)
        if through:
            return min(len(body), bisect.bisect_left(lengths, chars))
        return max(0, bisect.bisect_right(lengths, chars) - 1)

    def _keep(self, body: list[int], stops: list[str]) -> int:
        """How many generated tokens the turn keeps: through the first ``</tool_call>``, or up
        to (excluding) the first other stop string, whichever comes first."""
        text = self.decode(body)
        cut: int | None = None
        through = False
        close = text.find(protocol.TOOL_CALL_CLOSE)
        if close != -1:
            cut, through = close + len(protocol.TOOL_CALL_CLOSE), True
        for stop in stops:
            if not stop or stop == protocol.TOOL_CALL_CLOSE:
                continue
            at = text.find(stop)
            if at != -1 and (cut is None or at < cut):
                cut, through = at, False
        if cut is None:
            return len(body)
        return self._prefix_tokens(body, cut, through)

    def prepare(self, traj: Trajectory, messages: list[Message], kind: str) -> Injection:
        full = self.render(self._dummy + list(messages), True)
        if not full.startswith(self._dummy_prefix):
            raise MiaError("TokenPolicy: the chat template re-renders earlier turns")
        text = traj.state.get("pending", "") + full[len(self._dummy_prefix) :]
        ids = self.encode(text)
        mm = None
        if _count_images(messages):
            mm = self._preprocess(message_images(messages))
            ids = self._expand(ids, mm)
        return Injection(kind, list(messages), text, ids, len(ids), mm)

    def commit(self, traj: Trajectory, injection: Injection) -> None:
        traj.segments.append(Segment(injection.kind, injection.text, 0, injection.token_ids))
        traj.state["pending"] = ""
        if injection.images is not None and len(injection.images):
            mm = traj.state.get(MM_STATE)
            if mm is None:
                traj.state[MM_STATE] = MultimodalInputs([], [], [])
                mm = traj.state[MM_STATE]
            mm.extend(injection.images)

    def drop_answer(self, traj: Trajectory) -> str:
        idx = next(
            (
                i
                for i in range(len(traj.segments) - 1, -1, -1)
                if traj.segments[i].kind == ASSISTANT
            ),
            None,
        )
        if idx is None:
            raise MiaError("the trajectory has no assistant turn")
        seg = traj.segments[idx]
        ids = list(seg.token_ids or [])
        ended = bool(ids) and ids[-1] in self.eos_ids
        body = ids[:-1] if ended else ids
        text = self.decode(body)
        cut = text.find(protocol.ANSWER_OPEN)
        if cut == -1:
            return text
        keep = self._prefix_tokens(body, cut, through=False)
        kept = body[:keep]
        lps = seg.logprobs[:keep] if seg.logprobs is not None else None
        traj.segments[idx:] = [
            Segment(ASSISTANT, self.decode(kept), 1, kept, lps),
            Segment(END_OF_TURN, self.eot_text, 0, list(self.eot_ids)),
        ]
        traj.state["pending"] = self.after_eot
        return self.decode(kept)


def _vision_settings(engine: Any, tokenizer: Any) -> dict[str, int] | None:
    """Image pad id and vision patch sizes of the engine's model, or None for a text model."""
    config = getattr(engine, "hf_config", None)
    if config is None:
        config = getattr(getattr(engine, "model", None), "config", None)
    vision = getattr(config, "vision_config", None)
    pad = getattr(config, "image_token_id", None)
    if vision is None or pad is None:
        return None
    if tokenizer is not None and tokenizer.convert_tokens_to_ids("<|image_pad|>") != pad:
        return None  # a template that renders some other placeholder
    return {
        "image_token_id": int(pad),
        "patch_size": int(getattr(vision, "patch_size", 14)),
        "temporal_patch_size": int(getattr(vision, "temporal_patch_size", 2)),
        "merge_size": int(getattr(vision, "spatial_merge_size", 2)),
    }


class _LazyDecodedLengths:
    """``len(decode(body[:k]))`` for k = 0..len(body), computed on demand for bisect."""

    def __init__(self, policy: TokenPolicy, body: list[int]) -> None:
        self.policy = policy
        self.body = body
        self.cache: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.body) + 1

    def __getitem__(self, k: int) -> int:
        if k not in self.cache:
            self.cache[k] = len(self.policy.decode(self.body[:k]))
        return self.cache[k]
