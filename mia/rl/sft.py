"""Supervised fine-tuning (the cold start) on the RL engine.

    python -m mia.rl.sft [--config-name executor|planner] data.train=GOLD.jsonl [key=value ...]
    python -m executor_train mode=sft [key=value ...]   # the same, with configs/sft/executor.yaml
    python -m planner_train mode=sft [key=value ...]    # ... and configs/sft/planner.yaml

The same pieces as GRPO: :class:`~mia.rl.workers.PolicyGroup` workers (``single_process`` or Ray
with FSDP2), :meth:`PolicyModel.sft_step` (cross-entropy on the mask-1 tokens, micro-batches,
gradient accumulation, LR schedule), the checkpoints of :mod:`mia.rl.checkpoint` and the model
merger's Hugging Face export (LoRA merged in). Conversations are tokenised by replaying them
through the agent loop's :class:`~mia.agent.TokenPolicy` (:mod:`mia.rl.sft_data`), so training
sees exactly the ids a rollout holds: assistant tokens (and their end-of-turn) are trained, the
prompt, tool observations and other injected turns are context only.

Data: rows of JSONL / JSON / parquet files (``data.train``, ``data.val``), one conversation per
row and name in ``data.fields`` (gold files of ``mia gold``: ``messages`` for the Executor,
``planner_messages`` / ``reflection_messages`` for the Planner). ``data.train`` is required: the
warm start (:mod:`mia.apps.warm_start`) builds gold from a synthetic world and hands it over.

Outputs under ``run_dir``: ``metrics.jsonl`` (one line per step, ``val/loss`` when evaluated),
``checkpoints/`` (when ``save_freq`` >= 0) and, unless ``export: false``, the merged folder in
``output_dir`` (default ``<run_dir>/hf``) with ``sft.json`` (recipe, data counts, losses).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mia.config import add_help_config, check_known
from mia.errors import MiaError
from mia.paths import CONFIG_ROOT, atomic_write_text, resolve_run_dir
from mia.rl.metrics import LoggingConfig, MetricsLogger
from mia.rl.policy import PolicyConfig, config_from_dict, plain_config
from mia.rl.workers import WorkersConfig

log = logging.getLogger("mia.rl.sft")

CONFIG_DIR = CONFIG_ROOT
SUMMARY_FILE = "sft.json"
EMBEDDED = "embedded"  # model_path value for the built-in SmolLM2
Log = Callable[[str], None]


# ----------------------------------------------------------------------------- configuration


@dataclass
class SftDataConfig:
    train: list[str] = field(
        default_factory=list,
        metadata={
            "help": "gold JSONL files (mia gold, or the warm start's: python -m mia.apps.warm_start); required"
        },
    )
    val: list[str] = field(
        default_factory=list,
        metadata={"help": "validation files; [] = hold val_size questions out of train"},
    )
    fields: list[str] = field(
        default_factory=lambda: ["messages"], metadata={"help": "conversation field(s) of each row"}
    )
    val_size: int = field(
        default=0,
        metadata={"help": "questions (by id) held out of train for the val loss when val is []"},
    )
    max_length: int | None = field(
        default=2048,
        metadata={"help": "tokens; longer conversations are cut (the prompt must fit)"},
    )
    skip_images: bool = field(
        default=True, metadata={"help": "token-mode SFT is text-only (image questions are skipped)"}
    )
    chat_template_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "passed to the chat template when rendering"}
    )


@dataclass
class SftConfig:
    """Mirrors configs/sft/*.yaml."""

    model_path: str = field(
        default="",
        metadata={
            "help": 'Hugging Face folder, or "embedded" (the built-in SmolLM2-135M-Instruct)'
        },
    )
    run_dir: str = field(default="", metadata={"help": '"" = $MIA_HOME/runs/sft-<date>-<time>'})
    output_dir: str = field(
        default="", metadata={"help": 'merged Hugging Face folder; "" = <run_dir>/hf'}
    )
    seed: int = field(default=0, metadata={"help": "data order and torch seed"})
    epochs: int = field(default=1, metadata={"help": "passes over the conversations"})
    total_steps: int | None = field(
        default=None, metadata={"help": "null = epochs x (conversations // batch_size)"}
    )
    batch_size: int = field(default=8, metadata={"help": "conversations per optimizer step"})
    shuffle: bool = field(
        default=True, metadata={"help": "reshuffle the conversations every epoch"}
    )
    train_top_layers: int = field(
        default=0, metadata={"help": "> 0: only the top K decoder layers (+ final norm) train"}
    )
    eval_every: int = field(
        default=0,
        metadata={"help": "val loss every K steps (and at the end); 0 = start and end only"},
    )
    eval_at_start: bool = field(default=True, metadata={"help": "val loss before the first step"})
    save_freq: int = field(
        default=0, metadata={"help": "checkpoint every K steps; 0 = only at the end; -1 = never"}
    )
    keep_last: int | None = field(
        default=None, metadata={"help": "keep this many newest checkpoints; null = all"}
    )
    checkpoint_dir: str | None = field(
        default=None, metadata={"help": "null = <run_dir>/checkpoints"}
    )
    resume: bool | str = field(
        default=False,
        metadata={
            "help": "true = the latest complete checkpoint under checkpoint_dir | a step folder"
        },
    )
    export: bool = field(
        default=True, metadata={"help": "write the merged Hugging Face folder (LoRA merged in)"}
    )
    export_dtype: str = field(
        default="auto", metadata={"help": "auto (the base model's) | float32 | bfloat16 | float16"}
    )
    logging: LoggingConfig = field(
        default_factory=LoggingConfig, metadata={"help": "console, JSONL and wandb metrics"}
    )
    data: SftDataConfig = field(
        default_factory=SftDataConfig, metadata={"help": "the conversations"}
    )
    policy: PolicyConfig = field(
        default_factory=PolicyConfig,
        metadata={"help": "the trained model (optimizer, LoRA, micro-batches)"},
    )
    workers: WorkersConfig = field(
        default_factory=lambda: WorkersConfig(mode="single_process"),
        metadata={"help": "how the policy runs (single_process by default)"},
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | SftConfig) -> SftConfig:
        if isinstance(data, cls):
            return data.validate()
        raw = plain_config(data)
        raw.pop("defaults", None)
        check_known(cls, raw, "sft")
        kwargs = dict(raw)
        kwargs["logging"] = LoggingConfig.from_dict(raw.get("logging"))
        kwargs["policy"] = PolicyConfig.from_dict(raw.get("policy") or {})
        workers = dict(raw.get("workers") or {})
        check_known(WorkersConfig, workers, "workers")
        kwargs["workers"] = WorkersConfig(**{"mode": "single_process", **workers})
        data_raw = dict(raw.get("data") or {})
        for key in ("train", "val", "fields"):
            if isinstance(data_raw.get(key), str):
                data_raw[key] = [data_raw[key]]
            elif data_raw.get(key) is None and key in data_raw:
                data_raw[key] = []
        kwargs["data"] = config_from_dict(SftDataConfig, data_raw)
        return cls(**kwargs).validate()

    def validate(self) -> SftConfig:
        checks = [
            (self.epochs >= 1, "epochs must be >= 1"),
            (self.total_steps is None or self.total_steps >= 0, "total_steps must be >= 0"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.train_top_layers >= 0, "train_top_layers must be >= 0"),
            (self.eval_every >= 0, "eval_every must be >= 0"),
            (self.save_freq >= -1, "save_freq must be >= -1"),
            (self.data.val_size >= 0, "data.val_size must be >= 0"),
            (bool(self.data.fields), "data.fields must name at least one conversation field"),
            (
                self.data.max_length is None or self.data.max_length >= 2,
                "data.max_length must be >= 2 or null",
            ),
            (
                self.batch_size % self.workers.world_size == 0,
                f"batch_size {self.batch_size} must split evenly over workers.world_size "
                f"{self.workers.world_size}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"sft: {message}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def top_layer_patterns(model_path: str | Path, k: int) -> list[str]:
    """``policy.trainable`` regexes for the top ``k`` decoder layers and the final norm."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = int(text.num_hidden_layers)
    if k > n:
        raise MiaError(f"train_top_layers={k} but the model has {n} layers")
    layers = "|".join(str(i) for i in range(n - k, n))
    return [rf"\.layers\.({layers})\.", r"(^|\.)norm\.weight$"]


# ----------------------------------------------------------------------------- result


@dataclass
class SftResult:
    output_dir: Path | None
    run_dir: Path
    steps: int
    history: list[dict[str, Any]]
    val_loss_start: float | None
    val_loss_end: float | None
    data: dict[str, Any]
    seconds: float


# ----------------------------------------------------------------------------- the run


class SftRun:
    """``SftRun(cfg).fit()``: tokenise, train ``total_steps`` steps, evaluate, export."""

    def __init__(self, cfg: SftConfig | Mapping[str, Any], *, say: Log | None = None) -> None:
        self.cfg = SftConfig.from_dict(cfg)
        self.say: Log = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.run_dir = resolve_run_dir(self.cfg.run_dir, "sft")
        self.ckpt_dir = Path(self.cfg.checkpoint_dir or self.run_dir / "checkpoints")
        self.output_dir = Path(self.cfg.output_dir) if self.cfg.output_dir else self.run_dir / "hf"
        self.model_path = self._resolve_model()
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.policy: Any = None
        self._ray_ctx: Any = None
        self._logger: MetricsLogger | None = None

    # ------------------------------------------------------------------ setup
    def _resolve_model(self) -> Path:
        if not self.cfg.model_path:
            raise MiaError("sft: set model_path=DIR (a Hugging Face folder) or model_path=embedded")
        if self.cfg.model_path == EMBEDDED:
            from mia.models.embedded import embedded_model_dir

            return embedded_model_dir()
        path = Path(self.cfg.model_path)
        if not (path / "config.json").is_file():
            raise MiaError(f"sft: model folder not found (no config.json): {path}")
        return path

    def load_data(self) -> None:
        """Rows -> tokenised train / val conversations (``self.train``, ``self.val``)."""
        from transformers import AutoTokenizer

        from mia.rl.sft_data import load_rows, tokenize_rows

        d = self.cfg.data
        if not d.train:
            # SFT trains on data it is given; building gold from a world is the warm start's
            # job (an app above the engine), so the engine never imports it.
            raise MiaError(
                "sft: data.train is empty: give gold JSONL files (mia gold), or build the "
                "warm-start recipe with: python -m mia.apps.warm_start"
            )
        rows = load_rows(d.train)
        val_rows = load_rows(d.val) if d.val else []
        if not d.val and d.val_size:
            rows, val_rows = split_by_id(rows, d.val_size, self.cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        kw = dict(
            fields=d.fields,
            max_length=d.max_length,
            skip_images=d.skip_images,
            chat_template_kwargs=d.chat_template_kwargs,
        )
        self.train, report = tokenize_rows(rows, self.tokenizer, **kw)  # type: ignore[arg-type]
        self.val, val_report = tokenize_rows(val_rows, self.tokenizer, **kw)  # type: ignore[arg-type]
        self.report = {"train": asdict(report), "val": asdict(val_report)}
        self.say(f"sft data: train {report.summary()}; val {val_report.summary()}")
        for err in report.errors[:3]:
            self.say(f"  refused: {err}")
        if len(self.train) < self.cfg.batch_size:
            raise MiaError(
                f"sft: {len(self.train)} training conversations, fewer than "
                f"batch_size={self.cfg.batch_size}"
            )

    def policy_config(self) -> PolicyConfig:
        p = PolicyConfig.from_dict(self.cfg.policy.to_dict())
        p.model_path = str(self.model_path)
        if self.cfg.train_top_layers and not p.trainable:
            p.trainable = top_layer_patterns(self.model_path, self.cfg.train_top_layers)
        if p.optim.schedule == "cosine" and p.optim.total_steps <= 0:
            p.optim.total_steps = max(self.total_steps, p.optim.warmup_steps + 1)
        return p

    def setup(self) -> SftRun:
        from mia.rl.trainer import DataCursor
        from mia.rl.workers import PolicyGroup

        self.load_data()
        self.cursor = DataCursor(
            len(self.train), self.cfg.batch_size, self.cfg.shuffle, self.cfg.seed
        )
        self.total_steps = (
            self.cfg.total_steps
            if self.cfg.total_steps is not None
            else self.cfg.epochs * self.cursor.steps_per_epoch
        )
        torch.manual_seed(self.cfg.seed)
        if self.cfg.workers.mode == "ray":
            from mia.rl.ray_utils import start_private_ray

            self._ray_ctx = start_private_ray(
                self.run_dir, self.cfg.workers.ray_num_cpus, self.cfg.workers.ray_address
            )
        t0 = time.perf_counter()
        self.policy = PolicyGroup.from_config(self.policy_config(), self.cfg.workers)
        log.info("policy ready in %.1f s", time.perf_counter() - t0)
        resumed = self._maybe_resume()
        if resumed:
            self.say(f"sft: resumed from {resumed} at step {self.step}")
        self._logger = MetricsLogger(
            self.run_dir,
            replace(self.cfg.logging, console=False),  # our own bar (loss, tok/s, ETA)
            total_steps=self.total_steps,
            start_step=self.step,
            run_config=self.cfg.to_dict(),
        )
        return self

    def _maybe_resume(self) -> str | None:
        from mia.rl.checkpoint import resume_path
        from mia.rl.trainer import DataCursor

        path = resume_path(self.cfg.resume, self.ckpt_dir)
        if path is None:
            return None

        info = self.policy.load_checkpoint(path)
        state = info.get("data_state") or {}
        self.step = int(state.get("sft_step", info["step"]))
        self.cursor = DataCursor(
            len(self.train),
            self.cfg.batch_size,
            self.cfg.shuffle,
            self.cfg.seed,
            epoch=int(state.get("epoch", 0)),
            cursor=int(state.get("cursor", 0)),
        )
        return str(info["path"])

    def save_checkpoint(self) -> Path:
        state = {**self.cursor.state(), "sft_step": self.step}
        return self.policy.save_checkpoint(
            self.ckpt_dir, step=self.step, data_state=state, keep_last=self.cfg.keep_last
        )

    def close(self) -> None:
        if self._logger is not None:
            self._logger.close()
            self._logger = None
        if self.policy is not None:
            self.policy.shutdown()
            self.policy = None
        if self._ray_ctx is not None:
            self._ray_ctx.__exit__(None, None, None)
            self._ray_ctx = None

    # ------------------------------------------------------------------ steps
    def batch(self, items: Sequence[Any]) -> dict[str, Any]:
        from mia.rl.episode import collate

        pad = self.tokenizer.pad_token_id
        return collate(list(items), pad_id=int(pad if pad is not None else 0))

    def val_loss(self) -> float | None:
        """Mean negative log-likelihood per trained token over the val conversations."""
        if not self.val:
            return None
        nll, count = 0.0, 0.0
        size = max(self.cfg.batch_size, self.cfg.workers.world_size)
        for start in range(0, len(self.val), size):
            batch = self.batch(self.val[start : start + size])
            lp = self.policy.compute_logprobs(batch)
            mask = batch["response_mask"].to(lp.dtype)
            nll -= float((lp * mask).sum())
            count += float(mask.sum())
        return nll / max(count, 1.0)

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = self.batch([self.train[i] for i in self.cursor.next()])
        metrics = self.policy.sft_step(batch)
        self.step += 1
        seconds = time.perf_counter() - t0
        tokens = float(batch["attention_mask"].sum())
        out = {
            "sft/loss": metrics["loss"],
            "sft/grad_norm": metrics["grad_norm"],
            "sft/lr": metrics["lr"],
            "sft/trained_tokens": metrics["n_tokens"],
            "sft/epoch": float(self.cursor.epoch),
            "perf/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "time/step": seconds,
        }
        return out

    def fit(self) -> SftResult:
        started = time.perf_counter()
        self.setup()
        try:
            return self._fit(started)
        finally:
            self.close()

    def _fit(self, started: float) -> SftResult:
        cfg = self.cfg
        assert self._logger is not None
        first = self.val_loss() if cfg.eval_at_start and self.step == 0 else None
        if first is not None:
            self.say(f"sft: val loss before training {first:.4f} ({len(self.val)} conversations)")
        bar = self._bar()
        last_val: float | None = None
        try:
            while self.step < self.total_steps:
                metrics = self.train_step()
                at_end = self.step >= self.total_steps
                if cfg.eval_every and (self.step % cfg.eval_every == 0) or at_end:
                    last_val = self.val_loss()
                    if last_val is not None:
                        metrics["val/loss"] = last_val
                self._logger.log(self.step, metrics)
                self.history.append({"step": self.step, **metrics})
                if bar is not None:
                    post = {"loss": f"{metrics['sft/loss']:.3f}"}
                    if "val/loss" in metrics:
                        post["val"] = f"{metrics['val/loss']:.3f}"
                    post["tok/s"] = f"{metrics['perf/tokens_per_s']:.0f}"
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
                if cfg.save_freq > 0 and self.step % cfg.save_freq == 0 and not at_end:
                    self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
        if cfg.save_freq >= 0 and self.total_steps > 0:
            self.save_checkpoint()
        if last_val is None and self.total_steps == 0:
            last_val = first
        out = None
        if cfg.export:
            out = self.export(first, last_val)
        seconds = time.perf_counter() - started
        summary = f"sft: done, {self.step} steps in {seconds:.0f} s"
        if first is not None and last_val is not None:
            summary += f", val loss {first:.4f} -> {last_val:.4f}"
        self.say(summary + (f"; model in {out}" if out else ""))
        return SftResult(
            output_dir=out,
            run_dir=self.run_dir,
            steps=self.step,
            history=self.history,
            val_loss_start=first,
            val_loss_end=last_val,
            data=self.report,
            seconds=seconds,
        )

    def _bar(self) -> Any:
        if not self.cfg.logging.console:
            return None
        from tqdm import tqdm

        return tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="sft",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def export(self, val_start: float | None, val_end: float | None) -> Path:
        out = self.policy.export_hf(self.output_dir, self.cfg.export_dtype)
        # The base folder's build marker (e.g. the embedded model's) does not describe this one.
        (out / "mia-model.json").unlink(missing_ok=True)
        summary = {
            "base_model": str(self.model_path),
            "steps": self.step,
            "val_loss_start": val_start,
            "val_loss_end": val_end,
            "train_loss_last": self.history[-1]["sft/loss"] if self.history else None,
            "data": self.report,
            "config": self.cfg.to_dict(),
        }
        atomic_write_text(out / SUMMARY_FILE, json.dumps(_finite(summary), indent=2) + "\n")
        return out


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def split_by_id(
    rows: list[dict[str, Any]], n_val: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Hold out every row of ``n_val`` ids (rows sharing an id, e.g. one question with and
    without a plan, stay on one side), chosen from ``seed``."""
    ids = list(dict.fromkeys(str(r.get("id", i)) for i, r in enumerate(rows)))
    if n_val >= len(ids):
        raise MiaError(f"data.val_size={n_val} leaves no training rows ({len(ids)} ids)")
    order = np.random.default_rng([seed, 7]).permutation(len(ids))
    held = {ids[int(i)] for i in order[:n_val]}
    train = [r for i, r in enumerate(rows) if str(r.get("id", i)) not in held]
    val = [r for i, r in enumerate(rows) if str(r.get("id", i)) in held]
    return train, val


def train_sft(cfg: SftConfig | Mapping[str, Any], *, say: Log | None = None) -> SftResult:
    """Run SFT from a config; returns the result (losses, history, the exported folder)."""
    return SftRun(cfg, say=say).fit()


def run_sft(cfg: SftConfig | Mapping[str, Any]) -> Path:
    """Run SFT and return the merged Hugging Face folder (``export`` must be on)."""
    cfg = SftConfig.from_dict(cfg)
    if not cfg.export:
        raise MiaError("run_sft returns the exported folder: set export=true")
    result = train_sft(cfg)
    assert result.output_dir is not None
    return result.output_dir


# ----------------------------------------------------------------------------- CLI


def compose(
    config_name: str,
    overrides: list[str],
    config_dir: str | Path | None = None,
    schema: type = SftConfig,
    group: str = "sft",
) -> dict:
    """``configs/sft/<name>.yaml``, ``config_dir/<name>.yaml`` or a YAML file path, with Hydra
    overrides. ``configs/`` is on the search path, so a recipe kept elsewhere can still pull the
    engine's groups (``/rl/policy@policy``, ``/rl/workers@workers``)."""
    from mia.rl.__main__ import compose as hydra_compose

    path = Path(config_name)
    name = path.name[:-5] if path.name.endswith(".yaml") else path.name
    if config_dir is not None:
        cdir = Path(config_dir)
    elif len(path.parts) > 1 or (path.suffix == ".yaml" and path.is_file()):  # a file
        cdir = path.parent
    else:
        return hydra_compose(CONFIG_DIR, f"{group}/{name}", list(overrides), schema)
    search = f"hydra.searchpath=[file://{CONFIG_DIR}]"
    return hydra_compose(cdir, name, [search, *overrides], schema)


def main(argv: list[str] | None = None, prog: str = "python -m mia.rl.sft") -> None:
    """The command line; ``prog`` names the program in errors (``python -m executor_train
    mode=sft`` hands over here)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config-name", default="executor", help="configs/sft/NAME.yaml or a YAML file"
    )
    parser.add_argument("--config-dir", help="another folder of configs (NAME.yaml inside)")
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    add_help_config(parser, SftConfig)
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra override syntax)")
    args = parser.parse_intermixed_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cfg = compose(args.config_name, args.overrides, args.config_dir)
        if args.cfg:
            import yaml

            print(yaml.safe_dump(cfg, sort_keys=False))
            return
        out = run_sft(cfg)
        print(f"done: {out}")
    except MiaError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


if __name__ == "__main__":
    main()
