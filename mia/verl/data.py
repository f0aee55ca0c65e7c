"""MIA's data files -> veRL's RL parquet (``python -m mia.verl.data``).

Reads any format :func:`mia.roles.samples.load_samples` reads (the reference's parquets,
JSON / JSONL, ``mia world`` output) and writes one veRL row per question:

- ``prompt``: chat messages, ``[{"role": "user", "content": "<image>...question"}]`` (one
  ``<image>`` per question image: veRL's dataset puts the ``images`` column there);
- ``images`` (Executor rows with images): ``[{"bytes": ...}]``, veRL's image format;
- ``data_source``, ``ability``, ``reward_model: {style: rule, ground_truth: [answers]}``;
- ``extra_info``: ``index``, ``question``, ``data_id``, ``plan``, ``memory_context``,
  ``image_caption``, ``modality`` and, for Planner rows, ``images`` (base64: the Planner is a
  text model and forwards them to the frozen Executor);
- ``agent_name``: ``mia_executor`` or ``mia_planner`` (veRL picks the agent loop by it).

``--plan-url`` fills Executor rows without a plan from memory_serve ``/plan`` once, as the
reference's precomputed ``plan`` column (the agent loop would otherwise plan each row at
rollout time).
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mia.cli_support import cli_errors
from mia.errors import MiaError
from mia.verl import EXECUTOR_LOOP, PLANNER_LOOP

KINDS = {"executor": EXECUTOR_LOOP, "planner": PLANNER_LOOP, "ttrl": PLANNER_LOOP}


def _caption(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = value[0] if value else ""
    return str(value or "")


def verl_rows(samples: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """veRL rows of MIA samples for the ``kind`` stage (executor | planner | ttrl)."""
    if kind not in KINDS:
        raise MiaError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    rows = []
    for i, s in enumerate(samples):
        images = list(s.get("images") or [])
        executor = kind == "executor"
        content = "<image>" * len(images) + str(s["question"]) if executor else s["question"]
        extra: dict[str, Any] = {
            "index": i,
            "question": str(s["question"]),
            "data_id": str(s.get("data_id") or i),
            "plan": str(s.get("plan") or ""),
            "memory_context": str(s.get("memory_context") or ""),
            "image_caption": _caption(s.get("image_caption")),
            "modality": str(s.get("modality") or ("text-image" if images else "text-only")),
            "images": [] if executor else images,
        }
        row: dict[str, Any] = {
            "data_source": str(s.get("data_source") or "mia"),
            "prompt": [{"role": "user", "content": content}],
            "ability": "deep_research",
            "reward_model": {"style": "rule", "ground_truth": [str(g) for g in s["golds"]]},
            "extra_info": extra,
            "agent_name": KINDS[kind],
        }
        if executor:
            row["images"] = [{"bytes": base64.b64decode(b)} for b in images]
        rows.append(row)
    return rows


def fill_plans(samples: list[dict[str, Any]], url: str, token: str | None = None) -> int:
    """Plan (memory_serve ``/plan``) every sample without one; returns how many."""
    from mia.services import MemoryClient

    client = MemoryClient(url, token=token)
    n = 0
    try:
        for s in samples:
            if s.get("plan"):
                continue
            out = client.sync.plan(
                str(s["question"]),
                image_caption=s.get("image_caption") or None,
                data_id=s.get("data_id"),
            )
            s["plan"], s["memory_context"] = out.plan, s.get("memory_context") or out.context
            n += 1
    finally:
        client.close()
    return n


def write_verl_parquet(rows: list[dict[str, Any]], out: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def prepare(
    kind: str,
    source: str | Path,
    out: str | Path,
    *,
    limit: int | None = None,
    text_only: bool = False,
    plan_url: str | None = None,
    token: str | None = None,
) -> Path:
    """``source`` -> a veRL parquet at ``out`` for the ``kind`` stage."""
    from mia.roles.samples import load_samples

    samples = load_samples(source, text_only=text_only, limit=limit)
    if plan_url and kind == "executor":
        fill_plans(samples, plan_url, token)
    return write_verl_parquet(verl_rows(samples, kind), out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m mia.verl.data", description="MIA data -> veRL's RL parquet"
    )
    parser.add_argument("kind", choices=sorted(KINDS), help="the stage the rows are for")
    parser.add_argument("--input", required=True, help="parquet / JSON / JSONL (load_samples)")
    parser.add_argument("--out", required=True, help="the veRL parquet to write")
    parser.add_argument("--limit", type=int, default=None, help="first N rows")
    parser.add_argument("--text-only", action="store_true", help="skip image questions")
    parser.add_argument("--plan-url", default=None, help="memory_serve: /plan rows without one")
    parser.add_argument("--token", default=None, help="memory_serve's bearer token")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with cli_errors(parser.prog):
        path = prepare(
            args.kind,
            args.input,
            args.out,
            limit=args.limit,
            text_only=args.text_only,
            plan_url=args.plan_url,
            token=args.token,
        )
        print(f"{parser.prog}: wrote {path}")


if __name__ == "__main__":
    main()
