"""One way to configure every service and role: a typed schema filled from YAML and overrides.

Each component has ONE config dataclass (its schema): every field has its default and a help
text (``field(default=..., metadata={"help": ...})``), and the defaults live there and nowhere
else. A config is built in three layers, later ones winning:

1. the schema's defaults;
2. a YAML file (a path, or a name under ``configs/<group>/``). A YAML with a Hydra ``defaults``
   list (the role configs that pull the engine's groups: ``/judge@judge: rules``,
   ``experiment=paper``) is composed by Hydra, with ``configs/`` on the search path;
3. ``key=value`` overrides (dot paths: ``store.retrieval.top_k=3``; for composed configs also
   Hydra's group syntax: ``judge=llm``, ``+x=y``).

The result is checked against the schema (unknown keys and wrong types are errors) and, when the
schema has one, its ``validate()`` runs. Every problem is one :class:`MiaError` line, so command
lines print it and exit 2.

    from mia.config import load_config
    cfg = load_config(EvalConfig, "default", ["memory.top_k=3"], group="eval")
    print(describe(EvalConfig))          # every key with its default and help
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mia.errors import MiaError
from mia.paths import CONFIG_ROOT

T = TypeVar("T")
Source = str | os.PathLike[str] | Mapping[str, Any] | None


def resolve_path(name: str | os.PathLike[str], group: str | None = None) -> Path:
    """A YAML file, or ``configs/<group>/<name>.yaml`` (``default`` -> ``default.yaml``)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if group is not None:
        named = CONFIG_ROOT / group / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
        if named.is_file():
            return named
        raise MiaError(f"config not found: {name} (also looked for {named})")
    raise MiaError(f"config file not found: {name}")


def _has_defaults_list(path: Path) -> bool:
    from omegaconf import OmegaConf

    data = OmegaConf.load(path)
    return isinstance(data, Mapping) and "defaults" in data


def compose(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A Hydra-composed YAML (defaults list + overrides) as a plain dict; ``configs/`` is on
    the search path, so a file anywhere can pull the shipped groups."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = Path(path).resolve()
    if not p.is_file():
        raise MiaError(f"config {p} not found")
    search = f"hydra.searchpath=[file://{CONFIG_ROOT}]"
    try:
        with initialize_config_dir(config_dir=str(p.parent), version_base=None):
            cfg = hydra_compose(config_name=p.stem, overrides=[search, *overrides])
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config {p.name}: {str(err).splitlines()[0]}") from None


def load_dict(
    source: Source = None, overrides: Sequence[str] = (), *, group: str | None = None
) -> dict[str, Any]:
    """The YAML layer plus overrides as a plain dict (no schema): composed when the YAML has a
    defaults list."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise MiaError(f"overrides must look like key=value, got {bad[0]!r}")
    if source is not None and not isinstance(source, Mapping):
        path = resolve_path(source, group)
        if _has_defaults_list(path):
            return compose(path, overrides)
        source = OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[assignment]
    try:
        merged = OmegaConf.create(dict(source or {}))
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config: {str(err).splitlines()[0]}") from None


def from_dict(schema: type[T], data: Mapping[str, Any] | T | None, where: str = "") -> T:
    """A schema instance from a plain mapping: unknown keys and wrong types are errors,
    nested dataclasses are built recursively, ``validate()`` runs when the schema has one."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(data, schema):
        return data
    where = where or schema.__name__
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.create(dict(data or {})))
        cfg = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"{where}: {_first_line(err)}") from None
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        out = validate()
        cfg = out if isinstance(out, schema) else cfg
    return cfg  # type: ignore[return-value]


def load_config(
    schema: type[T],
    source: Source = None,
    overrides: Sequence[str] = (),
    *,
    group: str | None = None,
    where: str = "",
) -> T:
    """Schema defaults <- YAML ``source`` (file, ``configs/<group>/<name>``, or a mapping) <-
    ``key=value`` overrides, checked against ``schema``."""
    data = load_dict(source, overrides, group=group)
    return from_dict(schema, data, where or (f"{group} config" if group else ""))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain (nested) dict of a schema instance."""
    return dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------- help


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return "(required)"


def describe(schema: type, prefix: str = "") -> str:
    """Every key of ``schema`` (nested ones dotted) with its type, default and help text."""
    hints = typing.get_type_hints(schema)
    lines = []
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        default = _default(f)
        if dataclasses.is_dataclass(default):
            lines.append(f"{key}:  {f.metadata.get('help', '')}".rstrip())
            lines.append(describe(type(default), key + "."))
            continue
        help_text = f.metadata.get("help", "")
        lines.append(f"{key} ({_type_name(hints.get(f.name, f.type))}) = {default!r}  {help_text}")
    return "\n".join(line for line in lines if line)


def undocumented(schema: type, prefix: str = "") -> list[str]:
    """Keys of ``schema`` (recursively) that have no help text (tests keep this empty)."""
    missing = []
    for f in dataclasses.fields(schema):
        default = _default(f)
        if not f.metadata.get("help"):
            missing.append(f"{prefix}{f.name}")
        if dataclasses.is_dataclass(default):
            missing += undocumented(type(default), f"{prefix}{f.name}.")
    return missing
