"""Errors that reach a user: one clear line, never a traceback."""


class MiaError(Exception):
    """A user-facing error. The CLI prints ``str(err)`` on one line and exits 2."""

    exit_code = 2
