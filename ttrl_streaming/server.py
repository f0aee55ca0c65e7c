"""The streaming TTRL training server (docs/reference.md §3.6): holds the Planner and learns from a
stream of questions (or of finished rollouts) pushed by a client.

``python -m ttrl_streaming.server [--port 8765] [--config-name server] [key=value ...]``

- ``POST /submit_sample``: JSON ``{"samples": [{data_id, question, image_caption?, images?,
  ...}], "finish"?, "flush_partial"?, "epoch"?}`` -- the server runs n planner rollouts per
  sample (memories -> plan -> the Executor -> reflect -> replan; rewards from the reward server)
  -- or ``{"rollouts": [{group, prompt_ids, response_ids, response_mask, rollout_logprobs?,
  reward}]}`` (token rows computed elsewhere; lists or codec tensors), or the same rollouts as a
  safetensors body (``Content-Type: application/x-safetensors``, flags in the query string).
  Rollouts are buffered; whenever ``train_batch_size x n`` rows are buffered the server takes
  whole groups and runs one GRPO step. ``flush_partial`` trains on what is left; ``finish`` also
  marks the stream done. Answer: ``{"status": "rollout"|"step", global_steps, steps, metrics,
  rollout_buffer_len, rollouts: [...], done, epoch}``. Malformed samples: 4xx.
- ``POST /save_checkpoint``: ``{ok, checkpoint_global_step, global_steps, path}`` (400 before
  the first update).
- ``GET /health``: step counters and buffer sizes.

The reference's client works unchanged (docs/reference.md §3.6): ``/submit_sample`` also takes
``{"rollout": <collated batch>, "epoch", "finish", "flush_partial"}`` (its codec's wrappers
decoded; the questions are read from the batch and rolled out here), ``POST /submit_batch``
``{"batch", "epoch", "finish"}`` rolls out and trains on everything buffered, and
``POST /streaming/register_images`` (``{"entries": [{data_id, images}]}`` or one entry) keeps a
question's first image for samples that arrive without images; ``GET /streaming/health``.

One rollout phase or update runs at a time (a lock around the trainer); requests from several
clients queue. Samples' memory hooks (``/memory_bank_save`` -> ``/batch_evaluate`` ->
``/consolidate_memories`` -> ``/save_memory``) run after each rollout phase when memory_serve
is configured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from mia.cli_support import cli_errors, serve_app
from mia.config import add_help_config, to_yaml
from mia.errors import MiaError
from mia.http import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    add_server_args,
    create_app,
)
from mia.paths import resolve_run_dir
from mia.planner.episode import PlannerEpisode
from mia.rewards.planner import PlannerReward, RemoteReward
from mia.rl.trainer import RolloutResult, Trainer, group_results
from mia.roles.common import (
    build_judge,
    clients,
    resolve_model,
    role_config,
    service_kwargs,
    setup_logging,
    trainer_section,
)
from mia.roles.ttrl_memory import bank_item, commit_batch
from mia.services import RewardClient
from mia.services.streaming import (
    ReferenceBatchError,
    RegisterImagesRequest,
    RolloutRow,
    SubmitRequest,
    samples_from_reference_batch,
)
from ttrl_streaming.buffer import RolloutBuffer
from ttrl_streaming.codec import CodecError, as_list, rollouts_from_safetensors
from ttrl_streaming.config import StreamingServerConfig, load_config

log = logging.getLogger("ttrl_streaming.server")
DEFAULT_PORT = 8765
SAFETENSORS_TYPES = ("application/x-safetensors", "application/octet-stream")


@dataclass
class TokenRollout:
    """A rollout computed outside the server: just the token view."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    rollout_logprobs: list[float] | None
    group: str = ""
    index: int = 0

    def to_dict(self, tokens: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"group": self.group, "index": self.index}
        if tokens:
            out.update(prompt_ids=self.prompt_ids, response_ids=self.response_ids)
        return out


# ----------------------------------------------------------------------------- the server


class StreamingServer:
    """The Planner's trainer, the rollout buffer and the request logic (no HTTP)."""

    def __init__(
        self,
        cfg: StreamingServerConfig | Mapping[str, Any],
        *,
        generator: Any = None,
        judge: Any = None,
    ) -> None:
        self.cfg = cfg = role_config(StreamingServerConfig, cfg, "ttrl_streaming")
        services = cfg.services
        executor, memory = clients(services)
        self.memory = memory if cfg.memory.enabled else None
        self.run_dir = resolve_run_dir(cfg.run_dir, "streaming")
        if services.reward_url:
            reward: Any = RemoteReward(
                RewardClient(str(services.reward_url), **service_kwargs(services, "reward"))
            )
        else:
            j = judge if judge is not None else build_judge(cfg.judge, cfg.llm)
            reward = PlannerReward(j, cfg.reward)
        episode = PlannerEpisode(
            executor,
            self.memory,
            cfg.episode,
            chat_template_kwargs=cfg.chat_template_kwargs or None,
        )
        section = trainer_section(cfg, resolve_model(cfg.model_path))
        section.run_dir = str(self.run_dir)
        section.resume = cfg.resume
        section.total_steps = None
        # The trainer needs a dataset only for its data cursor, which streaming never uses.
        placeholder = [{"question": "-"}] * section.batch_size
        self.trainer = Trainer(section, episode, reward, placeholder, generator=generator)
        self.trainer.total_steps = None  # open-ended: the client decides
        self.target_rows = self.trainer.cfg.batch_size * self.trainer.cfg.n
        self.buffer = RolloutBuffer()
        self.lock = threading.Lock()
        self.max_samples = cfg.max_samples_per_request
        self.samples_seen = 0
        self.done = False
        self._submissions = itertools.count()
        self._last_metrics: dict[str, Any] = {}
        # data_id -> [first image] (base64 / data URL), for samples sent without images.
        self.images: dict[str, list[str]] = {}

    # ---- lifecycle
    def start(self) -> StreamingServer:
        self.trainer.setup()
        gen = self.trainer.generator
        model = getattr(gen, "model", None)
        vocab = None
        if model is not None:
            vocab = int(model.config.get_text_config().vocab_size)
        elif getattr(gen, "tokenizer", None) is not None:
            vocab = len(gen.tokenizer)
        self.vocab = vocab
        return self

    def close(self) -> None:
        self.trainer.close()
        if self.memory is not None:
            self.memory.close()

    # ---- requests
    def health(self) -> dict[str, Any]:
        cfg = self.trainer.cfg
        return {
            "global_steps": self.trainer.step,
            "train_batch_size": cfg.batch_size,
            "rollout_n": cfg.n,
            "total_training_steps": None,  # open-ended: the client decides
            "rollout_buffer_len": self.buffer.rows,
            "rollout_buffer_samples": self.buffer.rows,
            "rollout_buffer_groups": self.buffer.groups,
            "samples_seen": self.samples_seen,
            "done": self.done,
        }

    def _client_rollouts(self, rows: list[RolloutRow], tag: str) -> list[RolloutResult]:
        out = []
        indices: dict[str, int] = {}
        limit = self.cfg.episode.max_context
        for k, row in enumerate(rows):
            where = f"rollouts[{k}]"
            try:
                prompt = as_list(row.prompt_ids, int, f"{where}.prompt_ids")
                resp = as_list(row.response_ids, int, f"{where}.response_ids")
                mask = as_list(row.response_mask, int, f"{where}.response_mask")
                lps = (
                    None
                    if row.rollout_logprobs is None
                    else as_list(row.rollout_logprobs, float, f"{where}.rollout_logprobs")
                )
            except CodecError as err:
                raise ApiError(422, str(err)) from None
            problems = []
            if not prompt or not resp:
                problems.append("prompt_ids and response_ids must not be empty")
            if len(mask) != len(resp):
                problems.append(f"response_mask has {len(mask)} entries for {len(resp)} tokens")
            if lps is not None and len(lps) != len(resp):
                problems.append(f"rollout_logprobs has {len(lps)} entries for {len(resp)} tokens")
            if any(m not in (0, 1) for m in mask) or 1 not in mask:
                problems.append("response_mask must be 0/1 with at least one 1")
            if self.vocab is not None and any(not 0 <= t < self.vocab for t in prompt + resp):
                problems.append(f"token ids must be in [0, {self.vocab})")
            if len(prompt) + len(resp) > limit:
                problems.append(f"{len(prompt) + len(resp)} tokens is over the limit of {limit}")
            if problems:
                raise ApiError(422, f"{where}: " + "; ".join(problems))
            group = f"{tag}-{row.group}"
            index = indices.get(group, 0)
            indices[group] = index + 1
            traj = TokenRollout(prompt, resp, mask, lps, group, index)
            out.append(
                RolloutResult(
                    sample={"data_id": row.group},
                    group=group,
                    index=index,
                    trajectory=traj,
                    reward=float(row.reward),
                    extras=dict(row.extras),
                )
            )
        return out

    def _memory_hooks(self, tag: str, ok: list[RolloutResult]) -> dict[str, Any]:
        if self.memory is None or not ok:
            return {}
        from mia.roles.journal import Journal

        mem = self.cfg.memory
        bank = [bank_item(r.sample, r.trajectory, r.extras, "supervised", 0, r.reward) for r in ok]
        journal = Journal(self.run_dir / "memory_journal")
        try:
            return commit_batch(
                self.memory,
                journal,
                0,
                {"bank": bank},
                eval_dir=str(self.run_dir / "eval") if mem.evaluate else None,
                save_path=str(self.run_dir / "memory") if mem.save else None,
            )
        finally:
            journal.drop(0)

    def submit(self, req: SubmitRequest) -> dict[str, Any]:
        if req.samples is not None and req.rollouts is not None:
            raise ApiError(422, "send samples OR rollouts in one request, not both")
        if req.samples is not None and len(req.samples) > self.max_samples:
            raise ApiError(
                413, f"{len(req.samples)} samples in one request; the limit is {self.max_samples}"
            )
        with self.lock:
            tag = f"s{next(self._submissions)}"
            summary: list[dict[str, Any]] = []
            errors: list[str] = []
            memory_info: dict[str, Any] = {}
            if req.rollouts is not None:
                self.buffer.add(self._client_rollouts(req.rollouts, tag))
            if req.samples:
                samples = [self._with_images(s.to_sample()) for s in req.samples]
                results = self.trainer.collect(samples, tag=tag)
                self.samples_seen += len(samples)
                failed = {r.group for r in results if r.error is not None}
                errors = sorted({r.error for r in results if r.error})[:5]
                ok = [r for r in results if r.group not in failed]
                self.buffer.add(ok)
                summary = [
                    {
                        "data_id": r.sample.get("data_id"),
                        "group": r.group,
                        "index": r.index,
                        "answer": r.trajectory.final_answer if r.trajectory else None,
                        "reward": r.reward if r.error is None else None,
                        "judgement": r.extras.get("judgement"),
                        "replanned": bool(r.trajectory and r.trajectory.replanned),
                        "error": r.error,
                    }
                    for r in results
                ]
                memory_info = self._memory_hooks(tag, ok)
            steps: list[dict[str, Any]] = []
            while (batch := self.buffer.take(self.target_rows)) is not None:
                steps.append(self._learn(batch))
            if req.flush_partial or req.finish:
                rest = self.buffer.take_all()
                if any(len(g) > 1 for g in group_results(rest).values()):
                    steps.append(self._learn(rest))
            if req.finish:
                self.done = True
        out: dict[str, Any] = {
            "status": "step" if steps else "rollout",
            "global_steps": self.trainer.step,
            "steps": len(steps),
            "metrics": steps[-1] if steps else {},
            "rollout_buffer_len": self.buffer.rows,
            "rollouts": summary,
            "failed_rollouts": sum(1 for s in summary if s["error"]),
            "errors": errors,
            "memory": memory_info,
            "done": self.done,
            "epoch": req.epoch,
        }
        return out

    def _with_images(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not sample["images"] and sample["data_id"] in self.images:
            sample["images"] = list(self.images[sample["data_id"]])
            if not sample["image_caption"]:
                sample["modality"] = "text-image"
        return sample

    def register_images(self, req: RegisterImagesRequest) -> dict[str, Any]:
        """Keep each question's first image (the reference's rule) by ``data_id``."""
        try:
            entries = req.all_entries()
        except ValueError as err:
            raise ApiError(422, str(err)) from None
        staged: dict[str, list[str]] = {}
        for k, entry in enumerate(entries):
            key = str(entry.data_id).strip()
            if not key:
                raise ApiError(422, f"entries[{k}].data_id: must not be empty")
            first = entry.images[0] if entry.images else None
            if isinstance(first, Mapping):  # {"bytes": <base64>} as datasets writes images
                first = first.get("bytes")
            if first is not None and (not isinstance(first, str) or not first.strip()):
                raise ApiError(422, f"entries[{k}].images[0]: send a base64 string or a data: URL")
            staged[key] = [first] if first else []
        self.images.update(staged)
        return {"status": "success", "registered": len(staged), "total": len(self.images)}

    def _learn(self, batch: list[RolloutResult]) -> dict[str, Any]:
        metrics = self.trainer.learn(batch)  # logged by the trainer
        clean = {
            k: v for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
        }
        self._last_metrics = clean
        return clean

    def save_checkpoint(self) -> dict[str, Any]:
        with self.lock:
            if self.trainer.step < 1:
                raise ApiError(400, "no update yet: nothing to checkpoint")
            path = self.trainer.save_checkpoint({"stream_samples": self.samples_seen})
            return {
                "ok": True,
                "checkpoint_global_step": self.trainer.step,
                "global_steps": self.trainer.step,
                "path": str(path),
            }


# ----------------------------------------------------------------------------- HTTP


def _flag(value: str | None) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _submit_request(data: Any) -> SubmitRequest:
    """``data`` as a :class:`SubmitRequest`; else a 422 naming the first problem's field."""
    try:
        return SubmitRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise ApiError(422, f"{loc or 'body'}: {first.get('msg', 'invalid')}") from None


def _reference_body(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A reference ``{key: <collated batch>, epoch, finish, flush_partial}`` as our request."""
    try:
        samples = samples_from_reference_batch(data.get(key))
    except ReferenceBatchError as err:
        raise ApiError(422, str(err)) from None
    out: dict[str, Any] = {"samples": samples}
    for flag in ("epoch", "finish", "flush_partial"):
        if flag in data:
            out[flag] = data[flag]
    return out


def create_streaming_app(
    server: StreamingServer,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    app = create_app(
        "ttrl_streaming",
        token=token,
        max_body_bytes=max_body_bytes,
        health=server.health,
        binary_types=SAFETENSORS_TYPES,
    )
    app.state.server = server

    @app.post("/submit_sample", summary="buffer samples or rollouts; update when a batch is full")
    async def submit_sample(request: Request) -> dict[str, Any]:
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        body = await request.body()
        if ctype in SAFETENSORS_TYPES:
            try:
                rows, meta = rollouts_from_safetensors(body)
            except CodecError as err:
                raise ApiError(400, str(err), "bad_safetensors") from None
            q = request.query_params
            data: Any = {
                "rollouts": rows,
                "finish": _flag(q.get("finish", meta.get("finish"))),
                "flush_partial": _flag(q.get("flush_partial", meta.get("flush_partial"))),
                "epoch": int(q.get("epoch", meta.get("epoch", 0)) or 0),
            }
        elif ctype == "application/json":
            try:
                data = json.loads(body or b"null")
            except ValueError as err:
                raise ApiError(400, f"malformed JSON body: {err}", "bad_json") from None
        else:
            raise ApiError(415, f"content type {ctype!r}: send application/json or safetensors")
        if not isinstance(data, dict):
            raise ApiError(422, "the body must be a JSON object")
        if "rollout" in data:  # the reference client's body
            data = _reference_body(data, "rollout")
        req = _submit_request(data)
        if req.samples is None and req.rollouts is None and not (req.finish or req.flush_partial):
            raise ApiError(422, "send samples or rollouts (or finish / flush_partial)")
        return await run_in_threadpool(server.submit, req)

    @app.post("/submit_batch", summary="the reference's one full rollout + update step")
    async def submit_batch(body: dict[str, Any]) -> dict[str, Any]:
        """``{"batch": <collated batch>, "epoch", "finish"}``: roll out its questions, then train
        on everything buffered (partial groups included, as ``flush_partial``)."""
        data = _reference_body({**body, "flush_partial": True}, "batch")
        req = _submit_request(data)
        return await run_in_threadpool(server.submit, req)

    @app.post("/streaming/register_images", summary="a question's image, by data_id")
    async def register_images(body: RegisterImagesRequest) -> dict[str, Any]:
        """``{"entries": [{"data_id", "images": [...]}]}`` or one entry -> ``{status,
        registered, total}``; the first image is kept for samples sent without images."""
        return server.register_images(body)

    @app.get("/streaming/health", summary="the image registry")
    async def streaming_health() -> dict[str, Any]:
        return {"status": "ok", "registered_images": len(server.images)}

    @app.post("/save_checkpoint", summary="checkpoint the Planner now")
    async def save_checkpoint() -> dict[str, Any]:
        return await run_in_threadpool(server.save_checkpoint)

    return app


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ttrl_streaming.server",
        description="Streaming TTRL server: POST /submit_sample, POST /save_checkpoint, "
        "GET /health (configs/ttrl_streaming/server.yaml; trailing key=value overrides).",
    )
    add_server_args(p, default_port=DEFAULT_PORT, env_prefix="STREAMING")
    p.add_argument("--config-name", "--config", dest="config_name", default="server")
    p.add_argument(
        "--cfg", action="store_true", help="print the composed config (defaults filled) and exit"
    )
    add_help_config(p, StreamingServerConfig)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise MiaError(f"overrides must look like key=value, got {bad}")
    cfg = load_config(args.config_name, list(args.overrides))
    if args.cfg:
        print(to_yaml(cfg))
        return
    setup_logging(args.log_level)
    server = StreamingServer(cfg).start()
    app = create_streaming_app(server, token=args.token, max_body_bytes=args.max_body_bytes)
    try:
        serve_app(app, args)
    finally:
        server.close()


def run() -> None:
    with cli_errors("ttrl_streaming.server", interrupted=False):
        main()


if __name__ == "__main__":
    run()
