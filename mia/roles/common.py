"""What the role trainers (executor_train, planner_train, ttrl, ttrl_streaming) share: Hydra
composition of a role config with the engine's groups, the trainer section, judges, services and
the command-line wrapper. Roles are configurations of one engine (``mia.rl.Trainer``); this
module is the glue, not a second engine.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import CONFIG_ROOT
from mia.services import ExecutorClient, MemoryClient

CONFIG_ROOT = CONFIG_ROOT
# Keys of configs/rl/trainer.yaml meant for `python -m mia.rl` only.
ENGINE_ENTRY_KEYS = ("episode", "episode_kwargs", "reward", "data")


def compose_role(role: str, config_name: str, overrides: list[str]) -> dict[str, Any]:
    """The composed config of ``configs/<role>/<config_name>.yaml`` as a plain dict.

    The role folder is the primary config dir; ``configs/`` is on the search path so role files
    can pull the engine's groups (``/rl/trainer@trainer``, ``/reward@reward: planner``,
    ``/judge@judge: rules``, ``/agent/train@agent``) and be overridden the usual Hydra way
    (``judge=llm``, ``experiment=paper``, ``trainer.n=4``).
    """
    from mia.rl.__main__ import compose

    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    cfg_dir = CONFIG_ROOT / role
    path = Path(name)
    if path.is_absolute() or path.parent != Path("."):  # a config file elsewhere
        cfg_dir, name = path.parent.resolve(), path.name
    search = f"hydra.searchpath=[file://{CONFIG_ROOT}]"
    return compose(cfg_dir, name, [search, *overrides])


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


def trainer_section(cfg: Mapping[str, Any], model_path: str, run_dir: str = "") -> dict[str, Any]:
    """The ``trainer`` section ready for :class:`mia.rl.trainer.TrainerConfig`."""
    section = dict(cfg.get("trainer") or {})
    for key in ENGINE_ENTRY_KEYS:
        section.pop(key, None)
    section["model_path"] = model_path
    if run_dir and not section.get("run_dir"):
        section["run_dir"] = run_dir
    return section


def build_judge(judge_cfg: Mapping[str, Any] | None, llm: str | Mapping[str, Any] = "embedded"):
    """A judge from a ``judge`` config; LLM-backed ones build only their role's backend."""
    from mia.judge import build_judge as _build
    from mia.llm.config import build_backend, load_llm_config, role_configs

    cfg = dict(judge_cfg or {"type": "rules"})
    if cfg.get("type", "rules") == "rules":
        return _build(cfg)
    role = cfg.get("role", "judge")
    roles = role_configs(load_llm_config(llm))
    if role not in roles:
        raise MiaError(f"llm config {llm}: no role {role!r} (has {sorted(roles)})")
    return _build(cfg, backend=build_backend(roles[role], name=role))


def service_kwargs(services: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Client arguments for one service from a ``services`` section
    (``<prefix>_url``, ``token``, ``timeout_s``); the token may come from ``token_env``."""
    token = services.get(f"{prefix}_token") or services.get("token")
    env = services.get("token_env")
    if not token and env:
        token = os.environ.get(str(env))
    return {"token": token or None, "timeout_s": float(services.get("timeout_s", 600.0))}


def memory_client(services: Mapping[str, Any]) -> MemoryClient | None:
    url = services.get("memory_url")
    return MemoryClient(str(url), **service_kwargs(services, "memory")) if url else None


def clients(services: Mapping[str, Any]) -> tuple[ExecutorClient, MemoryClient | None]:
    """The Executor service (required) and memory_serve (optional) from a ``services`` section."""
    if not services.get("executor_url"):
        raise MiaError("set services.executor_url (the serve service, python -m serve)")
    executor = ExecutorClient(str(services["executor_url"]), **service_kwargs(services, "executor"))
    url = services.get("memory_url")
    memory = MemoryClient(str(url), **service_kwargs(services, "memory")) if url else None
    return executor, memory


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
    run: Callable[[dict[str, Any]], Any],
    argv: list[str] | None = None,
    default_config: str = "default",
    sft_config: str | None = None,
) -> None:
    """``python -m <role> [--config-name NAME] [--cfg] [key=value ...]``; a MiaError is one
    line on stderr and exit 2. With ``sft_config``, ``mode=sft`` hands the rest of the command
    line to :mod:`mia.rl.sft` with ``configs/sft/<sft_config>.yaml`` (``mode=grpo``, the
    default, trains with ``run``)."""
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
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
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
        cfg = compose_role(role, args.config_name, overrides)
        if args.cfg:
            import yaml

            print(yaml.safe_dump(cfg, sort_keys=False))
            return
        setup_logging(args.log_level)
        run(cfg)
    except MiaError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
