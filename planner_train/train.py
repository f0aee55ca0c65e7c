"""``python -m planner_train``: Planner GRPO as a configuration of the engine.

The trained Executor is frozen behind the serve service; every rollout plans, lets the Executor
run the plan, reflects (yes/no) and may replan once (:mod:`mia.planner.episode`); the reward
is docs/reference.md §7.2 (:mod:`mia.planner.reward`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mia.errors import MiaError
from mia.planner.episode import PlannerEpisode
from mia.planner.reward import PlannerReward
from mia.roles.common import (
    build_judge,
    clients,
    resolve_model,
    role_main,
    trainer_section,
)
from mia.roles.samples import load_samples


def make_episode(cfg: Mapping[str, Any]) -> PlannerEpisode:
    executor, memory = clients(dict(cfg.get("services") or {}))
    return PlannerEpisode(
        executor,
        memory,
        cfg.get("episode"),
        chat_template_kwargs=cfg.get("chat_template_kwargs") or None,
    )


def build_trainer(cfg: Mapping[str, Any], *, generator: Any = None, judge: Any = None) -> Any:
    from mia.rl.trainer import Trainer

    data = dict(cfg.get("data") or {})
    if not data.get("train"):
        raise MiaError("set data.train=FILE (reference parquet, JSON or JSONL)")
    train = load_samples(data["train"], limit=data.get("limit"))
    val = load_samples(data["val"], limit=data.get("val_limit")) if data.get("val") else None
    judge = (
        judge if judge is not None else build_judge(cfg.get("judge"), cfg.get("llm", "embedded"))
    )
    episode = make_episode(cfg)
    reward = PlannerReward(judge, cfg.get("reward"))
    model = resolve_model(str(cfg.get("model_path", "")))
    return Trainer(
        trainer_section(cfg, model), episode, reward, train, val_dataset=val, generator=generator
    )


def run(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    trainer = build_trainer(cfg)
    history = trainer.fit()
    print(
        f"planner_train: {trainer.step} steps; metrics {trainer.run_dir / 'metrics.jsonl'}; "
        f"checkpoints {trainer.ckpt_dir}",
        flush=True,
    )
    return history


def main(argv: list[str] | None = None) -> None:
    role_main(
        "python -m planner_train",
        "Planner GRPO: plan -> Executor (serve) -> reflect -> optional replan "
        "(configs/planner_train/).",
        "planner_train",
        run,
        argv,
        sft_config="planner",
    )
