"""The in-process transformers generator (CPU, tests, the embedded default).

It is a thin view over :class:`mia.llm.local_backend.LocalChat`'s batching engine, so there is
one decoding loop in the project: concurrent ``generate`` calls are batched by its worker thread,
each row with its own sampling parameters, stop strings and raw logprobs.

Weight sync after a policy step, in place (the module object and the engine stay):

- ``update_weights(state_dict=...)``: the policy's full HF-named state dict
  (``PolicyModel.state_dict_for_export()``) is copied into the parameters (dtype converted);
  the fast path when trainer and generator share a process.
- ``update_weights(path=...)``: a saved Hugging Face folder (``export_hf`` / model_merger) is
  loaded with the model's own class, which applies any checkpoint key renaming, then copied in.

Both wait for the batch being decoded and hold the next one back until the copy is done.
When the generator wraps the policy's own module (``model=policy.module``) there is nothing to
sync; ``update_weights`` still bumps ``weight_version``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia.llm.base import ChatResult, SamplingParams
from mia.rl.generators.base import GeneratorError, check_prompt, check_update_args, clean_params

if TYPE_CHECKING:
    import torch

    from mia.llm.local_backend import LocalChat


class TransformersGenerator:
    """``TransformersGenerator(model_path)``, ``TransformersGenerator(model=m, tokenizer=t)`` or
    ``TransformersGenerator(chat=local_chat)`` (share an engine that also serves chat roles)."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        chat: LocalChat | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 8,
        batch_wait_ms: float = 5.0,
        name: str | None = None,
    ) -> None:
        from mia.llm.local_backend import LocalChat

        if chat is None:
            chat = LocalChat(
                model_path,
                model=model,
                tokenizer=tokenizer,
                device=device,
                dtype=dtype,
                max_batch_size=max_batch_size,
                batch_wait_ms=batch_wait_ms,
                name=name,
            )
        elif model_path is not None or model is not None:
            raise GeneratorError("TransformersGenerator: give chat OR a model, not both")
        self._chat = chat
        self.name = name or f"transformers:{chat.name}"
        self.model_path = str(model_path) if model_path is not None else None
        self.weight_version = 0
        self._lock = threading.Lock()  # one weight update at a time
        self._vocab = int(self.model.config.get_text_config().vocab_size)

    # ---- the engine's pieces, for TokenPolicy and the trainer
    @property
    def model(self) -> Any:
        return self._chat.model

    @property
    def tokenizer(self) -> Any:
        return self._chat.tokenizer

    @property
    def hf_config(self) -> Any:
        """The model's Hugging Face config (TokenPolicy reads the vision settings from it)."""
        return self.model.config

    @property
    def tokenizer_lock(self) -> threading.Lock:
        return self._chat.tokenizer_lock

    @property
    def max_context(self) -> int | None:
        return self._chat.max_context

    @property
    def chat(self) -> LocalChat:
        """The underlying chat backend (the same engine; for roles that talk in messages)."""
        return self._chat

    # ---- generation
    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        ids = check_prompt(prompt_ids, self._vocab, self.name)
        p = clean_params(params, self.name)
        version = self.weight_version
        res = await self._chat.generate_ids(ids, p, multimodal=multimodal)
        res.extra["weight_version"] = version
        return res

    # TokenPolicy calls engines through generate_ids.
    generate_ids = generate

    # ---- weight sync
    def update_weights(
        self, state_dict: dict[str, torch.Tensor] | None = None, path: str | None = None
    ) -> int:
        check_update_args(state_dict, path)
        with self._lock:
            if path is not None:
                state_dict = self._read_folder(Path(path))
            assert state_dict is not None
            with self._chat.exclusive():
                _copy_into(self.model, state_dict, self.name)
            self.weight_version += 1
            return self.weight_version

    def _read_folder(self, path: Path) -> dict[str, torch.Tensor]:
        if not (path / "config.json").is_file():
            raise GeneratorError(f"{self.name}: {path} is not a model folder (no config.json)")
        # The model's own class applies the same checkpoint-key conversions as the first load.
        try:
            fresh = type(self.model).from_pretrained(str(path), dtype=self.model.dtype)
        except Exception as err:  # corrupt or mismatched files: one clear line
            raise GeneratorError(f"{self.name}: cannot load weights from {path}: {err}") from err
        return fresh.state_dict()

    def close(self) -> None:
        self._chat._engine.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def _copy_into(model: Any, state_dict: dict[str, torch.Tensor], name: str) -> None:
    """Copy every tensor of ``state_dict`` into ``model``'s parameters and buffers in place.

    Every parameter must be covered, except ones tied to a covered one (``lm_head`` tied to the
    embeddings is often absent from saved state dicts); unknown keys and shape mismatches fail
    before anything is written, so a bad update leaves the old weights intact.
    """
    import torch

    own = dict(model.named_parameters(remove_duplicate=False))
    own.update(dict(model.named_buffers(remove_duplicate=False)))
    unknown = sorted(set(state_dict) - set(own))
    if unknown:
        raise GeneratorError(f"{name}: update has {len(unknown)} unknown weights: {unknown[:3]}")
    covered = {id(own[k]) for k in state_dict}
    missing = sorted(
        k for k, t in model.named_parameters(remove_duplicate=False) if id(t) not in covered
    )
    if missing:
        raise GeneratorError(f"{name}: update misses {len(missing)} weights: {missing[:3]}")
    bad = [
        f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if tuple(v.shape) != tuple(own[k].shape)
    ]
    if bad:
        raise GeneratorError(f"{name}: update has shape mismatches: {bad[:3]}")
    with torch.no_grad():
        for k, v in state_dict.items():
            dst = own[k]
            if v.data_ptr() != dst.data_ptr():  # the policy's own module: nothing to copy
                dst.copy_(v.to(dst.device), non_blocking=False)
