"""What the role trainers (executor_train, planner_train, ttrl, ttrl_streaming) share: their
config loading (Hydra composition of a role YAML with the engine's groups, over the role
schema's defaults, validated by :mod:`mia.config`), the trainer section, judges, services and
the command-line wrapper. Roles are configurations of one engine (``mia.rl.Trainer``); this
module is the glue, not a second engine.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mia.cli_support import cli_errors
from mia.config import add_help_config, compose, from_dict, resolve_path, to_yaml
from mia.errors import MiaError
from mia.paths import CONFIG_ROOT
from mia.services import ExecutorClient, MemoryClient

if TYPE_CHECKING:
    from mia.rl.trainer import TrainerConfig

CONFIG_ROOT = CONFIG_ROOT
T = TypeVar("T")


def role_config_path(role: str, config_name: str) -> Path:
    """``configs/<role>/<name>.yaml``, or a YAML file elsewhere (a path, ``.yaml`` optional)."""
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    path = Path(name)
    if path.is_absolute() or path.parent != Path("."):  # a config file elsewhere
        return resolve_path(f"{name}.yaml")
    named = CONFIG_ROOT / role / f"{name}.yaml"
    if not named.is_file():
        raise MiaError(f"config {named} not found")
    return named


def compose_role(
    role: str, config_name: str, overrides: Sequence[str], schema: type | None = None
) -> dict[str, Any]:
    """The composed config of ``configs/<role>/<config_name>.yaml`` as a plain dict, over the
    defaults of the role's ``schema`` when given (:func:`mia.config.compose`).

    The role folder is the primary config dir; ``configs/`` is on the search path so role files
    can pull the engine's groups (``/rl/trainer@trainer``, ``/reward@reward: planner``,
    ``/judge@judge: rules``) and be overridden the usual Hydra way (``judge=llm``,
    ``experiment=paper``, ``trainer.n=4``).
    """
    return compose(role_config_path(role, config_name), list(overrides), schema)


def load_role(
    schema: type[T], role: str, config_name: str = "default", overrides: Sequence[str] = ()
) -> T:
    """A role's typed config: the schema's defaults <- ``configs/<role>/<config_name>.yaml``
    (composed) <- overrides, validated (unknown keys and wrong types are one-line errors)."""
    data = compose_role(role, config_name, overrides, schema)
    return check_trainer(from_dict(schema, data, f"{role} config"))


def role_config(schema: type[T], cfg: T | Mapping[str, Any], role: str) -> T:
    """``cfg`` as the role's schema: an instance as is, a composed mapping validated."""
    return check_trainer(from_dict(schema, cfg, f"{role} config"))


def check_trainer(cfg: T) -> T:
    """Validates a copy of the role's ``trainer`` section now, as the Trainer will when it
    starts (with the model path it will get), so a bad trainer override fails at load, not
    after the services or the demo's earlier stages have run."""
    section = getattr(cfg, "trainer", None)
    if section is None:
        return cfg
    from mia.rl.trainer import TrainerConfig  # loaded already: the schema holds one

    if isinstance(section, TrainerConfig):
        trainer_section(cfg, str(getattr(cfg, "model_path", "") or "unset")).validate()
    return cfg


def resolve_model(path: str) -> str:
    """``embedded`` -> the embedded default model folder (built once); else the path."""
    if not path:
        raise MiaError(
            "model_path is empty: set model_path=DIR (a Hugging Face folder) or embedded"
        )
    from mia.llm.config import resolve_model_path

    resolved = resolve_model_path(str(path))
    if not resolved.exists():
        raise MiaError(f"model folder not found: {resolved}")
    return str(resolved)


def trainer_section(cfg: Any, model_path: str, run_dir: str = "") -> TrainerConfig:
    """A copy of the role's ``trainer`` section ready for :class:`mia.rl.trainer.Trainer`:
    ``model_path`` set, and ``run_dir`` when the section has none."""
    section = copy.deepcopy(cfg.trainer)
    section.model_path = model_path
    if run_dir and not section.run_dir:
        section.run_dir = run_dir
    return section


def grpo_trainer(
    cfg: Any,
    make_episode: Callable[[Any], Any],
    reward_cls: Callable[[Any, Any], Any],
    *,
    generator: Any = None,
    judge: Any = None,
    text_only: bool = False,
) -> Any:
    """The :class:`mia.rl.trainer.Trainer` of a GRPO role (executor_train, planner_train) from
    its validated config: the ``data`` section's samples (``text_only``: image questions
    skipped), the ``judge`` (built from ``cfg.judge`` and ``cfg.llm`` unless given),
    ``make_episode(judge)``, ``reward_cls(judge, cfg.reward)`` and the ``trainer`` section on
    ``cfg.model_path``; ``generator`` replaces the one the trainer would build."""
    from mia.rl.trainer import Trainer
    from mia.roles.samples import load_samples

    data = cfg.data
    if not data.train:
        raise MiaError("set data.train=FILE (reference parquet, JSON or JSONL)")
    train = load_samples(data.train, text_only=text_only, limit=data.limit)
    val = load_samples(data.val, text_only=text_only, limit=data.val_limit) if data.val else None
    judge = judge if judge is not None else build_judge(cfg.judge, cfg.llm)
    episode = make_episode(judge)
    reward = reward_cls(judge, cfg.reward)
    section = trainer_section(cfg, resolve_model(cfg.model_path))
    return Trainer(section, episode, reward, train, val_dataset=val, generator=generator)


def fit_role(role: str, trainer: Any) -> list[dict[str, Any]]:
    """Train ``trainer`` to the end; one line says where its metrics and checkpoints are."""
    history = trainer.fit()
    print(
        f"{role}: {trainer.step} steps; metrics {trainer.run_dir / 'metrics.jsonl'}; "
        f"checkpoints {trainer.ckpt_dir}",
        flush=True,
    )
    return history


def build_judge(judge_cfg: Any, llm: str | Mapping[str, Any] = "embedded"):
    """A judge from a ``judge`` config (:class:`mia.judge.JudgeConfig` or a mapping of its
    fields); LLM-backed ones build only their role's backend."""
    from mia.judge import JudgeConfig
    from mia.judge import build_judge as _build
    from mia.llm.config import build_backend, load_llm_config, role_configs

    cfg = judge_cfg if isinstance(judge_cfg, JudgeConfig) else from_dict(JudgeConfig, judge_cfg)
    if cfg.type == "rules":
        return _build(cfg)
    roles = role_configs(load_llm_config(llm))
    if cfg.role not in roles:
        raise MiaError(f"llm config {llm}: no role {cfg.role!r} (has {sorted(roles)})")
    return _build(cfg, backend=build_backend(roles[cfg.role], name=cfg.role))


def service_kwargs(services: Any, prefix: str) -> dict[str, Any]:
    """Client arguments for one service from a ``services`` section (``<prefix>_token`` or
    ``token``, ``timeout_s``); the token may come from the env var ``token_env``."""
    token = getattr(services, f"{prefix}_token", None) or services.token
    if not token and services.token_env:
        token = os.environ.get(str(services.token_env))
    return {"token": token or None, "timeout_s": float(services.timeout_s)}


def memory_client(services: Any) -> MemoryClient | None:
    url = services.memory_url
    return MemoryClient(str(url), **service_kwargs(services, "memory")) if url else None


def clients(services: Any) -> tuple[ExecutorClient, MemoryClient | None]:
    """The Executor service (required) and memory_serve (optional) from a ``services`` section."""
    if not services.executor_url:
        raise MiaError("set services.executor_url (the serve service, python -m serve)")
    executor = ExecutorClient(str(services.executor_url), **service_kwargs(services, "executor"))
    return executor, memory_client(services)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Per-request lines from the HTTP client drown the progress lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def split_mode(overrides: list[str]) -> tuple[str, list[str]]:
    """``mode=grpo|sft`` (the last one wins; default grpo) and the other overrides."""
    modes = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "mode"]
    mode = modes[-1] if modes else "grpo"
    if mode not in ("grpo", "sft"):
        raise MiaError(f"mode must be grpo or sft, got {mode!r}")
    return mode, [o for o in overrides if o.split("=", 1)[0] != "mode"]


def role_main(
    prog: str,
    description: str,
    role: str,
    run: Callable[[Any], Any],
    argv: list[str] | None = None,
    default_config: str = "default",
    sft_config: str | None = None,
    *,
    schema: type,
) -> None:
    """``python -m <role> [--config-name NAME] [--cfg] [--help-config] [key=value ...]``: the
    config composed over ``schema``'s defaults and validated, then ``run(cfg)``; a MiaError is
    one line on stderr and exit 2. With ``sft_config``, ``mode=sft`` hands the rest of the
    command line to :mod:`mia.rl.sft` with ``configs/sft/<sft_config>.yaml`` (``mode=grpo``,
    the default, trains with ``run``)."""
    epilog = (
        f"mode=sft: supervised fine-tuning with configs/sft/{sft_config}.yaml instead of GRPO "
        "(its keys: python -m mia.rl.sft --help, or add --cfg)"
        if sft_config
        else None
    )
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    parser.add_argument(
        "--config-name",
        "--config",
        dest="config_name",
        default=default_config,
        help=f"a config in configs/{role}/ or a YAML file (default: {default_config})",
    )
    parser.add_argument(
        "--cfg", action="store_true", help="print the composed config (defaults filled) and exit"
    )
    add_help_config(parser, schema)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "offline")
    with cli_errors(prog):
        bad = [o for o in args.overrides if "=" not in o]
        if bad:
            raise MiaError(f"overrides must look like key=value, got {bad}")
        overrides = list(args.overrides)
        if sft_config is not None:
            mode, overrides = split_mode(overrides)
            if mode == "sft":
                from mia.rl.sft import main as sft_main

                name = sft_config if args.config_name == default_config else args.config_name
                setup_logging(args.log_level)
                sft_main(["--config-name", name, *(["--cfg"] * args.cfg), *overrides], prog)
                return
        cfg = load_role(schema, role, args.config_name, overrides)
        if args.cfg:
            print(to_yaml(cfg))
            return
        setup_logging(args.log_level)
        run(cfg)
