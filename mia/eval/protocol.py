"""The efficacy protocol file (docs/protocol.md; ``configs/efficacy/protocol.yaml`` and
``dev.yaml``): its schema, its loader, and the question streams it fixes.

    protocol = load_protocol("configs/efficacy/dev.yaml")   # checked: one MiaError line
    protocol.kind                                          # "dev" | "test" (the seed range)
    stream = protocol_stream(load_qa(world / "test.jsonl"), protocol.stream)
    ordered(stream, "shuffled", 10000)                     # random.Random("mia-protocol-order:10000")

A protocol file states every key (a later change of a default must not change a protocol);
its worlds are all dev seeds or all test seeds (``configs/world/seeds.yaml``). The runner is
:mod:`mia.apps.protocol`; the statistics are :mod:`mia.eval.protocol_stats`.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mia.config import from_dict, option, section
from mia.data.formats import QAItem
from mia.errors import MiaError
from mia.eval.templates import STANDARD_TYPES, question_type

ORDERS = ("file", "shuffled")
KINDS = ("standard", "convention")
TYPES = (*STANDARD_TYPES, "convention")
SCOPES = ("all", *KINDS, "each_type", *TYPES)
TTRL_MODES = ("supervised", "nogt")
PRECISIONS = ("float32", "auto")
# Row overrides are the demo config's evaluation and TTRL keys; these belong to the stream
# (the protocol's), to the services (shared by every row of a world) or to the rows' list.
FIXED_KEYS = (
    "eval.services",
    "eval.policies",
    "eval.dataset",
    "eval.limit",
    "eval.offset",
    "eval.modality",
    "ttrl.enabled",
    "ttrl.modes",
)


@dataclass
class StreamSpec:
    """A world's stream: which of its test questions, in file order."""

    conventions: int | str = option(
        "all", "the split's convention questions: all | N (the first N, in file order)"
    )
    standard: int = option(
        24, "the first N standard text questions (single_hop, bridge, comparison), file order"
    )


@dataclass
class RowSpec:
    """One row of the table: a ``mia eval`` policy or a TTRL pass, with demo config keys."""

    policy: str | None = option(None, "a mia eval policy (mia.eval.policies.POLICIES)")
    ttrl: str | None = option(None, "a TTRL pass instead: supervised | nogt")
    overrides: list[str] = option(
        [],
        "mia demo config keys (eval.* and ttrl.*, key=value) over the demo's values for this "
        "row; not the stream's or the services' keys",
    )


@dataclass
class TargetSpec:
    """One pre-registered target: a paired difference of two rows on a scope."""

    name: str = option("", "the target's name")
    metric: str = option("", "'<row> - <row>': the paired difference")
    on: str = option(
        "all",
        "all | standard | convention | each_type (every question type must meet it) | one "
        "question type (single_hop, bridge, comparison, convention)",
    )
    at_least: float | None = option(None, "the difference must be >= this (a fraction)")
    above: float | None = option(None, "the difference must be > this")
    interval_above: float | None = option(
        None, "the clustered 95% interval's low end must be > this"
    )

    @property
    def rows(self) -> tuple[str, str]:
        a, sep, b = self.metric.partition(" - ")
        return a.strip(), b.strip()


@dataclass
class Protocol:
    """A protocol file (docs/protocol.md): every key stated."""

    version: int = option(1, "the protocol's version (a change is a new version)")
    worlds: list[int] = option([], "world seeds: all dev seeds or all test seeds")
    size: str = option("default", "world size: small | default | large")
    split: str = option("test", "the split the streams come from: test")
    stream: StreamSpec = section(StreamSpec, "each world's stream")
    orders: list[str] = option(
        list(ORDERS),
        "file | shuffled (random.Random('mia-protocol-order:<world seed>')); every row runs "
        "on every world in every order, each time on a fresh memory",
    )
    precision: str = option("float32", "float32 (MIA_BF16=0) | auto (the machine's choice)")
    judge: str = option("rule", "rule: the rule-based judge, exact match with aliases")
    rows: dict[str, RowSpec] = option({}, "row name -> what runs")
    baselines: list[str] = option([], "the memory baselines of --baselines (a second table)")
    clusters: str = option(
        "world_template", "world_template: a cluster is one template of one world, both orders"
    )
    targets: list[TargetSpec] = option([], "the pre-registered targets")

    @property
    def kind(self) -> str:
        """``test`` or ``dev``: the seed range of the worlds."""
        from mia.data.world_lexicon import seed_ranges

        return seed_ranges().of(self.worlds[0])

    def validate(self) -> Protocol:
        from mia.baselines import BASELINES
        from mia.data.world_lexicon import seed_ranges

        ranges = seed_ranges()
        kinds = {ranges.of(seed) for seed in self.worlds}  # a seed in no range raises
        checks = [
            (self.version >= 1, "version must be >= 1"),
            (bool(self.worlds), "worlds must not be empty"),
            (len(set(self.worlds)) == len(self.worlds), "a world is listed twice"),
            (
                len(kinds) == 1 and kinds <= {"dev", "test"},
                f"worlds must all be dev seeds or all test seeds, not {sorted(kinds)}",
            ),
            (self.size in ("small", "default", "large"), "size must be small, default or large"),
            (self.split == "test", "split must be test"),
            (
                self.stream.conventions == "all"
                or (isinstance(self.stream.conventions, int) and self.stream.conventions >= 0),
                "stream.conventions must be all or a number >= 0",
            ),
            (self.stream.standard >= 0, "stream.standard must be >= 0"),
            (
                bool(self.orders) and set(self.orders) <= set(ORDERS),
                f"orders must be a non-empty list of {ORDERS}",
            ),
            (len(set(self.orders)) == len(self.orders), "an order is listed twice"),
            (self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}"),
            (self.judge == "rule", "judge must be rule"),
            (bool(self.rows), "rows must not be empty"),
            (
                set(self.baselines) <= set(BASELINES),
                f"baselines must be among {sorted(BASELINES)}",
            ),
            (self.clusters == "world_template", "clusters must be world_template"),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(message)
        for name, row in self.rows.items():
            _check_row(name, row)
        for target in self.targets:
            _check_target(target, self.rows)
        return self


def _check_row(name: str, row: RowSpec) -> None:
    from mia.eval.policies import POLICIES

    if (row.policy is None) == (row.ttrl is None):
        raise MiaError(f"rows.{name}: give exactly one of policy and ttrl")
    if row.policy is not None and row.policy not in POLICIES:
        raise MiaError(f"rows.{name}: unknown policy {row.policy!r} (known: {POLICIES})")
    if row.ttrl is not None and row.ttrl not in TTRL_MODES:
        raise MiaError(f"rows.{name}: ttrl must be one of {TTRL_MODES}")
    for over in row.overrides:
        key, sep, _ = over.partition("=")
        if not sep or not key.startswith(("eval.", "ttrl.")):
            raise MiaError(f"rows.{name}: override {over!r} is not eval.*=... or ttrl.*=...")
        if any(key == k or key.startswith(f"{k}.") for k in FIXED_KEYS):
            raise MiaError(f"rows.{name}: {key} is the protocol's to fix, not a row's")


def _check_target(target: TargetSpec, rows: dict[str, RowSpec]) -> None:
    a, b = target.rows
    if not target.name:
        raise MiaError("targets: every target needs a name")
    if not a or not b or a not in rows or b not in rows:
        raise MiaError(f"targets.{target.name}: metric must be '<row> - <row>' of two rows")
    if target.on not in SCOPES:
        raise MiaError(f"targets.{target.name}: on must be one of {SCOPES}")
    if target.at_least is None and target.above is None and target.interval_above is None:
        raise MiaError(f"targets.{target.name}: give at_least, above or interval_above")


@functools.cache
def _yaml12_loader() -> type:
    """PyYAML's safe loader with YAML 1.2's booleans: only true/false (any case). YAML 1.1
    also reads on/off/yes/no as booleans, which would turn the targets' ``on:`` key into
    ``True``."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    resolvers = {
        first: [(tag, rx) for tag, rx in found if tag != "tag:yaml.org,2002:bool"]
        for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.yaml_implicit_resolvers = resolvers
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    return Loader


def load_protocol(path: str | Path) -> Protocol:
    """The protocol file at ``path``, checked: every key present, none unknown (in rows and
    targets too), every value valid. Every problem is one MiaError line naming the file."""
    import yaml

    where = f"protocol {path}"
    file = Path(path)
    if not file.is_file():
        raise MiaError(f"{where}: no such file")
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_yaml12_loader())  # noqa: S506
    except yaml.YAMLError as err:
        raise MiaError(f"{where}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise MiaError(f"{where}: not a mapping")
    names = [f.name for f in dataclasses.fields(Protocol)]
    missing = [n for n in names if n not in data]
    if missing:
        raise MiaError(f"{where}: missing key(s) {missing} (a protocol states every key)")
    for section_name, schema, entries in (
        ("rows", RowSpec, (data.get("rows") or {}).items()),
        ("targets", TargetSpec, enumerate(data.get("targets") or [])),
    ):
        known = {f.name for f in dataclasses.fields(schema)}
        for key, entry in entries:
            bad = sorted(set(entry) - known) if isinstance(entry, dict) else ["(not a mapping)"]
            if bad:
                raise MiaError(
                    f"{where}: {section_name}.{key}: unknown key(s) {bad} (known: {sorted(known)})"
                )
    try:
        return from_dict(Protocol, data, where)
    except MiaError as err:
        message = str(err)
        raise MiaError(message if message.startswith(where) else f"{where}: {message}") from None


# ----------------------------------------------------------------------------- streams


def protocol_stream(
    items: Sequence[QAItem], conventions: int | str = "all", standard: int = 24
) -> list[QAItem]:
    """A world's stream: of its text questions, the convention questions (``all`` or the first
    N) and the first ``standard`` standard questions (single_hop, bridge, comparison), kept in
    file order."""
    text = [it for it in items if it.modality == "text-only"]
    conv = [it for it in text if question_type(it) == "convention"]
    if conventions != "all":
        conv = conv[: int(conventions)]
    std = [it for it in text if question_type(it) in STANDARD_TYPES][:standard]
    keep = {it.id for it in [*conv, *std]}
    return [it for it in items if it.id in keep]


def ordered(stream: Sequence[QAItem], order: str, seed: int) -> list[QAItem]:
    """The stream in ``order``: ``file`` as given, ``shuffled`` permuted with
    ``random.Random("mia-protocol-order:<seed>")``."""
    if order not in ORDERS:
        raise MiaError(f"unknown order {order!r} (one of {ORDERS})")
    out = list(stream)
    if order == "shuffled":
        random.Random(f"mia-protocol-order:{seed}").shuffle(out)
    return out


def describe_stream(protocol: Protocol) -> str:
    """One line: what each world's stream holds."""
    s = protocol.stream
    conv = (
        "every convention question"
        if s.conventions == "all"
        else (f"the first {s.conventions} convention questions")
    )
    return (
        f"{conv} and the first {s.standard} standard text questions of each world's "
        f"{protocol.split} split, in file order"
    )


def row_summary(protocol: Protocol) -> dict[str, Any]:
    """name -> what the row runs (for the run's summary JSON)."""
    return {name: dataclasses.asdict(row) for name, row in protocol.rows.items()}
