"""The Executor service (``python -m serve``): runs the Executor loop on a plan (``/execute``,
alias ``/plan``) and continues it with a revised plan (``/continue``, alias ``/replan``)."""

from serve.app import (
    ContinueRequest,
    ExecuteRequest,
    ExecuteResponse,
    ExecutorService,
    create_serve_app,
)
from serve.config import ServeConfig, load_serve_config

__all__ = [
    "ContinueRequest",
    "ExecuteRequest",
    "ExecuteResponse",
    "ExecutorService",
    "ServeConfig",
    "create_serve_app",
    "load_serve_config",
]
