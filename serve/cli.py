"""``python -m serve`` (also ``mia serve``): the Executor service on 127.0.0.1:5001."""

from __future__ import annotations

import argparse
import logging
import sys

from mia.cli_support import cli_errors, serve_app
from mia.config import add_help_config
from mia.http import add_server_args

from .config import ServeConfig

log = logging.getLogger("serve")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m serve",
        description="Executor service: POST /execute, POST /continue, the reference's "
        "POST /plan and POST /replan, GET /health. Trailing key=value arguments override the config "
        "(e.g. llm.backend=openai llm.base_url=http://127.0.0.1:8000/v1 "
        "agent.tools.search.params.backend=web).",
    )
    add_server_args(p, default_port=5001, env_prefix="SERVE")
    p.add_argument("--config", default=None, help="YAML or a name in configs/serve/ (e.g. vllm)")
    p.add_argument(
        "--agent-config",
        default=None,
        help="YAML (or a name in configs/agent/) merged into the agent section (e.g. web)",
    )
    add_help_config(p, ServeConfig)
    p.add_argument("--log-level", default="WARNING", type=str.upper)
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _describe(cfg) -> str:  # type: ignore[no-untyped-def]
    llm = cfg.llm
    where = llm.base_url if llm.backend == "openai" else llm.model_path
    tools = []
    for name, entry in cfg.agent.tools.items():
        if entry:
            params = entry.get("params") or {}
            detail = params.get("url") or ",".join(params.get("cache_roots") or []) or "-"
            backend = f"{params['backend']} " if "backend" in params else ""
            tools.append(f"{name} ({backend}{detail})")
    return f"executor LLM {llm.backend}:{where}; tools: {', '.join(tools) or 'none'}"


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from mia.agent import build_tools
    from mia.llm.config import build_backend

    from .app import ExecutorService, create_serve_app
    from .config import load_images_by_id, load_serve_config

    cfg = load_serve_config(args.config, args.overrides, args.agent_config)
    print(f"serve: {_describe(cfg)}", flush=True)
    tools = build_tools(cfg.agent.tools)  # config errors before the (slow) model load
    images_by_id = load_images_by_id(cfg.images_from)
    backend = build_backend(cfg.llm, name="executor")
    service = ExecutorService(
        backend,
        tools,
        cfg.agent,
        max_concurrency=cfg.max_concurrency,
        chars_per_token=cfg.chars_per_token,
        image_tokens=cfg.image_tokens,
        images_by_id=images_by_id,
        max_request_pixels=cfg.max_request_pixels,
        max_request_images=cfg.max_request_images,
    )
    app = create_serve_app(service, token=args.token, max_body_bytes=args.max_body_bytes)
    serve_app(app, args)


def run() -> None:
    """Entry point of ``python -m serve``: one line and exit 2 on a MiaError."""
    with cli_errors("serve"):
        main()
