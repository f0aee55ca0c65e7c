"""``python -m executor_train``: Executor GRPO as a configuration of the engine.

``build_trainer(cfg)`` turns a composed ``configs/executor_train`` config into a
:class:`mia.rl.trainer.Trainer` over :class:`~executor_train.episode.ExecutorEpisode` and
:class:`~executor_train.episode.ExecutorReward`; ``run(cfg)`` trains it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executor_train.episode import ExecutorEpisode, ExecutorReward
from mia.agent import load_agent_config
from mia.errors import MiaError
from mia.roles.common import (
    build_judge,
    memory_client,
    resolve_model,
    role_main,
    trainer_section,
)
from mia.roles.samples import load_samples


def build_trainer(
    cfg: Mapping[str, Any], *, generator: Any = None, judge: Any = None, tools: Any = None
) -> Any:
    """A ready-to-fit Trainer. ``generator`` / ``judge`` / ``tools`` replace what the config
    would build (tests, embedding in other programs)."""
    from mia.rl.trainer import Trainer

    data = dict(cfg.get("data") or {})
    if not data.get("train"):
        raise MiaError("set data.train=FILE (reference parquet, JSON or JSONL)")
    text_only = bool(data.get("text_only", True))
    train = load_samples(data["train"], text_only=text_only, limit=data.get("limit"))
    val = (
        load_samples(data["val"], text_only=text_only, limit=data.get("val_limit"))
        if data.get("val")
        else None
    )
    services = dict(cfg.get("services") or {})
    judge = (
        judge if judge is not None else build_judge(cfg.get("judge"), cfg.get("llm", "embedded"))
    )
    agent = load_agent_config(dict(cfg.get("agent") or {}))
    episode = ExecutorEpisode(
        tools,
        agent,
        judge=judge,
        memory=memory_client(services),
        reward_cfg=cfg.get("reward"),
        replan=bool(cfg.get("replan", True)),
        missing_plan=str(cfg.get("missing_plan", "plan")),
        chat_template_kwargs=cfg.get("chat_template_kwargs") or None,
    )
    reward = ExecutorReward(judge, cfg.get("reward"))
    model = resolve_model(str(cfg.get("model_path", "")))
    section = trainer_section(cfg, model)
    return Trainer(section, episode, reward, train, val_dataset=val, generator=generator)


def run(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    trainer = build_trainer(cfg)
    history = trainer.fit()
    print(
        f"executor_train: {trainer.step} steps; metrics {trainer.run_dir / 'metrics.jsonl'}; "
        f"checkpoints {trainer.ckpt_dir}",
        flush=True,
    )
    return history


def main(argv: list[str] | None = None) -> None:
    role_main(
        "python -m executor_train",
        "Executor GRPO: the Executor loop with tools and one replan on failure "
        "(configs/executor_train/).",
        "executor_train",
        run,
        argv,
        sft_config="executor",
    )
