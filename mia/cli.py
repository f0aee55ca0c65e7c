"""The ``mia`` console script: one entry point, subcommands imported lazily.

Every subcommand is ``module:function`` taking ``argv: list[str]``. A :class:`mia.errors.MiaError`
(bad input, missing package, unreachable service) prints one line and exits 2.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "world": ("mia.data.world_cli:main", "generate the synthetic research world"),
    "models": ("mia.models.cli:main", "build/inspect the embedded default model"),
    "web-tools": ("web_tools.cli:main", "online search gateway (Serper, cached)"),
    "search": ("local_search.cli:main", "offline retrieval: build/serve a BM25 or dense index"),
    "serve": ("serve.cli:main", "Executor service: /execute and /continue (port 5001)"),
    "memory": ("memory_serve.__main__:main", "run the Memory Manager service (memory_serve)"),
    "eval": ("mia.eval.cli:main", "evaluate memory policies (none/plan_only/mia/rag) on a QA set"),
    "demo": (
        "mia.apps.demo:main",
        "the main job: world + services + none vs mia on the embedded model",
    ),
    "reward-server": ("ttrl_streaming.reward_server:main", "pluggable reward server (port 6000)"),
    "gold": ("mia.apps.gold_cli:main", "gold Executor trajectories + Planner plans (SFT)"),
}


def _usage() -> str:
    lines = ["usage: mia <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from mia.errors import MiaError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        raise SystemExit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"mia: unknown command {name!r} (try: {', '.join(COMMANDS)})", file=sys.stderr)
        raise SystemExit(2)
    module, func = COMMANDS[name][0].split(":")
    try:
        getattr(importlib.import_module(module), func)(rest)
    except MiaError as err:
        print(f"mia {name}: error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        print(f"mia {name}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
