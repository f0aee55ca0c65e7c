"""Ray's ``worker_process_setup_hook`` for veRL runs with MIA's plug-ins (the recipes set
``ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=mia.verl.setup.setup_worker``):
every Ray worker imports MIA's agent loops (registered with veRL's ``register``) and, where
veRL's v1 trainers import, registers TTRL's trainer (``trainer.v1.trainer_mode=mia_ttrl``)."""

from __future__ import annotations

import logging

log = logging.getLogger("mia.verl")


def setup_worker() -> None:
    import mia.verl.agent_loops  # noqa: F401  (registers mia_executor and mia_planner)

    try:
        from mia.verl import ttrl

        ttrl.register()
    except ImportError as err:  # v1 needs transfer_queue: a v0 run does not
        log.debug("veRL's v1 trainers do not import here (%s): mia_ttrl not registered", err)
