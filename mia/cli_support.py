"""What the command lines of the services (serve, local_search, web_tools, ttrl_streaming's
servers) and the role trainers share: a user error (:class:`~mia.errors.MiaError`) as one line
on stderr and its exit code, Ctrl-C as exit 130, a port that cannot be bound as a user error,
and the ``COMMAND [options]`` dispatch of the services with subcommands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from mia.config import help_config
from mia.errors import MiaError


@contextmanager
def cli_errors(prog: str, *, interrupted: bool = True) -> Iterator[None]:
    """``with cli_errors(prog): main()``: a MiaError is ``prog: error: <message>`` on one line
    (a library's message may span several) and exit ``err.exit_code`` (2); Ctrl-C exits 130,
    saying ``prog: interrupted`` when ``interrupted``."""
    try:
        yield
    except MiaError as err:
        print(f"{prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        if interrupted:
            print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def serve_app(app: Any, args: argparse.Namespace) -> None:
    """:func:`mia.http.run_app` on the address, port file and limits of the command line
    (:func:`mia.http.add_server_args`); a failed bind (port taken, address not local, no
    permission) is a MiaError."""
    from mia.http import run_app, server_limits

    try:
        run_app(
            app,
            host=args.host,
            port=args.port,
            port_file=args.port_file,
            limits=server_limits(args),
        )
    except OSError as err:
        raise MiaError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None


def dispatch(
    argv: Sequence[str],
    commands: Mapping[str, Callable[[list[str]], None]],
    *,
    usage: str,
    schema: type,
    known: str,
) -> None:
    """``COMMAND [options]``: no argument or ``-h`` prints ``usage`` (exit 2 or 0),
    ``--help-config`` the keys of ``schema``; an unknown command is a MiaError naming the
    ``known`` ones; else ``commands[COMMAND](options)``."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        raise SystemExit(0 if argv else 2)
    if argv[0] == "--help-config":
        print(help_config(schema))
        raise SystemExit(0)
    if argv[0] not in commands:
        raise MiaError(f"unknown command {argv[0]!r} ({known})")
    commands[argv[0]](argv[1:])
