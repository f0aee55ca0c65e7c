"""The pluggable reward server (docs/reference.md §3.7): ground truths in, rewards out.

``python -m ttrl_streaming.reward_server [--port 6000] [--reward-fn package.module:function]``

- ``POST /register_gts`` ``{"entries": [{"data_id", "ground_truth"}]}`` (or one entry at the top
  level) -> ``{status, registered, total}``. A list ground truth keeps every element as an alias
  (the reference kept only the first); numbers are stored as strings. Stored in SQLite, so a
  restarted server still knows them; registering an id again replaces its answers.
- ``POST /compute_gt_reward``: the reference request (``data_source``, ``solution_str``,
  ``extra_info.messages`` = ``[plan, trace1, decision(, replan_prompt, replan, trace2)]``,
  ``extra_info.question``, ``data_id`` top-level or in ``extra_info``) or the native one
  (``data_id`` + ``record``: a :class:`mia.rewards.PlannerEpisodeRecord`) -> ``{score,
  judgement, format_score, decision_score, is_answer1_correct, is_answer2_correct, data_source,
  data_id, extras}``. An unregistered id is a 404 (the reference answered score 0).
- ``GET /health`` -> ``registered_gts`` (+ the reward function and judge in use).

The score comes from the reward function (``--reward-fn``, default the Planner reward of
docs/reference.md §7.2): the place to plug in user feedback, see :mod:`mia.rewards.hooks`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sqlite3
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from mia.cli_support import cli_errors, serve_app
from mia.config import add_help_config, load_dict, resolve_path, to_dict
from mia.errors import MiaError
from mia.http import ApiError, add_server_args, create_app
from mia.judge import JudgeConfig
from mia.judge.base import Judge, JudgeError
from mia.paths import config_dir, mia_home
from mia.rewards.config import (
    KINDS,
    NoGTRewardConfig,
    PlannerRewardConfig,
    load_reward_config,
)
from mia.rewards.hooks import (
    DEFAULT_REWARD_FN,
    RewardContext,
    RewardFn,
    RewardFnError,
    call_reward_fn,
    load_reward_fn,
    nogt_panel_reward,
    planner_gt_reward,
)
from mia.rewards.planner import PlannerEpisodeRecord
from mia.services.rewards import (
    ComputeRewardRequest,
    ComputeRewardResponse,
    RegisterRequest,
    RegisterResponse,
)

log = logging.getLogger("ttrl_streaming.reward_server")

DEFAULT_PORT = 6000

# ----------------------------------------------------------------------------- ground truths

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ground_truths (
    data_id TEXT PRIMARY KEY,
    answers TEXT NOT NULL,
    updated_at REAL NOT NULL
)
"""


class GTStore:
    """``data_id -> [answers]`` in SQLite (WAL). One connection shared by all request threads,
    serialised by a lock; every write is committed before the response goes out."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
        except sqlite3.DatabaseError as err:
            raise MiaError(f"ground-truth store {self.path}: {err}") from None

    def register(self, entries: list[tuple[str, list[str]]]) -> int:
        now = time.time()
        rows = [(data_id, json.dumps(answers), now) for data_id, answers in entries]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT INTO ground_truths (data_id, answers, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(data_id) DO UPDATE SET answers = excluded.answers, "
                    "updated_at = excluded.updated_at",
                    rows,
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(rows)

    def get(self, data_id: str) -> list[str] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT answers FROM ground_truths WHERE data_id = ?", (data_id,)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM ground_truths").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ----------------------------------------------------------------------------- the app


def _json_safe(value: Any) -> Any:
    """``extras`` as JSON: non-finite floats -> None, unknown objects -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _optional_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _optional_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _record_of(req: ComputeRewardRequest, question: str) -> PlannerEpisodeRecord:
    if req.record is not None:
        record = PlannerEpisodeRecord(**req.record.model_dump())
        if not record.question:
            record.question = question
        return record
    messages = (req.extra_info or {}).get("messages")
    if not isinstance(messages, list):
        raise ApiError(
            422,
            "send either record (a planner episode) or extra_info.messages "
            "([plan, trace1, decision] or [plan, trace1, decision, replan_prompt, replan, trace2])",
        )
    try:
        return PlannerEpisodeRecord.from_reference_messages(messages, question)
    except MiaError as err:
        raise ApiError(422, str(err)) from None


def create_reward_app(
    store: GTStore,
    judge: Judge,
    reward_fn: RewardFn,
    *,
    reward_config: Mapping[str, Any] | None = None,
    reward_fn_name: str = DEFAULT_REWARD_FN,
    token: str | None = None,
    max_body_bytes: int | None = None,
) -> FastAPI:
    def health() -> dict[str, Any]:
        return {
            "registered_gts": store.count(),
            "reward_fn": reward_fn_name,
            "judge": getattr(judge, "name", type(judge).__name__),
        }

    kwargs: dict[str, Any] = {"token": token, "health": health}
    if max_body_bytes is not None:
        kwargs["max_body_bytes"] = max_body_bytes
    app = create_app("reward_server", **kwargs)

    @app.post("/register_gts", response_model=RegisterResponse)
    def register_gts(req: RegisterRequest) -> RegisterResponse:
        entries = [e.normalised() for e in req.entries or []]
        n = store.register(entries)
        return RegisterResponse(registered=n, total=store.count())

    @app.post("/compute_gt_reward", response_model=ComputeRewardResponse)
    async def compute_gt_reward(req: ComputeRewardRequest) -> ComputeRewardResponse:
        extra = req.extra_info or {}
        raw_id = req.data_id if req.data_id is not None else extra.get("data_id")
        if raw_id is None or not str(raw_id).strip():
            raise ApiError(422, "data_id is required (top level or in extra_info)")
        data_id = str(raw_id).strip()
        question = req.question or extra.get("question") or ""
        if not isinstance(question, str):
            raise ApiError(422, "question must be a string")
        record = _record_of(req, question)
        golds = store.get(data_id)
        if golds is None:
            raise ApiError(
                404, f"no ground truth registered for data_id {data_id!r} (POST /register_gts)"
            )
        data_source = req.data_source or extra.get("data_source")
        ctx = RewardContext(
            data_id=data_id,
            ground_truths=golds,
            record=record,
            judge=judge,
            question=question or record.question,
            data_source=data_source if isinstance(data_source, str) else None,
            config=reward_config,
            request=req.model_dump(exclude={"record"}),
        )
        try:
            score, extras = await call_reward_fn(reward_fn, ctx)
        except JudgeError as err:
            raise ApiError(502, f"judge failed: {err}", "judge_failed") from None
        except RewardFnError as err:
            raise ApiError(500, f"{reward_fn_name}: {err}", "reward_fn_error") from None
        except MiaError as err:
            raise ApiError(422, f"{reward_fn_name}: {err}") from None
        return ComputeRewardResponse(
            score=score,
            judgement=extras.get("judgement") if isinstance(extras.get("judgement"), str) else None,
            format_score=_optional_float(extras.get("format")),
            decision_score=_optional_float(extras.get("decision")),
            is_answer1_correct=_optional_bool(extras.get("is_answer1_correct")),
            is_answer2_correct=_optional_bool(extras.get("is_answer2_correct")),
            data_source=ctx.data_source,
            data_id=data_id,
            extras=_json_safe(extras),
        )

    return app


# ----------------------------------------------------------------------------- CLI

_BUILTIN_CONFIGS: dict[Any, type] = {
    planner_gt_reward: PlannerRewardConfig,
    nogt_panel_reward: NoGTRewardConfig,
}


def _reward_config(name: str | None, builtin: type | None) -> dict[str, Any] | None:
    """``--reward-config`` as the reward function gets it: checked against the built-in reward's
    schema now (a typo fails at start, not at the first request) and filled with its defaults; a
    shipped name (``planner``, ``nogt``) is filled with its kind's defaults for any function."""
    if not name:
        return None
    data = load_dict(name, group="reward")
    path = resolve_path(name, "reward")
    shipped = path.resolve().parent == config_dir("reward").resolve()
    schema = builtin or (KINDS.get(path.stem) if shipped else None)
    return to_dict(load_reward_config(schema, data)) if schema is not None else data


def build_server_judge(judge: str, llm: str) -> Judge:
    """A judge from ``configs/judge/<judge>.yaml``; LLM judges take their role's backend from
    ``configs/llm/<llm>.yaml`` (only that role is built)."""
    from mia.judge import build_judge
    from mia.llm.config import build_backend, role_configs

    cfg = load_dict(judge, group="judge")
    if cfg.get("type", "rules") == "rules":
        return build_judge(cfg)
    role = cfg.get("role", "judge")
    roles = role_configs(load_dict(llm, group="llm"))
    if role not in roles:
        raise MiaError(f"llm config {llm}: no role {role!r} (has {sorted(roles)})")
    return build_judge(cfg, backend=build_backend(roles[role], name=role))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ttrl_streaming.reward_server",
        description="Reward server: POST /register_gts, POST /compute_gt_reward, GET /health. "
        "Ground truths persist in SQLite.",
    )
    add_server_args(p, default_port=DEFAULT_PORT, env_prefix="REWARD_SERVER")
    p.add_argument(
        "--db", default=None, help="SQLite file (default $MIA_HOME/reward_server/gts.sqlite)"
    )
    p.add_argument(
        "--reward-fn",
        default=DEFAULT_REWARD_FN,
        help="reward function as package.module:function, called with a "
        "mia.rewards.hooks.RewardContext; returns (score, extras) or a score "
        f"(default {DEFAULT_REWARD_FN}; mia.rewards.hooks:nogt_panel_reward for no ground truth)",
    )
    p.add_argument(
        "--reward-config",
        default=None,
        help="reward weights: a name in configs/reward/ (planner, nogt) or a YAML file "
        "(default: the reward function's own defaults)",
    )
    p.add_argument(
        "--judge",
        default="rules",
        help="judge config: rules | llm | panel (configs/judge/) or a file",
    )
    p.add_argument(
        "--llm",
        default="embedded",
        help="LLM config for llm/panel judges: embedded | vllm (configs/llm/) or a file",
    )
    p.add_argument("--log-level", default="WARNING", type=str.upper)
    add_help_config(
        p,
        ("--reward-config (planner_gt_reward)", PlannerRewardConfig),
        ("--reward-config (nogt_panel_reward)", NoGTRewardConfig),
        ("--judge", JudgeConfig),
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    reward_fn = load_reward_fn(args.reward_fn)
    reward_config = _reward_config(args.reward_config, _BUILTIN_CONFIGS.get(reward_fn))
    judge = build_server_judge(args.judge, args.llm)
    db = args.db or str(mia_home() / "reward_server" / "gts.sqlite")
    store = GTStore(db)
    app = create_reward_app(
        store,
        judge,
        reward_fn,
        reward_config=reward_config,
        reward_fn_name=args.reward_fn,
        token=args.token,
        max_body_bytes=args.max_body_bytes,
    )
    print(
        f"reward_server: {store.count()} ground truths in {db}; reward {args.reward_fn}; "
        f"judge {getattr(judge, 'name', args.judge)}",
        flush=True,
    )
    try:
        serve_app(app, args)
    finally:
        store.close()


def run() -> None:
    with cli_errors("reward_server", interrupted=False):
        main()


if __name__ == "__main__":
    run()
