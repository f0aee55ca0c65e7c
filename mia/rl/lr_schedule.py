"""The learning-rate schedule of the policy's optimizer: a linear warmup, then constant or a
cosine decay."""

from __future__ import annotations

import math

from mia.errors import MiaError


class LRSchedule:
    """lr multiplier per optimizer step; a plain object so LambdaLR can save its state."""

    def __init__(self, warmup_steps: int, schedule: str, total_steps: int, min_lr_ratio: float):
        if schedule not in ("constant", "cosine"):
            raise MiaError(f"unknown lr schedule {schedule!r} (constant | cosine)")
        if schedule == "cosine" and total_steps <= warmup_steps:
            raise MiaError("a cosine schedule needs optim.total_steps > optim.warmup_steps")
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps  # the first step already learns
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )
