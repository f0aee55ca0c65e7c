"""What travels between veRL's processes: a rollout's sample (from veRL's dataset row) and its
record (from the agent loop to the reward function).

veRL hands an agent loop the dataset row's fields (``raw_prompt`` with its images,
``reward_model.ground_truth``, ``extra_info``...); :func:`sample_from_row` turns them into the
sample dict MIA's episodes read (:func:`mia.roles.samples.load_samples`'s keys). The loop leaves
a JSON-safe record of the rollout in its ``extra_fields["mia"]``; veRL's reward loop merges
``extra_fields`` into the ``extra_info`` its reward manager passes to ``compute_score``, which
rebuilds what :mod:`mia.rewards` reads from it. The n rollouts of a prompt share the row's
objects, so nothing here mutates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mia.agent.trajectory import Trajectory
from mia.trace import content_parts, content_text


def as_golds(ground_truth: Any) -> list[str]:
    """``reward_model.ground_truth`` as a list of answers (a string, a list, an array)."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, str | bytes):
        return [ground_truth.decode() if isinstance(ground_truth, bytes) else ground_truth]
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, Sequence):
        return [str(g) for g in ground_truth if g is not None and str(g).strip()]
    return [str(ground_truth)]


def prompt_images(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The images veRL's dataset placed in ``raw_prompt`` (``{"type": "image", "image": ...}``
    parts: PIL images, paths or bytes), in order."""
    out = []
    for part in content_parts(messages):
        if isinstance(part, Mapping) and part.get("type") == "image":
            image = part.get("image")
            if image is None and part.get("bytes") is not None:
                image = part["bytes"]
            if image is not None:
                out.append(image)
    return out


def prompt_question(messages: Sequence[Mapping[str, Any]]) -> str:
    """The last user turn's text (image parts and ``<image>`` placeholders left out)."""
    for m in reversed(list(messages)):
        if m.get("role") == "user":
            return content_text(m.get("content")).replace("<image>", "").strip()
    return ""


def sample_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """MIA's sample of one veRL dataset row. ``extra_info`` carries MIA's columns (written by
    :mod:`mia.verl.data`); images come from ``raw_prompt`` (the Executor's) or, for the
    Planner (a text model forwarding them to serve), from ``extra_info.images`` (base64)."""
    extra = dict(row.get("extra_info") or {})
    messages = list(row.get("raw_prompt") or [])
    reward_model = row.get("reward_model") or {}
    images = prompt_images(messages) or list(extra.get("images") or [])
    ids = extra.get("memory_ids")
    return {
        "question": str(extra.get("question") or prompt_question(messages)),
        "data_id": None if extra.get("data_id") is None else str(extra["data_id"]),
        "golds": as_golds(reward_model.get("ground_truth")),
        "plan": extra.get("plan") or None,
        "memory_context": extra.get("memory_context") or None,
        "memory_ids": [int(i) for i in ids] if ids is not None else None,
        "image_caption": extra.get("image_caption") or None,
        "modality": extra.get("modality"),
        "images": images,
        "data_source": row.get("data_source"),
    }


def executor_record(traj: Trajectory) -> dict[str, Any]:
    """The Executor rollout as the reward reads it (:meth:`Trajectory.to_dict` without tokens;
    images in messages become ``<image>``, as in traces)."""
    data = traj.to_dict(tokens=False)
    data.pop("trace", None)  # derived from the messages
    data["messages"] = [
        {"role": m.get("role"), "content": content_text(m.get("content"))} for m in traj.messages
    ]
    return {
        "kind": "executor",
        "trajectory": data,
        "first_correct": traj.state.get("first_correct"),
        "states": list(traj.state.get("states") or []),
    }


def planner_record(run: Any, bank: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Planner rollout (a :class:`mia.planner.flow.PlannerRun`) as the reward reads it;
    ``bank``: its TTRL ``/memory_bank_save`` item (the reward adds the judgement)."""
    return {
        "kind": "planner",
        "record": run.record.to_dict(),
        "data_id": run.data_id,
        "memory_ids": list(run.memory_ids),
        "stop_reason": run.stop_reason,
        "states": list(run.states),
        "bank": dict(bank) if bank is not None else None,
    }


def trajectory_of(record: Mapping[str, Any]) -> Trajectory:
    """The Executor trajectory of an :func:`executor_record`."""
    return Trajectory.from_dict(record["trajectory"])


def fit_response(
    prompt_ids: list[int],
    response_ids: list[int],
    mask: list[int],
    logprobs: list[float] | None,
    image_pads: list[int],
    limit: int,
    pad_id: int | None,
) -> tuple[list[int], list[int], list[float] | None, int]:
    """The response cut to ``limit`` tokens (veRL's response length) without cutting an
    image's pads apart. ``image_pads``: pads per image in order (prompt images first). Returns
    the response, mask, logprobs and how many images keep their pads."""
    if len(response_ids) > limit:
        keep = limit
        if pad_id is not None and image_pads:
            seen = sum(1 for t in prompt_ids if t == pad_id)
            bounds, total = [0], 0
            for n in image_pads:  # pads before each image ends
                total += n
                bounds.append(total)
            pads = seen + sum(1 for t in response_ids[:keep] if t == pad_id)
            if pads not in bounds:  # the cut lands inside an image: cut before its first pad
                need = max(b for b in bounds if b <= pads) - seen
                count = 0
                for i, t in enumerate(response_ids):
                    if t == pad_id:
                        if count == need:
                            keep = i
                            break
                        count += 1
        response_ids, mask = response_ids[:keep], mask[:keep]
        logprobs = logprobs[:keep] if logprobs is not None else None
    if pad_id is None or not image_pads:
        return response_ids, mask, logprobs, 0
    pads = sum(1 for t in prompt_ids if t == pad_id) + sum(1 for t in response_ids if t == pad_id)
    kept, total = 0, 0
    for n in image_pads:
        if total + n > pads:
            break
        total += n
        kept += 1
    return response_ids, mask, logprobs, kept
