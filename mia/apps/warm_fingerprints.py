"""What a warm-started model's key (:func:`mia.apps.warm_start.recipe_key`) covers beyond its
recipe: the data fingerprint (the world format, the prompts, the gold tables and
:data:`WARM_DATA_VERSION`), the base model's fingerprint, and the stable hash they are keyed by.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import file_sha256

MARKER = "mia-model.json"
# Bump when the way gold data is made changes in a way the fingerprint below cannot see.
WARM_DATA_VERSION = 2  # 2: gold styles (concise, terse), alternate plans, several worlds


def _stable(value: Any) -> str:
    """JSON fallback that is the same in every process: a function by its source (``str`` of a
    function holds its memory address, which changed the cache key on every run), a set sorted."""
    if callable(value):
        import inspect

        try:
            return "fn:" + inspect.getsource(value).strip()
        except (OSError, TypeError):
            return "fn:" + getattr(value, "__qualname__", type(value).__name__)
    if isinstance(value, set | frozenset):
        return json.dumps(sorted(map(_stable_item, value)))
    return str(value)


def _stable_item(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_stable)


def stable_sha(data: Any) -> str:
    """The sha256 (hex) of ``data`` as canonical JSON, the same in every process."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=_stable).encode()).hexdigest()


def _constants(module: Any, numbers: bool = False) -> dict[str, Any]:
    """The upper-case text/table constants of a module (prompts, phrase tables); with
    ``numbers`` also its numeric ones (rates, versions)."""
    kinds = (str, dict, tuple, list) + ((int, float) if numbers else ())
    out = {}
    for name, value in sorted(vars(module).items()):
        if name.isupper() and isinstance(value, kinds):
            out[name] = value
    return out


def _planner_text() -> dict[str, Any]:
    """The Planner's prompt templates, and the chat end tokens its replies are read without.
    The memory block's layout (``FEEDBACK_KEYS``, ``EMPTY_MEMORY``) is left out: it is built
    from :mod:`mia.prompts.manager`'s constants, which the key has never covered."""
    from mia.llm import think
    from mia.prompts import planner

    layout = ("FEEDBACK_KEYS", "EMPTY_MEMORY")
    out = {k: v for k, v in _constants(planner).items() if k not in layout}
    out["_END_TOKENS"] = think._END_TOKENS
    return dict(sorted(out.items()))


def data_fingerprint(planner_memory: bool = False) -> dict[str, Any]:
    """What the gold data depends on beyond the recipe: the world format, the prompts the agent
    loop and the Planner render, the gold phrase tables, and :data:`WARM_DATA_VERSION`; with
    ``planner_memory`` (recipes with ``gold_world.planner_memory``) also the constants of
    :mod:`mia.apps.planner_gold`, so a change there retrains only the recipes that use it."""
    from mia.apps import gold
    from mia.data.world_io import WORLD_FORMAT_VERSION
    from mia.prompts import executor

    out = {
        "warm_data_version": WARM_DATA_VERSION,
        "world_format": WORLD_FORMAT_VERSION,
        "prompts": stable_sha([_constants(executor), _planner_text()]),
        "gold": stable_sha(_constants(gold)),
    }
    if planner_memory:
        from mia.apps import planner_gold

        out["planner_memory"] = stable_sha(_constants(planner_gold, numbers=True))
    return out


def base_fingerprint(model_dir: str | Path) -> dict[str, Any]:
    """The base model's identity: its build marker when it has one (the embedded model: no
    need to read 260 MB), else the sha256 of every file in the folder."""
    folder = Path(model_dir)
    marker = folder / MARKER
    if marker.is_file():
        data = json.loads(marker.read_text())
        data.pop("built_at", None)
        data.pop("seconds", None)
        return {"marker": data}
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            files[f.name] = file_sha256(f)
    if "config.json" not in files:
        raise MiaError(f"warm start: base model folder has no config.json: {folder}")
    return {"files": files}
