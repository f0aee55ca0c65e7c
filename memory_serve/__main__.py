"""``python -m memory_serve [--config NAME|PATH] [key=value ...]``: run the Memory Manager.

Examples::

    python -m memory_serve                                   # embedded default, 127.0.0.1:5000
    python -m memory_serve llm.config=vllm store.retrieval.top_k=3   # Manager/Planner on vLLM
    python -m memory_serve --port 0 --port-file /tmp/p compress.mode=identity llm.enabled=false
    python -m memory_serve --proxy http://127.0.0.1:8000/v1   # + OpenAI-compatible memory proxy

The memory inspector is at ``/ui`` (docs/inspector.md); the proxy is docs/proxy.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from mia.errors import MiaError
from mia.http import add_server_args, run_app, server_limits
from mia.paths import mia_home

log = logging.getLogger("memory_serve")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m memory_serve",
        description="Memory Manager service: store, retrieve and compress workflow memories; plan.",
    )
    parser.add_argument(
        "--config",
        "--config-name",
        dest="config",
        default="default",
        help="config file, or a name in configs/memory/ (default: default)",
    )
    parser.add_argument("--db", default=None, help="SQLite file (overrides db_path)")
    parser.add_argument(
        "--reembed",
        action="store_true",
        help="re-embed a store built with another embedder instead of refusing to start",
    )
    parser.add_argument(
        "--proxy",
        metavar="UPSTREAM_URL",
        default=None,
        help="also serve an OpenAI-compatible /v1/chat/completions that plans from memory and "
        "forwards to this OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
        "(key from $MIA_PROXY_API_KEY; docs/proxy.md)",
    )
    parser.add_argument(
        "--runs", metavar="DIR", default=None, help="runs folder of the inspector (ui.runs_dir)"
    )
    add_server_args(parser, default_port=5000, env_prefix="MEMORY_SERVE")
    from memory_serve.config import MemoryServeConfig
    from mia.config import add_help_config

    add_help_config(parser, MemoryServeConfig)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.llms import build_roles
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.embedding import build_embedder

    overrides = list(args.overrides)
    if args.proxy:
        overrides.append(f"proxy.upstream={args.proxy}")
    if args.runs:
        overrides.append(f"ui.runs_dir={args.runs}")
    cfg = load_config(args.config, overrides)
    db_path = args.db or cfg.db_path or str(mia_home() / "memory" / "memory.sqlite")
    e = cfg.embedder
    embedder = build_embedder(e.model, e.device, e.batch_size, e.max_seq_length)
    store = MemoryStore(db_path, embedder, cfg.store, reembed_on_mismatch=args.reembed)
    manager = planner = None
    if cfg.llm.enabled:
        manager, planner = build_roles(cfg.llm)
    service = MemoryService(cfg, store, manager, planner)
    log.info(
        "memory store %s: %d memories, embedder %s, compress=%s",
        db_path,
        len(store),
        store.embedder.name,
        cfg.compress.mode,
    )
    app = build_app(service, token=args.token, max_body_bytes=args.max_body_bytes)
    proxy = getattr(app.state, "proxy", None)
    if proxy is not None:
        key = cfg.proxy.api_key_env
        log.info(
            "proxy: /v1/chat/completions -> %s (upstream key from $%s: %s)",
            proxy.upstream,
            key,
            "set" if os.environ.get(key) else "unset",
        )
    if cfg.ui.enabled:
        log.info("memory inspector: http://%s:%s/ui", args.host, args.port or "<port>")
    try:
        run_app(app, args.host, args.port, args.port_file, limits=server_limits(args))
    finally:
        if proxy is not None:
            proxy.tasks.close()
        store.close()
        for backend in {id(b): b for b in (manager, planner) if b is not None}.values():
            asyncio.run(backend.aclose())


def cli() -> None:
    try:
        main()
    except MiaError as err:
        print(f"memory_serve: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
