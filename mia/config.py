"""One way to configure every service and role: a typed schema filled from YAML and overrides.

Each component has ONE config dataclass (its schema): every field has its default and a help
text (``field(default=..., metadata={"help": ...})``), and the defaults live there and nowhere
else; the shipped YAML files hold only what differs for their purpose (a role's sizes, a
preset) and their composition. A config is built in three layers, later ones winning:

1. the schema's defaults;
2. a YAML file (a path, or a name under ``configs/<group>/``). A YAML with a Hydra ``defaults``
   list (the role configs that pull the engine's groups: ``/judge@judge: rules``,
   ``experiment=paper``) is composed by Hydra, with ``configs/`` on the search path;
3. ``key=value`` overrides (dot paths: ``store.retrieval.top_k=3``; for composed configs also
   Hydra's group syntax: ``judge=llm``, ``+x=y``).

The result is checked against the schema (unknown keys and wrong types are errors) and, when the
schema has one, its ``validate()`` runs. Every problem is one :class:`MiaError` line, so command
lines print it and exit 2. ``--help-config`` on every entry point prints :func:`describe`.

    from mia.config import load_config
    cfg = load_config(EvalConfig, "default", ["memory.top_k=3"], group="eval")
    print(describe(EvalConfig))          # every key with its type, default and help
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mia.errors import MiaError
from mia.paths import CONFIG_ROOT

T = TypeVar("T")
Source = str | os.PathLike[str] | Mapping[str, Any] | None


def option(default: Any, help: str) -> Any:
    """A schema field: its default and its help text (``--help-config``). Lists and dicts are
    copied for every instance."""
    if isinstance(default, list | dict | set):
        return dataclasses.field(
            default_factory=lambda: copy.deepcopy(default), metadata={"help": help}
        )
    return dataclasses.field(default=default, metadata={"help": help})


def check_known(schema: type, keys: Iterable[str], what: str) -> None:
    """Raise ``unknown <what> option(s): a, b`` for the ``keys`` that name no field of the
    dataclass ``schema``."""
    unknown = sorted(set(keys) - {f.name for f in dataclasses.fields(schema)})
    if unknown:
        raise MiaError(f"unknown {what} option(s): {', '.join(unknown)}")


def section(factory: Callable[[], Any], help: str) -> Any:
    """A nested schema field (a dataclass section), built by ``factory`` (the class, or a
    lambda giving a role its own defaults: ``lambda: TrainerConfig(batch_size=4)``)."""
    return dataclasses.field(default_factory=factory, metadata={"help": help})


def resolve_path(name: str | os.PathLike[str], group: str | None = None) -> Path:
    """A YAML file, or ``configs/<group>/<name>.yaml`` (``default`` -> ``default.yaml``)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if group is not None:
        named = CONFIG_ROOT / group / (p.name if p.suffix == ".yaml" else f"{p.name}.yaml")
        if named.is_file():
            return named
        raise MiaError(f"{group} config not found: {name} (also looked for {named})")
    raise MiaError(f"config file not found: {name}")


def _has_defaults_list(path: Path) -> bool:
    from omegaconf import OmegaConf

    data = OmegaConf.load(path)
    return isinstance(data, Mapping) and "defaults" in data


def compose(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    schema: type | None = None,
    *,
    config_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """A Hydra-composed YAML (defaults list + overrides) as a plain dict. The file's folder is
    the primary config dir (so ``experiment=paper`` finds ``<folder>/experiment/paper.yaml``)
    and ``configs/`` is on the search path, so a file anywhere can pull the shipped groups
    (``/rl/trainer@trainer``, ``/judge@judge: rules``). With ``config_dir``, that folder is the
    primary config dir instead (``path`` lies under it) and nothing is added to the search path.

    With a ``schema``, its defaults are the first layer of the composition: the YAML files
    hold only what differs, and ``key=value`` overrides still reach every key of the schema
    (Hydra only overrides keys that exist)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = Path(path).resolve()
    if not p.is_file():
        raise MiaError(f"config {p} not found")
    root = Path(config_dir).resolve() if config_dir is not None else p.parent
    name = p.relative_to(root).with_suffix("").as_posix()
    if schema is not None:
        name = _store_schema(schema, name)
    searched = config_dir is not None or any(o.startswith("hydra.searchpath=") for o in overrides)
    search = [] if searched else [f"hydra.searchpath=[file://{CONFIG_ROOT}]"]
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None):
            cfg = hydra_compose(config_name=name, overrides=[*search, *overrides])
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        text = _first_line(err)
        if text.startswith("Could not override '") and "To append" in str(err):
            text = f"unknown key {text.split(chr(39))[1]!r} (--help-config lists the keys)"
        raise MiaError(f"bad config {p.name}: {text}") from None


def _store_schema(schema: type, name: str) -> str:
    """Register ``schema``'s defaults and a primary config ``[defaults, <name>, _self_]`` in
    Hydra's config store; the primary's name."""
    from hydra.core.config_store import ConfigStore

    tag = f"{schema.__module__}.{schema.__qualname__}".replace(".", "_")
    store = ConfigStore.instance()
    store.store(name=f"_schema_{tag}", node=to_dict(schema()))
    primary = f"_with_schema_{tag}__{name.replace('/', '_')}"
    store.store(name=primary, node={"defaults": [f"_schema_{tag}", name, "_self_"]})
    return primary


def load_dict(
    source: Source = None,
    overrides: Sequence[str] = (),
    *,
    group: str | None = None,
    schema: type | None = None,
    hydra: bool | None = None,
) -> dict[str, Any]:
    """The YAML layer plus overrides as a plain dict: composed by Hydra when the YAML has a
    defaults list (or ``hydra=True``), over ``schema``'s defaults when given (see
    :func:`compose`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise MiaError(f"overrides must look like key=value, got {bad[0]!r}")
    if source is not None and not isinstance(source, Mapping):
        path = resolve_path(source, group)
        try:
            if hydra or (hydra is None and _has_defaults_list(path)):
                return compose(path, overrides, schema)
            source = OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[assignment]
        except (OmegaConfBaseException, ValueError, OSError) as err:
            raise MiaError(f"bad config {path}: {_first_line(err)}") from None
        if source is not None and not isinstance(source, Mapping):
            raise MiaError(f"config {path}: expected a mapping, got {type(source).__name__}")
    try:
        merged = OmegaConf.create(plain(source))
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config: {_first_line(err)}") from None


def merge(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Plain mappings merged in order, nested ones key by key (later layers win)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(*(OmegaConf.create(plain(layer)) for layer in layers))
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config: {_first_line(err)}") from None


def plain(data: Any) -> dict[str, Any]:
    """A plain (nested) dict from a mapping, an OmegaConf node or a schema instance
    (interpolations resolved); None is ``{}``."""
    if data is None:
        return {}
    value = _plain_value(data)
    if not isinstance(value, dict):
        raise MiaError(f"expected a mapping, got {type(data).__name__}")
    return value


def _plain_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_value(v) for v in value]
    return value


def _hints(schema: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(schema)
    except Exception:  # pragma: no cover - unresolvable annotations: fall back to the raw ones
        return {f.name: f.type for f in dataclasses.fields(schema)}


def _nested_schema(schema: type, f: dataclasses.Field) -> type | None:
    """The dataclass type of a nested section (``policy: PolicyConfig``), else None."""
    tp = _hints(schema).get(f.name)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    return None


def unknown_keys(schema: type, data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of ``data`` that ``schema`` does not have (nested sections included)."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = []
    for key, value in data.items():
        f = fields.get(str(key))
        if f is None:
            out.append(f"{prefix}{key}")
            continue
        sub = _nested_schema(schema, f)
        if sub is not None and isinstance(value, Mapping):
            out += unknown_keys(sub, value, f"{prefix}{key}.")
    return out


def _known_at(schema: type, dotted: str) -> tuple[str, list[str]]:
    """The section holding ``dotted`` and the keys it knows."""
    parts = dotted.split(".")[:-1]
    for part in parts:
        f = {f.name: f for f in dataclasses.fields(schema)}[part]
        schema = _nested_schema(schema, f) or schema
    return ".".join(parts), sorted(f.name for f in dataclasses.fields(schema))


def from_dict(schema: type[T], data: Mapping[str, Any] | T | None, where: str = "") -> T:
    """A schema instance from a plain mapping (or an OmegaConf node): the schema's defaults
    with ``data`` merged in (nested sections and free-form dicts key by key, lists replaced),
    unknown keys and wrong types are errors, ``validate()`` runs when the schema has one (an
    instance is returned as is)."""
    if isinstance(data, schema):
        return data
    where = where or schema.__name__
    raw = plain(data)
    unknown = unknown_keys(schema, raw)
    if unknown:
        section, known = _known_at(schema, unknown[0])
        under = f" under {section}" if section else ""
        raise MiaError(f"{where}: unknown key(s) {unknown} (known{under}: {known})")
    try:
        cfg = _build(schema, raw, None, "")
        _resolve_strings(cfg)
    except _TypeProblem as err:
        raise MiaError(f"{where}: {err}") from None
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        takes_where = "where" in inspect.signature(validate).parameters
        out = validate(where) if takes_where else validate()
        cfg = out if isinstance(out, schema) else cfg
    return cfg  # type: ignore[return-value]


class _TypeProblem(Exception):
    """A value that does not fit its field (``key: message``)."""


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _build(cls: type, raw: Mapping[str, Any], base: Any, prefix: str) -> Any:
    """``cls`` from ``base`` (an instance holding the defaults; None: the class's own) with
    ``raw``'s keys applied."""
    if base is None:
        try:
            base = cls()
        except TypeError:  # required fields: every one must be given
            base = None
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        current = getattr(base, f.name) if base is not None else dataclasses.MISSING
        if f.name in raw:
            start = None if current is dataclasses.MISSING else current
            kwargs[f.name] = _value(hints.get(f.name, Any), raw[f.name], start, key)
        elif current is dataclasses.MISSING:
            raise _TypeProblem(f"{key}: required")
        else:
            kwargs[f.name] = current
    return cls(**kwargs)


def _value(tp: Any, value: Any, current: Any, key: str) -> Any:
    """``value`` checked against the annotation ``tp`` (merged into ``current`` for sections
    and dicts). Exact types first; then the conversions a YAML string allows ("3" -> 3)."""
    for strict in (True, False):
        ok, out = _fit(tp, value, current, key, strict)
        if ok:
            return out
    shown = value if isinstance(value, str | int | float | bool | None) else type(value).__name__
    raise _TypeProblem(f"{key}: {shown!r} is not {_type_name(tp)}")


def _fit(tp: Any, value: Any, current: Any, key: str, strict: bool) -> tuple[bool, Any]:
    if tp is Any or tp is object or isinstance(tp, str | typing.TypeVar):
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            return True, _merge_plain(current, value)
        return True, copy.deepcopy(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return True, value
        if isinstance(value, Mapping):
            base = current if isinstance(current, tp) else None
            return True, _build(tp, value, base, f"{key}.")
        return False, None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return type(None) in args, None
        for arg in (a for a in args if a is not type(None)):
            try:
                ok, out = _fit(arg, value, current, key, strict)
            except _TypeProblem:
                continue
            if ok:
                return True, out
        return False, None
    if value is None:
        return tp is type(None), None
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            return False, None
        item = args[1] if len(args) == 2 else Any
        out = dict(current) if isinstance(current, Mapping) else {}
        for k, v in value.items():
            out[k] = _value(item, v, out.get(k), f"{key}.{k}")
        return True, out
    if origin in (list, Sequence) or tp is list:
        if not isinstance(value, list | tuple):
            return False, None
        item = args[0] if args else Any
        return True, [_value(item, v, None, f"{key}[{n}]") for n, v in enumerate(value)]
    if origin is tuple or tp is tuple:
        if not isinstance(value, list | tuple):
            return False, None
        if len(args) == 2 and args[1] is Ellipsis:
            kinds = [args[0]] * len(value)
        elif args:
            if len(args) != len(value):
                return False, None
            kinds = list(args)
        else:
            kinds = [Any] * len(value)
        items = zip(kinds, value, strict=True)
        return True, tuple(_value(t, v, None, f"{key}[{n}]") for n, (t, v) in enumerate(items))
    return _scalar(tp, value, strict)


def _scalar(tp: Any, value: Any, strict: bool) -> tuple[bool, Any]:
    if tp is bool:
        if isinstance(value, bool):
            return True, value
        if not strict and isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return True, value.lower() in _TRUE
        return False, None
    if isinstance(value, bool):
        return False, None
    if tp is int:
        if isinstance(value, int):
            return True, value
        if not strict and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return True, int(value)
        return False, None
    if tp is float:
        if isinstance(value, int | float):
            return True, float(value)
        if not strict and isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, None
        return False, None
    if tp is str:
        if isinstance(value, str):
            return True, value
        if not strict and isinstance(value, os.PathLike):
            return True, os.fspath(value)
        if not strict and isinstance(value, int | float):
            return True, str(value)
        return False, None
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value  # an annotation this checker does not know: taken as is


def _merge_plain(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge_plain(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _resolve_strings(cfg: Any, prefix: str = "") -> None:
    """Resolve ``${oc.env:NAME,default}``-style interpolations left in string fields (schema
    defaults that read the environment), as OmegaConf does."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _resolve_strings(value, f"{prefix}{f.name}.")
        elif isinstance(value, str) and "${" in value:
            from omegaconf import OmegaConf
            from omegaconf.errors import OmegaConfBaseException

            try:
                resolved = OmegaConf.to_container(OmegaConf.create({"v": value}), resolve=True)
            except OmegaConfBaseException as err:
                raise _TypeProblem(f"{prefix}{f.name}: {_first_line(err)}") from None
            object.__setattr__(cfg, f.name, resolved["v"])  # type: ignore[index]


def load_config(
    schema: type[T],
    source: Source = None,
    overrides: Sequence[str] = (),
    *,
    group: str | None = None,
    where: str = "",
    hydra: bool | None = None,
) -> T:
    """Schema defaults <- YAML ``source`` (file, ``configs/<group>/<name>``, or a mapping) <-
    ``key=value`` overrides, checked against ``schema``. A YAML with a defaults list (or any
    YAML with ``hydra=True``) is composed by Hydra, so group overrides work (``judge=llm``)."""
    data = load_dict(source, overrides, group=group, schema=schema, hydra=hydra)
    return from_dict(schema, data, where or (f"{group} config" if group else ""))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain (nested) dict of a schema instance (tuples as lists, so it dumps as YAML)."""

    def lists(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: lists(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [lists(v) for v in value]
        return value

    return lists(dataclasses.asdict(cfg))


def to_yaml(cfg: Any) -> str:
    """A schema instance (or a plain mapping) as YAML, in field order: what ``--cfg`` prints."""
    import yaml

    data = to_dict(cfg) if dataclasses.is_dataclass(cfg) else plain(cfg)
    return yaml.safe_dump(data, sort_keys=False)


# ----------------------------------------------------------------------------- help


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    if tp is type(None):
        return "None"
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


def help_text(f: dataclasses.Field) -> str:
    """The help text of one schema field (``metadata={"help": ...}``)."""
    return str(f.metadata.get("help", ""))


def describe(schema: type | Any, prefix: str = "") -> str:
    """Every key of ``schema`` (nested ones dotted) with its type, default and help text. An
    instance is described with its own values as the defaults (a role's nested sections)."""
    instance = schema if not isinstance(schema, type) else None
    cls = type(schema) if instance is not None else schema
    hints = _hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = getattr(instance, f.name) if instance is not None else _default(f)
        if dataclasses.is_dataclass(default):
            lines.append(f"{key}:  {help_text(f)}".rstrip())
            lines.append(describe(default, key + "."))
            continue
        kind = _type_name(hints.get(f.name, f.type))
        lines.append(f"{key} ({kind}) = {_show(default)}  {help_text(f)}")
    return "\n".join(line for line in lines if line)


def _show(value: Any) -> str:
    """A default as YAML writes it on one line (null, true, 'text', [a, b])."""
    import yaml

    try:
        text = yaml.safe_dump(_plain_value(value), default_flow_style=True, width=10**6)
    except yaml.YAMLError:
        return repr(value)
    return text.strip().removesuffix("...").strip()


def undocumented(schema: type, prefix: str = "") -> list[str]:
    """Keys of ``schema`` (recursively) that have no help text (tests keep this empty)."""
    missing = []
    for f in dataclasses.fields(schema):
        default = _default(f)
        if not help_text(f):
            missing.append(f"{prefix}{f.name}")
        if dataclasses.is_dataclass(default):
            missing += undocumented(type(default), f"{prefix}{f.name}.")
    return missing


def add_help_config(
    parser: argparse.ArgumentParser, *schemas: type | tuple[str, type | Any]
) -> None:
    """``--help-config``: print every key of the schema(s) with type, default and help, exit 0
    (like ``--help``, before any other argument is checked). A ``(title, schema)`` pair prints
    that schema under a heading; several schemas print one after the other."""

    class _HelpConfig(argparse.Action):
        def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
            super().__init__(
                option_strings,
                dest,
                nargs=0,
                default=argparse.SUPPRESS,
                help="print every config key with its type, default and help, and exit",
            )

        def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
            try:
                print(help_config(*schemas), flush=True)
            except BrokenPipeError:  # `... --help-config | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            parser.exit(0)

    parser.add_argument("--help-config", action=_HelpConfig)


def help_config(*schemas: type | tuple[str, type | Any]) -> str:
    """The ``--help-config`` text of one or more schemas."""
    blocks = []
    for item in schemas:
        title, schema = item if isinstance(item, tuple) else ("", item)
        text = describe(schema)
        blocks.append(f"# {title}\n{text}" if title else text)
    return "\n\n".join(blocks)
