"""``python -m mia.rl``: GRPO training from configs/rl/trainer.yaml (Hydra composition).

    python -m mia.rl model_path=DIR episode=MODULE:ATTR reward=MODULE:ATTR data.train=FILE \\
        [data.val=FILE] [n=8 batch_size=8 total_steps=100 policy.optim.lr=1e-6 ...]

``episode`` names an Episode object, or a factory called with the loaded samples (train + val;
e.g. to build a tool that knows them) and ``episode_kwargs``. ``reward`` names
``reward_fn(sample, trajectory)``. Data files hold one mapping per sample (JSONL, JSON list,
parquet). ``--config-dir``/``--config-name`` choose another file (role trainers ship theirs);
``--cfg`` prints the composed config and exits. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import config_dir

CONFIG_DIR = config_dir("rl")
ENTRY_KEYS = ("episode", "episode_kwargs", "reward", "data")


def compose(config_dir: str | Path, config_name: str, overrides: list[str]) -> dict[str, Any]:
    """The composed config as a plain dict (Hydra defaults list + ``key=value`` overrides)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cdir = Path(config_dir).resolve()
    if not (cdir / f"{config_name}.yaml").is_file():
        raise MiaError(f"config {cdir / (config_name + '.yaml')} not found")
    try:
        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config: {str(err).splitlines()[0]}") from None


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


def build(cfg: dict[str, Any]) -> Any:
    """A Trainer from a composed config (entry keys resolved, the rest is TrainerConfig)."""
    from mia.rl.episode import Episode
    from mia.rl.trainer import Trainer

    entry = {k: cfg.pop(k, None) for k in ENTRY_KEYS}
    data = entry["data"] or {}
    for key in ("episode", "reward"):
        if not entry[key]:
            raise MiaError(f"set {key}=MODULE:ATTR")
    if not data.get("train"):
        raise MiaError("set data.train=FILE (JSONL, JSON or parquet samples)")
    train = load_samples(data["train"])
    val = load_samples(data["val"]) if data.get("val") else None
    episode = import_target(entry["episode"], "episode")
    if inspect.isclass(episode) or not isinstance(episode, Episode):
        episode = episode(train + (val or []), **(entry["episode_kwargs"] or {}))
    reward = import_target(entry["reward"], "reward")
    return Trainer(cfg, episode, reward, train, val_dataset=val)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mia.rl", description=__doc__.split("\n")[0])
    parser.add_argument("--config-dir", default=str(CONFIG_DIR))
    parser.add_argument("--config-name", default="trainer")
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra override syntax)")
    args = parser.parse_args(argv)
    try:
        cfg = compose(args.config_dir, args.config_name, args.overrides)
        if args.cfg:
            import yaml

            print(yaml.safe_dump(cfg, sort_keys=False))
            return
        trainer = build(cfg)
        trainer.fit()
        print(f"done: {trainer.step} steps, metrics in {trainer.run_dir / 'metrics.jsonl'}")
    except MiaError as err:
        print(f"mia.rl: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
