"""recipes/verl: each recipe composes with veRL 0.9's own Hydra config (its ppo_trainer.yaml)
and the overrides its run script passes, passes veRL's ``validate_config``, its sections build
veRL's dataclasses, and the MIA plug-ins it names (agent loops, reward function, Ray setup
hook, the ``mia`` section, TTRL's trainer) resolve.

Runs in .venv-peers (``.venv-peers/bin/python -m pytest -q -k verl tests/test_verl_*.py``); in
the main .venv, which has no veRL, the module skips."""

from __future__ import annotations

import importlib
import inspect

import pytest

try:
    import verl  # noqa: F401
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
except Exception as exc:  # ImportError, or veRL's own imports failing beside our stack
    pytest.skip(
        f"veRL not importable here ({type(exc).__name__}: {exc}); the veRL tests run in "
        ".venv-peers: bash scripts/install_peers.sh",
        allow_module_level=True,
    )

from verl_recipes import CONFIG_DIR, compose, script_overrides

from mia.verl.config import load_mia_config

RECIPES = ["executor_grpo", "planner_grpo", "ttrl", "ttrl_nogt"]
# docs/reference.md §9: (GPUs, batch, n, prompt, response, lr, epochs, save_freq, loop)
REFERENCE = {
    "executor_grpo": (8, 128, 8, 16384, 16384, 1e-6, 8, 10, "mia_executor"),
    "planner_grpo": (4, 128, 8, 24576, 8192, 1e-6, 5, 10, "mia_planner"),
    "ttrl": (4, 32, 4, 24576, 8192, 1e-6, 1, 50, "mia_planner"),
    "ttrl_nogt": (4, 8, 4, 24576, 8192, 2e-7, 3, 500, "mia_planner"),
}


@pytest.mark.parametrize("name", RECIPES)
def test_verl_recipe_composes_and_validates(name: str) -> None:
    config, overrides = script_overrides(name)
    assert config == name
    cfg = compose(config, overrides)
    OmegaConf.resolve(cfg)  # every interpolation (env defaults, ${mia...}) resolves
    validate_config(
        cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
    # veRL's dataclasses of the sections the agent loop workers read.
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.multi_turn.enable and rollout.name == "vllm" and rollout.mode == "async"
    gpus, batch, n, prompt, response, lr, epochs, save, loop = REFERENCE[name]
    got = (
        cfg.trainer.n_gpus_per_node,
        cfg.data.train_batch_size,
        cfg.actor_rollout_ref.rollout.n,
        cfg.data.max_prompt_length,
        cfg.data.max_response_length,
        cfg.actor_rollout_ref.actor.optim.lr,
        cfg.trainer.total_epochs,
        cfg.trainer.save_freq,
        cfg.actor_rollout_ref.rollout.agent.default_agent_loop,
    )
    assert got == (gpus, batch, n, prompt, response, pytest.approx(lr), epochs, save, loop)
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.actor_rollout_ref.actor.use_kl_loss
    # MIA's section validates (schema, types, no temperature of its own).
    mia = load_mia_config(cfg.mia)
    assert mia.services.memory_url == "http://127.0.0.1:5000"
    # The agent loop file names the two loops, which import and carry veRL's registration.
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    path = cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path
    entries = OmegaConf.load(CONFIG_DIR.parents[2] / path)
    assert [e.name for e in entries] == ["mia_executor", "mia_planner"]
    for e in entries:
        module, cls = e._target_.rsplit(".", 1)
        assert inspect.isclass(getattr(importlib.import_module(module), cls))
        assert _agent_loop_registry[e.name]["_target_"] == e._target_
    # The reward function veRL loads from the config (reward_kwargs bound) is MIA's, async.
    fn = get_custom_reward_fn(cfg)
    assert fn.args[0].__module__ == "mia.verl.rewards" and inspect.iscoroutinefunction(fn.args[0])
    hook = cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
    module, attr = hook.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), attr))
    kwargs = cfg.reward.custom_reward_function.reward_kwargs
    assert (kwargs.get("bank_url") is not None) == name.startswith("ttrl")
    assert (cfg.trainer.v1.trainer_mode == "mia_ttrl") == name.startswith("ttrl")
    assert kwargs.get("mode", "gt") == ("nogt" if name == "ttrl_nogt" else "gt")


def test_verl_run_scripts_pass_resume_and_the_reference_variables() -> None:
    name, overrides = script_overrides(
        "executor_grpo",
        {
            "RESUME_FROM_PATH": "/ckpt/global_step_20",
            "REPLAN_URL": "http://10.0.0.2:5000/replan_train",
            "TEST_CACHE_DIR": "/c/train,/c/test",
            "N_GPUS": "4",
        },
    )
    cfg = compose(name, overrides)
    assert cfg.trainer.resume_mode == "resume_path"
    assert cfg.trainer.resume_from_path == "/ckpt/global_step_20"
    assert cfg.mia.services.memory_url == "http://10.0.0.2:5000"
    assert list(cfg.mia.agent.tools.web_image_to_image_search.params.cache_roots) == [
        "/c/train",
        "/c/test",
    ]
    assert cfg.trainer.n_gpus_per_node == 4
    name, overrides = script_overrides("planner_grpo", {"RESUME_MODE": "disable"})
    cfg = compose(name, overrides)
    assert cfg.trainer.resume_mode == "disable" and cfg.trainer.resume_from_path is None
    assert cfg.mia.services.executor_url == "http://127.0.0.1:5001"


def test_verl_mia_section_refuses_a_temperature_of_its_own() -> None:
    from mia.errors import MiaError

    cfg = compose("executor_grpo", ["+mia.agent.sampling.temperature=0.7"])
    with pytest.raises(MiaError, match="actor_rollout_ref.rollout.temperature"):
        load_mia_config(cfg.mia)
