"""TTRL on veRL (docs/reference.md §8): the Planner loop (``mia_planner``, memories from
``/memory``) with the Planner reward, each rollout buffered in memory_serve by the reward
(``reward_kwargs.bank_url``: ``/memory_bank_save``), and after every step the memory hooks the
reference's forked trainer ran: ``/batch_evaluate`` -> ``/consolidate_memories`` ->
``/save_memory``. The hooks are :func:`commit_step`; :func:`register` adds veRL's v1 trainer
``mia_ttrl`` (veRL's synchronous trainer plus the hooks at the end of each step), selected with
``trainer.v1.trainer_mode=mia_ttrl``. veRL's task runner must have imported this module first:
the recipe's Ray ``worker_process_setup_hook`` (:func:`mia.verl.setup.setup_worker`) does.
"""

from __future__ import annotations

import logging
from typing import Any

from mia.verl.config import TTRLHooks, VerlMiaConfig

log = logging.getLogger("mia.verl.ttrl")
TRAINER = "mia_ttrl"


def commit_step(client: Any, step: int, hooks: TTRLHooks) -> dict[str, Any]:
    """One step's memory writes over a :class:`mia.services.MemoryClient`'s ``sync`` view."""
    out: dict[str, Any] = {}
    if hooks.eval_dir:
        out["ttrl/selected_accuracy"] = client.sync.batch_evaluate(
            hooks.eval_dir, step=step
        ).accuracy
    res = client.sync.consolidate()
    out["ttrl/saved_positives"] = res.saved_positives
    out["ttrl/saved_negatives"] = res.saved_negatives
    out["ttrl/saved_plan_pairs"] = res.saved_plan_pairs
    if hooks.save_path:
        client.sync.save_memory(hooks.save_path)
    return out


def memory_client(cfg: VerlMiaConfig) -> Any:
    from mia.roles.common import service_kwargs
    from mia.services import MemoryClient

    if not cfg.services.memory_url:
        raise ValueError("TTRL needs mia.services.memory_url (memory_serve)")
    return MemoryClient(cfg.services.memory_url, **service_kwargs(cfg.services, "memory"))


def register() -> type:
    """Register veRL's v1 trainer ``mia_ttrl`` (idempotent) and return it."""
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls, register_trainer

    try:
        return get_trainer_cls(TRAINER)
    except ValueError:
        pass

    from mia.verl.config import load_mia_config

    @register_trainer(TRAINER)
    class MiaTTRLTrainer(PPOTrainerSync):
        """veRL's synchronous trainer + TTRL's memory hooks after each step."""

        def on_step_end(self) -> None:
            super().on_step_end()
            cfg = load_mia_config(self.config.get("mia"))
            client = memory_client(cfg)
            try:
                info = commit_step(client, int(self.global_steps), cfg.ttrl)
            finally:
                client.close()
            log.info("TTRL step %s: %s", self.global_steps, info)

    return MiaTTRLTrainer
