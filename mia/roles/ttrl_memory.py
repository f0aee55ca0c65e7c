"""The TTRL memory hooks (docs/reference.md §3.2, §8): one batch's rollouts into memory_serve.

``/memory_bank_save`` (buffer every rollout with its judgement) -> ``/batch_evaluate`` (one
rollout per question under each selection rule, JSONL files) -> ``/consolidate_memories`` (the
best correct and one incorrect rollout per question become memories, plus a plan pair) ->
``/save_memory`` (a copy of the store in the run folder). Phases are journaled
(:mod:`mia.roles.journal`) so a resumed run never repeats a write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from mia.errors import MiaError
from mia.roles.journal import Journal
from mia.services import MemoryClient
from mia.trace import content_text, expected_extra

log = logging.getLogger("ttrl")


def plain_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Executor messages with images replaced by ``<image>`` (memories are text)."""
    out = []
    for m in messages:
        item = {"role": m.get("role", "user"), "content": content_text(m.get("content"))}
        out.append(item)
    return out


def bank_item(sample: Mapping[str, Any], rollout: Any, extras: Mapping[str, Any], mode: str,
              batch: int, reward: float, expected: bool = False) -> dict[str, Any]:  # fmt: skip
    """One ``/memory_bank_save`` item for a finished rollout. ``expected`` (supervised): a
    failed rollout also keeps the expected answer and the search-result sentence that held it
    (``memory.remember_expected``; a memory made from it shows both)."""
    judgement = extras.get("judgement") or "incorrect"
    item: dict[str, Any] = {
        "data_id": str(sample.get("data_id") or ""),
        "question": rollout.question,
        "image_caption": sample.get("image_caption") or "",
        "plan": rollout.plan,
        "messages": plain_messages(rollout.executor_history()),
        "used_memory_ids": list(rollout.memory_ids or []),
        "extra": {
            "batch": batch,
            "reward": reward,
            "replanned": rollout.replanned,
            "answer": rollout.final_answer,
        },
    }
    if expected and mode != "nogt" and judgement != "correct":
        item["extra"].update(expected_extra(rollout.executor_history(), sample.get("golds") or []))
    if mode == "nogt":
        item["judgement_nogt"] = judgement
        panel = extras.get("panel")
        if isinstance(panel, Mapping) and panel:
            item["judgement_data"] = {k: v for k, v in panel.items() if k != "critics"}
    else:
        item["judgement"] = judgement
    return item


def check_empty_buffer(client: MemoryClient) -> None:
    n = client.sync.stats().buffered_rollouts
    if n:
        raise MiaError(
            f"memory_serve already buffers {n} rollouts that are not from this run; consolidate "
            "(/consolidate_memories) or clear them before starting TTRL"
        )


def commit_batch(
    client: MemoryClient,
    journal: Journal,
    batch: int,
    payload: Mapping[str, Any],
    *,
    eval_dir: str | None,
    save_path: str | None,
    crash: Callable[[str], None] = lambda _point: None,
) -> dict[str, Any]:
    """Run the memory hooks for ``batch`` from where its journal says they stopped; the
    result carries the hooks' outputs and ``memory_seconds`` (seconds per hook run now)."""
    done = journal.phase_data(batch)
    out: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(hook: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[hook] = round(now - clock, 3)
        clock = now

    for phase in ("evaluated", "consolidated"):
        if isinstance(done.get(phase), Mapping):
            out.update(done[phase])

    def buffered() -> int:
        return client.sync.stats().buffered_rollouts

    if "bank_saved" not in done:
        # A kill during the request leaves "bank_saving" alone: the buffer says if it landed.
        if "bank_saving" not in done or buffered() == 0:
            journal.mark(batch, "bank_saving")
            if payload["bank"]:
                client.sync.bank_save(payload["bank"])
        journal.mark(batch, "bank_saved")
        lap("bank_save")
        crash("after_bank_save")
    if "evaluated" not in done:
        info: dict[str, Any] = {}
        if eval_dir is not None:
            ev = client.sync.batch_evaluate(eval_dir, step=batch)
            info["selected_accuracy"] = ev.accuracy
        out.update(info)
        journal.mark(batch, "evaluated", info)
        lap("evaluate")
    if "consolidated" not in done:
        if "consolidating" not in done or buffered() > 0:
            journal.mark(batch, "consolidating")
            res = client.sync.consolidate()
            info = {
                "saved_positives": res.saved_positives,
                "saved_negatives": res.saved_negatives,
                "saved_plan_pairs": res.saved_plan_pairs,
            }
        else:  # consolidated before the kill; its counts are lost with the answer
            info = {}
        out.update(info)
        journal.mark(batch, "consolidated", info)
        lap("consolidate")
        crash("after_consolidate")
    if "saved" not in done:
        if save_path is not None:
            client.sync.save_memory(save_path)
        journal.mark(batch, "saved")
        lap("save")
    return {**out, "memory_seconds": seconds}
