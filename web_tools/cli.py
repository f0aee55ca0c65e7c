"""``python -m web_tools serve`` (also ``mia web-tools serve``)."""

from __future__ import annotations

import argparse
import logging
import os

from mia.cli_support import dispatch, serve_app
from mia.config import add_help_config
from mia.http import add_server_args
from web_tools.config import WebToolsConfig, load_config


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m web_tools serve",
        description="Web tools gateway: search (Serper, key from env SERPER_KEY_ID, or the "
        "keyless ddgs), image search and page scraping, with a SQLite cache.",
    )
    add_server_args(p, default_port=8003, env_prefix="WEB_TOOLS")
    p.add_argument(
        "--config",
        default=None,
        help="YAML overriding the defaults (see configs/web_tools/serve.yaml)",
    )
    p.add_argument(
        "--serper-url",
        default=os.environ.get("SERPER_URL"),
        help="Serper search endpoint (env SERPER_URL)",
    )
    p.add_argument(
        "--engine",
        dest="default_engine",
        choices=["serper", "ddgs"],
        default=None,
        help="engine when a request names none (default serper; ddgs needs the web extra)",
    )
    p.add_argument(
        "--cache",
        dest="cache_path",
        default=None,
        help="SQLite cache file ('none' disables; default $MIA_HOME/web_tools/...)",
    )
    p.add_argument(
        "--ttl",
        dest="ttl_s",
        type=float,
        default=None,
        help="cache TTL in seconds (default 604800 = 7 days)",
    )
    p.add_argument(
        "--rate-limit",
        dest="rate_limit_qps",
        type=float,
        default=None,
        help="outgoing Serper calls per second (0 = unlimited; default 10)",
    )
    p.add_argument("--burst", dest="rate_limit_burst", type=int, default=None)
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="Serper calls in flight at once (default 8)",
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=None,
        help="seconds per Serper call (default 15)",
    )
    p.add_argument(
        "--retries",
        dest="max_retries",
        type=int,
        default=None,
        help="retries on timeouts / 429 / 5xx (default 3)",
    )
    p.add_argument(
        "--fetch-allow-host",
        dest="fetch_allow_hosts",
        action="append",
        default=None,
        metavar="HOST",
        help="let page and image fetches reach HOST although it is not a public address "
        "(name, IP, CIDR, optional :PORT); repeat for several; replaces fetch_allow_hosts",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    add_help_config(p, WebToolsConfig)
    return p


def serve(argv: list[str]) -> None:
    from web_tools.server import build_app

    args = _serve_parser().parse_args(argv)
    config = load_config(
        args.config,
        serper_url=args.serper_url,
        default_engine=args.default_engine,
        cache_path=args.cache_path,
        ttl_s=args.ttl_s,
        rate_limit_qps=args.rate_limit_qps,
        rate_limit_burst=args.rate_limit_burst,
        max_concurrency=args.max_concurrency,
        timeout_s=args.timeout_s,
        max_retries=args.max_retries,
        fetch_allow_hosts=args.fetch_allow_hosts,
    )
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request URL at INFO; the key is only in a header, but keep it quiet.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    key = os.environ.get("SERPER_KEY_ID") or None
    if key is None:
        logging.getLogger("web_tools").warning(
            "SERPER_KEY_ID is not set: engine serper answers 503 except for cached queries"
        )
    app = build_app(config, serper_key=key, token=args.token, max_body_bytes=args.max_body_bytes)
    serve_app(app, args)


COMMANDS = {"serve": serve}


def main(argv: list[str]) -> None:
    dispatch(
        argv,
        COMMANDS,
        usage="usage: python -m web_tools serve [options]   (serve --help for options; "
        "--help-config lists the --config keys)",
        schema=WebToolsConfig,
        known=f"try: {', '.join(COMMANDS)}",
    )
