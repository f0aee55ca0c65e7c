"""The GRPO trainer's configuration (``python -m mia.rl``; a role's ``trainer`` section) and
its checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from mia.config import from_dict, option, section
from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.rl.generators.base import GeneratorConfig
from mia.rl.metrics import LoggingConfig
from mia.rl.policy_config import PolicyConfig
from mia.rl.workers import WorkersConfig

OLD_LOGPROB_MODES = ("auto", "recompute", "rollout")
SYNC_MODES = ("state_dict", "folder")
ROLLOUT_ERROR_MODES = ("raise", "drop")


def _default_sampling() -> dict[str, Any]:
    return {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512}


@dataclass
class TrainerConfig:
    """The GRPO trainer (``python -m mia.rl``; a role's ``trainer`` section)."""

    model_path: str = option(
        "", "Hugging Face folder; fills policy.model_path and generator.model_path when unset"
    )
    run_dir: str = option("", '"" = $MIA_HOME/runs/grpo-<date>-<time>')
    seed: int = option(0, "data order, rollout sampling seeds, torch")
    total_steps: int | None = option(None, "null = epochs x (len(train data) // batch_size)")
    epochs: int = option(1, "passes over the train data")
    batch_size: int = option(8, "prompts per step")
    n: int = option(8, "rollouts per prompt (the GRPO group size)")
    mini_batch_size: int | None = option(
        None, "sequences per optimizer step; null = all batch_size x n at once"
    )
    ppo_epochs: int = option(1, "passes over each step's rollouts")
    shuffle: bool = option(True, "reshuffle the data every epoch (from seed)")
    norm_adv_by_std: bool = option(
        True, "GRPO: (r - mean) / std per group; false = Dr. GRPO (r - mean)"
    )
    old_logprobs: str = option(
        "auto",
        "auto: with one optimizer step per batch (ppo_epochs 1, one mini-batch) the update's own "
        "log-probs, detached (exact: the weights are those that sampled the batch; TRL with "
        "num_iterations=1), else recompute | recompute: one more policy forward before the "
        "updates | rollout: the generator's (no forward; needs loss.temperature 1)",
    )
    weight_sync: str = option(
        "state_dict", "state_dict: in-process copy | folder: export a HF folder + reload"
    )
    max_concurrent_rollouts: int | None = option(
        None, "rollouts in flight at once; null = all of the step's"
    )
    rollout_errors: str = option(
        "raise", "raise | drop (a failed rollout drops its whole group, logged)"
    )
    skip_tied_steps: bool = option(
        True,
        "no optimizer step when every group is tied (all advantages 0): Adam would still move "
        "the weights along its stale momentum, with no learning signal",
    )
    sampling: dict[str, Any] = section(
        _default_sampling,
        "rollout sampling (mia.llm.SamplingParams; max_tokens per assistant turn); the agent "
        "config may override",
    )
    save_freq: int = option(0, "checkpoint every K steps; 0 = only at the end; -1 = never")
    keep_last: int | None = option(None, "keep this many newest checkpoints; null = all")
    checkpoint_dir: str | None = option(None, "null = <run_dir>/checkpoints")
    resume: bool | str = option(
        False, "true = the latest complete checkpoint under checkpoint_dir | a step folder"
    )
    val_every: int = option(0, "validate on the val data every K steps; 0 = never")
    val_at_start: bool = option(False, "validate before the first step")
    val_n: int = option(1, "rollouts per validation sample")
    val_sampling: dict[str, Any] = option(
        {}, "overrides of sampling for validation, e.g. {temperature: 0}"
    )
    log_rollouts: int = option(0, "rollouts per step written to <run_dir>/rollouts.jsonl")
    logging: LoggingConfig = section(LoggingConfig, "console, JSONL and wandb metrics")
    policy: PolicyConfig = section(PolicyConfig, "the trainable policy (model, optimizer, loss)")
    workers: WorkersConfig = section(WorkersConfig, "how the policy runs (ray | single_process)")
    generator: GeneratorConfig = section(
        lambda: GeneratorConfig(max_batch_size=64),
        "the rollout generator (transformers | vllm); max_batch_size 64: n x batch_size "
        "rollouts decode together",
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | TrainerConfig) -> TrainerConfig:
        if isinstance(data, cls):
            return data.validate()
        return from_dict(cls, data, "trainer")

    def validate(self) -> TrainerConfig:
        if not self.policy.model_path:
            self.policy.model_path = self.model_path
        if not self.generator.model_path and self.generator.backend == "vllm":
            self.generator.model_path = self.policy.model_path
        if not self.policy.model_path:
            raise MiaError("trainer: set model_path (a Hugging Face model folder)")
        checks = [
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.n >= 1, "n must be >= 1"),
            (self.epochs >= 1, "epochs must be >= 1"),
            (self.total_steps is None or self.total_steps >= 0, "total_steps must be >= 0"),
            (self.ppo_epochs >= 1, "ppo_epochs must be >= 1"),
            (
                self.mini_batch_size is None or self.mini_batch_size >= 1,
                "mini_batch_size must be >= 1 or null",
            ),
            (self.old_logprobs in OLD_LOGPROB_MODES, f"old_logprobs: one of {OLD_LOGPROB_MODES}"),
            (self.weight_sync in SYNC_MODES, f"weight_sync: one of {SYNC_MODES}"),
            (
                self.rollout_errors in ROLLOUT_ERROR_MODES,
                f"rollout_errors: one of {ROLLOUT_ERROR_MODES}",
            ),
            (self.save_freq >= -1, "save_freq must be >= -1"),
            (self.val_every >= 0 and self.val_n >= 1, "val_every >= 0 and val_n >= 1"),
            (
                self.max_concurrent_rollouts is None or self.max_concurrent_rollouts >= 1,
                "max_concurrent_rollouts must be >= 1 or null",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise MiaError(f"trainer: {message}")
        known = {f.name for f in fields(SamplingParams)}
        for name, params in (("sampling", self.sampling), ("val_sampling", self.val_sampling)):
            bad = sorted(set(params) - known)
            if bad:
                raise MiaError(f"trainer: unknown {name} key(s) {bad} (known: {sorted(known)})")
        if self.old_logprobs == "rollout" and self.policy.loss.temperature != 1.0:
            # Generators report log-probs of the raw distribution (before temperature).
            raise MiaError(
                "trainer: old_logprobs=rollout needs policy.loss.temperature=1.0 (generators "
                "return raw log-probs); use old_logprobs=recompute"
            )
        check_loss_temperature(SamplingParams(**self.sampling).temperature, self, "sampling")
        if self.workers.ray_address is None:  # a private single-node cluster: this machine
            from mia.rl import placement

            placement.check_placement(self, placement.node_gpus())
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_loss_temperature(sampled: float, cfg: TrainerConfig, where: str) -> None:
    """Rollouts sampled at ``sampled`` must be scored by the loss at the same temperature, or
    the loss weighs tokens under another distribution than the one that drew them (greedy
    rollouts, temperature 0, take any). ``where`` names the setting that sampled them."""
    if sampled > 0 and sampled != cfg.policy.loss.temperature:
        raise MiaError(
            f"trainer: {where}.temperature={sampled:g} but policy.loss.temperature="
            f"{cfg.policy.loss.temperature:g}; set both to the same value (0 = greedy rollouts, "
            "any loss temperature)"
        )
