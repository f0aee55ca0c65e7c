"""The streaming TTRL client (docs/reference.md §3.6): pushes questions to the training server and
their ground truths (or the user's feedback) to the reward server.

    python -m ttrl_streaming.client --data test.parquet [--batch-size 4] [--save-every 50]
    python -m ttrl_streaming.client --stdin       # questions + your reference answers

``--data``: a parquet / JSON / JSONL file in the reference formats; chunk by chunk the client
registers the ground truths (``/register_gts``) and posts the questions (``/submit_sample``;
the last chunk flushes the buffer and finishes the stream); every ``--save-every`` updates it
asks for a checkpoint, and once more at the end. Ground truth never goes to the training server.

``--stdin``: one question at a time, with your feedback = the answer you consider right
(interactive prompts on a terminal; otherwise lines ``question<TAB>answer`` or JSON objects
``{"question", "answer"}``). The Planner's answers and rewards are printed back.

URLs: ``--server`` (or ``STREAMING_URL``, default http://127.0.0.1:8765), ``--reward-url``
(or ``GT_REWARD_URL``, default http://127.0.0.1:6000). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from mia.cli_support import cli_errors
from mia.errors import MiaError
from mia.services import RewardClient
from mia.services.streaming import StreamingClient


def wire_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """What the training server gets: the question side only (no ground truth)."""
    out = {"data_id": str(sample["data_id"]), "question": sample["question"]}
    for key in ("image_caption", "modality", "images", "data_source"):
        if sample.get(key):
            out[key] = sample[key]
    return out


def _line(done: int, total: int | None, t0: float, resp: Mapping[str, Any]) -> str:
    rate = done / max(time.perf_counter() - t0, 1e-9)
    eta = ""
    if total:
        eta = f" | eta {max(total - done, 0) / max(rate, 1e-9):.0f}s"
    rewards = [r["reward"] for r in resp.get("rollouts", []) if r.get("reward") is not None]
    mean = f" | reward {sum(rewards) / len(rewards):.3f}" if rewards else ""
    failed = f" | failed {resp['failed_rollouts']}" if resp.get("failed_rollouts") else ""
    where = f"{done}/{total}" if total else f"{done}"
    return (
        f"[{where}] {resp.get('status')} | step {resp.get('global_steps')} | buffer "
        f"{resp.get('rollout_buffer_len')}{mean}{failed} | {rate:.2f} q/s{eta}"
    )


class Session:
    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.server = StreamingClient(args.server, token=args.token, timeout_s=args.timeout)
        self.reward = (
            None
            if args.no_register
            else RewardClient(args.reward_url, token=args.reward_token, timeout_s=60)
        )
        self.last_saved = 0
        self.steps = 0

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def register(self, samples: list[Mapping[str, Any]]) -> None:
        if self.reward is None:
            return
        entries = [(str(s["data_id"]), list(s["golds"])) for s in samples if s.get("golds")]
        missing = [str(s["data_id"]) for s in samples if not s.get("golds")]
        if missing:
            raise MiaError(
                f"no ground truth for {missing[:3]}: the reward server needs one per question "
                "(or pass --no-register when they are registered already)"
            )
        self.reward.sync.register(entries)

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.server.sync.submit(body)
        self.steps = int(resp.get("global_steps", self.steps))
        if self.args.json:
            self.say(json.dumps(resp))
        return resp

    def maybe_checkpoint(self) -> None:
        every = self.args.save_every
        if every > 0 and self.steps - self.last_saved >= every:
            self.checkpoint()

    def checkpoint(self) -> None:
        if self.steps < 1 or self.steps == self.last_saved:
            return
        saved = self.server.sync.save_checkpoint()
        self.last_saved = int(saved.get("checkpoint_global_step", self.steps))
        self.say(f"checkpoint: step {self.last_saved} -> {saved.get('path')}")

    # ---- dataset
    def run_dataset(self) -> None:
        from mia.roles.samples import load_samples

        args = self.args
        samples = load_samples(args.data, require_answer=not args.no_register, limit=args.limit)
        health = self.server.sync.health()
        tbs = int(health.get("train_batch_size", 0) or 0)
        if tbs and tbs % args.batch_size:
            self.say(
                f"note: train_batch_size {tbs} is not a multiple of --batch-size "
                f"{args.batch_size}; updates take whole question groups as they fill up"
            )
        total = len(samples) * args.epochs
        done, t0 = 0, time.perf_counter()
        for epoch in range(args.epochs):
            for start in range(0, len(samples), args.batch_size):
                chunk = samples[start : start + args.batch_size]
                last = epoch == args.epochs - 1 and start + args.batch_size >= len(samples)
                self.register(chunk)
                resp = self.submit(
                    {
                        "samples": [wire_sample(s) for s in chunk],
                        "finish": last,
                        "flush_partial": last,
                        "epoch": epoch,
                    }
                )
                done += len(chunk)
                if not args.json:
                    self.say(_line(done, total, t0, resp))
                self.maybe_checkpoint()
        self.checkpoint()
        self.say(f"done: {done} questions streamed, {self.steps} updates")

    # ---- stdin
    def _questions(self, stream: TextIO) -> Iterator[tuple[str, str]]:
        interactive = stream.isatty()
        while True:
            if interactive:
                print("question> ", end="", file=self.out, flush=True)
            line = stream.readline()
            if not line:
                return
            line = line.strip()
            if not line:
                continue
            if interactive:
                print("your answer (feedback)> ", end="", file=self.out, flush=True)
                answer = stream.readline().strip()
                yield line, answer
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise MiaError(f"stdin: invalid JSON line: {err}") from None
                if not isinstance(obj, dict) or not obj.get("question"):
                    raise MiaError('stdin: a JSON line needs {"question": ..., "answer": ...}')
                yield str(obj["question"]), str(obj.get("answer") or obj.get("feedback") or "")
            else:
                question, _, answer = line.partition("\t")
                yield question.strip(), answer.strip()

    def run_stdin(self, stream: TextIO) -> None:
        session = uuid.uuid4().hex[:8]
        n = 0
        t0 = time.perf_counter()
        for question, answer in self._questions(stream):
            if not answer and self.reward is not None:
                self.say("skipped: no feedback answer for this question")
                continue
            sample = {"data_id": f"stdin-{session}-{n}", "question": question, "golds": [answer]}
            self.register([sample])
            resp = self.submit({"samples": [wire_sample(sample)]})
            n += 1
            for r in resp.get("rollouts", []):
                if r.get("error"):
                    self.say(f"  rollout {r['index']}: failed: {r['error']}")
                else:
                    self.say(
                        f"  rollout {r['index']}: answer {r.get('answer')!r} | reward "
                        f"{r.get('reward'):.3f} | {r.get('judgement')}"
                    )
            self.say(_line(n, None, t0, resp))
            self.maybe_checkpoint()
        if n:
            resp = self.submit({"finish": True, "flush_partial": True})
            self.say(_line(n, None, t0, resp))
        self.checkpoint()
        self.say(f"done: {n} questions streamed, {self.steps} updates")

    def close(self) -> None:
        self.server.close()
        if self.reward is not None:
            self.reward.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ttrl_streaming.client",
        description="Stream questions to the TTRL training server (ground truths to the reward "
        "server).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="parquet / JSON / JSONL questions with ground truths")
    src.add_argument("--stdin", action="store_true", help="questions and your feedback on stdin")
    p.add_argument("--server", default=os.environ.get("STREAMING_URL", "http://127.0.0.1:8765"))
    p.add_argument("--reward-url", default=os.environ.get("GT_REWARD_URL", "http://127.0.0.1:6000"))
    p.add_argument("--token", default=os.environ.get("STREAMING_TOKEN"))
    p.add_argument("--reward-token", default=os.environ.get("REWARD_SERVER_TOKEN"))
    p.add_argument("--batch-size", type=int, default=4, help="questions per request (default 4)")
    p.add_argument(
        "--save-every", type=int, default=50, help="checkpoint every K updates (0: only at the end)"
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="first N questions of --data")
    p.add_argument(
        "--no-register", action="store_true", help="ground truths are already registered"
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per request")
    p.add_argument("--json", action="store_true", help="print every server answer as JSON")
    return p


def main(
    argv: list[str] | None = None, stdin: TextIO | None = None, out: TextIO | None = None
) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch_size < 1 or args.epochs < 1 or args.save_every < 0:
        raise MiaError("--batch-size and --epochs must be >= 1, --save-every >= 0")
    session = Session(args, out or sys.stdout)
    try:
        if args.data:
            session.run_dataset()
        else:
            session.run_stdin(stdin or sys.stdin)
    finally:
        session.close()


def run() -> None:
    with cli_errors("ttrl_streaming.client", interrupted=False):
        main()


if __name__ == "__main__":
    run()
