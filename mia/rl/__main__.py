"""``python -m mia.rl``: GRPO training from configs/rl/trainer.yaml (Hydra composition).

    python -m mia.rl model_path=DIR episode=MODULE:ATTR reward=MODULE:ATTR data.train=FILE \\
        [data.val=FILE] [n=8 batch_size=8 total_steps=100 policy.optim.lr=1e-6 ...]

``episode`` names an Episode object, or a factory called with the loaded samples (train + val;
e.g. to build a tool that knows them) and ``episode_kwargs``. ``reward`` names
``reward_fn(sample, trajectory)``. Data files hold one mapping per sample (JSONL, JSON list,
parquet). ``--config-dir``/``--config-name`` choose another file (role trainers ship theirs);
``--cfg`` prints the composed config (every key, defaults filled) and exits; ``--help-config``
lists every key with its type, default and help. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mia.config import add_help_config, from_dict, option, section, to_yaml
from mia.config import compose as compose_file
from mia.errors import MiaError
from mia.paths import config_dir
from mia.rl.trainer import TrainerConfig

CONFIG_DIR = config_dir("rl")


@dataclass
class RunData:
    """The samples of ``python -m mia.rl``."""

    train: str | None = option(None, "JSONL / JSON / parquet file of samples (one mapping each)")
    val: str | None = option(None, "validation samples (same formats); null = none")


@dataclass
class RunConfig(TrainerConfig):
    """``python -m mia.rl``: the trainer's keys plus what the command line builds (the Trainer
    API takes objects instead)."""

    episode: str | None = option(
        None, "MODULE:ATTR: an Episode, or a factory called with the samples (train + val)"
    )
    episode_kwargs: dict[str, Any] = option({}, "extra keyword arguments for that factory")
    reward: str | None = option(
        None, "MODULE:ATTR, reward_fn(sample, trajectory) -> score | (score, extras)"
    )
    data: RunData = section(RunData, "the samples")

    def validate(self) -> RunConfig:
        return self  # the Trainer validates its part (model_path, ...) when it is built

    def trainer_config(self) -> TrainerConfig:
        """The :class:`TrainerConfig` part (without the command-line keys)."""
        names = [f.name for f in fields(TrainerConfig)]
        return TrainerConfig(**{name: getattr(self, name) for name in names})


def compose(
    config_dir: str | Path, config_name: str, overrides: list[str], schema: type | None = None
) -> dict[str, Any]:
    """The composed config ``<config_dir>/<config_name>.yaml`` as a plain dict (Hydra defaults
    list + ``key=value`` overrides, over ``schema``'s defaults; :func:`mia.config.compose`)."""
    path = Path(config_dir) / f"{config_name}.yaml"
    return compose_file(path, overrides, schema, config_dir=config_dir)


def import_target(target: str, what: str) -> Any:
    module, sep, attr = str(target).partition(":")
    if not sep or not module or not attr:
        raise MiaError(f"{what} must be MODULE:ATTR, got {target!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise MiaError(f"cannot import {what} {target!r}: {err}") from None


def load_samples(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL / JSON-list / parquet file as dicts."""
    p = Path(path)
    if not p.is_file():
        raise MiaError(f"data file not found: {p}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".json":
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise MiaError(f"{p}: not valid JSON ({err})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise MiaError(f"{p}: expected one JSON object per sample")
    return rows


def build(cfg: Mapping[str, Any] | RunConfig) -> Any:
    """A Trainer from a composed config (entry keys resolved, the rest is TrainerConfig)."""
    from mia.rl.episode import Episode
    from mia.rl.trainer import Trainer

    run = from_dict(RunConfig, cfg, "mia.rl config")
    for key in ("episode", "reward"):
        if not getattr(run, key):
            raise MiaError(f"set {key}=MODULE:ATTR")
    if not run.data.train:
        raise MiaError("set data.train=FILE (JSONL, JSON or parquet samples)")
    train = load_samples(run.data.train)
    val = load_samples(run.data.val) if run.data.val else None
    episode = import_target(str(run.episode), "episode")
    if inspect.isclass(episode) or not isinstance(episode, Episode):
        episode = episode(train + (val or []), **run.episode_kwargs)
    reward = import_target(str(run.reward), "reward")
    return Trainer(run.trainer_config(), episode, reward, train, val_dataset=val)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mia.rl", description=__doc__.split("\n")[0])
    parser.add_argument("--config-dir", default=str(CONFIG_DIR))
    parser.add_argument("--config-name", default="trainer")
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    add_help_config(parser, RunConfig)
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra override syntax)")
    args = parser.parse_args(argv)
    try:
        raw = compose(args.config_dir, args.config_name, args.overrides, RunConfig)
        cfg = from_dict(RunConfig, raw, "mia.rl config")
        if args.cfg:
            print(to_yaml(cfg))
            return
        trainer = build(cfg)
        trainer.fit()
        print(f"done: {trainer.step} steps, metrics in {trainer.run_dir / 'metrics.jsonl'}")
    except MiaError as err:
        print(f"mia.rl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
