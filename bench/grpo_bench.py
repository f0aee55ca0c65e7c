"""GRPO benchmark: our engine vs TRL's GRPOTrainer, and agent-loop rollouts vs raw generate.

    python bench/grpo_bench.py                    # 2 warm-up + 8 timed steps each, B=8, n=8
    python bench/grpo_bench.py --steps 3 --skip-trl
    python bench/grpo_bench.py --markdown         # the tables as Markdown (docs/benchmarks.md)

Same tiny Qwen2 (``mia.models.tiny``, random weights), same chat prompts, group size, batch,
completion budget, sampling temperature and learning rate on both sides, single process on the
CPU, one torch thread by default (``--threads``). Reward: a deterministic function of the
completion text, so both sides do the same work per step.

- **ours**: ``mia.rl.trainer.Trainer`` in single_process mode with the transformers generator
  and a one-turn episode, three rows: the defaults (``old_logprobs=auto``: one optimizer step
  per batch, so the update's own log-probs, detached, are the old ones -- no extra forward,
  exact, what TRL does with ``num_iterations=1``), ``old_logprobs=recompute`` (one more policy
  forward per step, the default before) and ``old_logprobs=rollout`` (the generator's).
- **TRL**: ``trl.GRPOTrainer`` (generation by ``model.generate``), ``beta=0`` (no reference
  model), ``loss_type=dapo`` (token-mean, like ours), one optimizer step per generation batch.

Step time = wall time of a whole step (generation + scoring + update + weight sync), median of
the timed steps; tokens/s = (prompt + completion tokens of a step's sequences) / step time. The
default row and TRL are run ``--rounds`` times, alternating, and their medians taken over the
timed steps of all rounds, so a change in the machine's load hits both.

Rollout overhead: the same B x n prompts, same seeds, same stop strings, generated (a) by raw
concurrent ``generate`` calls on the transformers generator and (b) through the agent loop
(``AgentEpisode``: template, token bookkeeping, parsing; one turn) -- the sampled tokens are
identical, so the ratio is the loop's own cost. Median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

SYSTEM = "You are a helpful assistant."
TARGET_STEP_RATIO = 0.7  # ours / TRL step time
TARGET_ROLLOUT_RATIO = 1.1  # agent loop / raw generate


def prompts(count: int) -> list[str]:
    return [f"What is the secret of key {i % 10}? Look it up, then answer." for i in range(count)]


def text_reward_value(text: str) -> float:
    return min(text.count("e"), 8) / 8.0


# ----------------------------------------------------------------------------- ours


def bench_messages(sample: dict) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sample["q"]}]


class ChatTurn:
    """One assistant turn from a chat prompt (``messages_of(sample)``): the single-turn episode
    TRL's loop also runs for a conversational row (bench/rl_parity.py uses it too)."""

    def __init__(self, tokenizer: Any, messages_of: Any = bench_messages) -> None:
        self.tok = tokenizer
        self.messages_of = messages_of

    async def run(self, sample: dict, rollout: Any) -> Any:
        msgs = self.messages_of(sample)
        text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = self.tok.encode(text, add_special_tokens=False)
        res = await rollout.generator.generate(ids, rollout.sampling)

        class Traj:
            prompt_ids = ids
            response_ids = list(res.token_ids)
            response_mask = [1] * len(res.token_ids)
            rollout_logprobs = list(res.logprobs)
            final_text = res.text

        return Traj()


def run_ours(model_dir: Path, args: argparse.Namespace, old_logprobs: str | None) -> dict[str, Any]:
    """``old_logprobs`` None = the trainer's default."""
    from mia.models.tiny import build_tokenizer
    from mia.rl.trainer import Trainer

    tok = build_tokenizer()
    data = [{"q": q} for q in prompts(args.batch * (args.steps + args.warmup))]
    cfg = {
        "model_path": str(model_dir),
        "run_dir": tempfile.mkdtemp(prefix="grpo-bench-"),
        "seed": 0,
        "batch_size": args.batch,
        "n": args.n,
        "total_steps": args.steps + args.warmup,
        "shuffle": False,
        "skip_tied_steps": False,  # always update, like TRL
        "save_freq": -1,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens},
        "policy": {
            "micro_batch_size": args.batch * args.n,
            "logprob_micro_batch_size": args.batch * args.n,
            "optim": {"lr": 1e-5, "weight_decay": 0.0},
        },
        "workers": {"mode": "single_process"},
        "generator": {"max_batch_size": args.batch * args.n},
        "logging": {"console": False, "jsonl": False},
    }
    if old_logprobs is not None:
        cfg["old_logprobs"] = old_logprobs
    trainer = Trainer(cfg, ChatTurn(tok), lambda s, t: text_reward_value(t.final_text), data)
    history = trainer.fit()
    timed = history[args.warmup :]
    step = statistics.median(h["time/step"] for h in timed)
    tokens = statistics.mean(h["perf/total_tokens"] for h in timed)
    return {
        "step_s": step,
        "steps": [h["time/step"] for h in timed],
        "tokens": tokens,
        "tokens_per_s": tokens / step,
        "completion_len": statistics.mean(h["response/length_mean"] for h in timed),
        "rollout_s": statistics.mean(h["time/rollout"] for h in timed),
        "old_logprobs_s": statistics.mean(h["time/old_logprobs"] for h in timed),
        "update_s": statistics.mean(h["time/update"] for h in timed),
        "sync_s": statistics.mean(h["time/sync"] for h in timed),
    }


# ----------------------------------------------------------------------------- TRL


def run_trl(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from mia.models.tiny import build_tokenizer
    from mia.precision import autocast_dtype

    tok = build_tokenizer()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    rows = [
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
        for q in prompts(args.batch * (args.steps + args.warmup))
    ]
    ds = datasets.Dataset.from_list(rows)

    def reward(prompts: list, completions: list, **_: Any) -> list[float]:
        out = []
        for c in completions:
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            out.append(text_reward_value(text))
        return out

    times: list[float] = []
    logs: list[dict[str, float]] = []

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _a: Any, _s: Any, _c: Any, logs_: dict | None = None, **kw: Any) -> None:
            logs.append(dict(kw.get("logs") or logs_ or {}))

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=args.batch * args.n,
        num_generations=args.n,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=1e-5,
        weight_decay=0.0,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        max_steps=args.steps + args.warmup,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        gradient_checkpointing=False,  # TRL's default is on; ours recomputes no activations
        # The precision ours chooses on this CPU (bf16 autocast where native), so both sides
        # compute alike; MIA_BF16=0 makes both float32.
        bf16=autocast_dtype("auto", "cpu") is not None,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Timer()],
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no log dicts
    trainer.train()
    timed = times[args.warmup :]
    step = statistics.median(timed)
    # TRL logs the cumulative token count (prompt + completion) as num_tokens.
    counts = [entry["num_tokens"] for entry in logs if "num_tokens" in entry]
    per_step = [b - a for a, b in zip([0.0] + counts[:-1], counts, strict=True)][args.warmup :]
    lengths = [e["completions/mean_length"] for e in logs if "completions/mean_length" in e]
    tokens = statistics.mean(per_step) if per_step else float("nan")
    return {
        "step_s": step,
        "steps": timed,
        "tokens": tokens,
        "tokens_per_s": tokens / step,
        "completion_len": statistics.mean(lengths[args.warmup :]) if lengths else float("nan"),
        "rollout_s": float("nan"),
    }


# ----------------------------------------------------------------------------- rollouts


def run_rollouts(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from mia.agent import ExecutorLoop
    from mia.llm.base import SamplingParams
    from mia.rl.episode import AgentEpisode, Rollout, SeededGenerator, mix_seed
    from mia.rl.generators import make_generator

    class ShortPrompt(ExecutorLoop):
        def build_messages(self, task: Any) -> tuple[list, list]:
            return [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": task.question},
            ], []

    rows = args.batch * args.n
    gen = make_generator({"model_path": str(model_dir), "max_batch_size": rows})
    episode = AgentEpisode([], {"max_turns": 1, "tools": {}}, loop_cls=ShortPrompt)
    stops = list(episode.cfg.stop)
    qs = prompts(rows)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)
    tok = gen.tokenizer

    async def raw(r: int) -> tuple[float, int]:
        # What any batched pipeline does: render + tokenise the prompts, generate, decode.
        t0 = time.perf_counter()
        prompt_ids = []
        for q in qs:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            prompt_ids.append(tok.encode(text, add_special_tokens=False))
        outs = await asyncio.gather(
            *(
                gen.generate(
                    ids,
                    SamplingParams(
                        temperature=1.0,
                        max_tokens=args.max_tokens,
                        stop=stops,
                        seed=mix_seed(mix_seed(r, i), 0),  # the seed the loop's call gets
                    ),
                )
                for i, ids in enumerate(prompt_ids)
            )
        )
        return time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)

    async def loop(r: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        trajs = await asyncio.gather(
            *(
                episode.run(
                    {"question": q},
                    Rollout(generator=SeededGenerator(gen, mix_seed(r, i)), sampling=params),
                )
                for i, q in enumerate(qs)
            )
        )
        return time.perf_counter() - t0, sum(sum(t.response_mask) for t in trajs)

    async def main() -> dict[str, Any]:
        await raw(-1)  # warm-up
        await loop(-1)
        raw_t, loop_t, raw_n, loop_n = [], [], [], []
        for r in range(args.repeats):
            t, n = await raw(r)
            raw_t.append(t)
            raw_n.append(n)
            t, n = await loop(r)
            loop_t.append(t)
            loop_n.append(n)
        return {
            "raw_s": statistics.median(raw_t),
            "loop_s": statistics.median(loop_t),
            "raw_tokens": statistics.mean(raw_n),
            "loop_tokens": statistics.mean(loop_n),
            "batches": gen.chat._engine.batches,
        }

    try:
        return asyncio.run(main())
    finally:
        gen.close()


# ----------------------------------------------------------------------------- report


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's rounds as one row: the median over every timed step of every round."""
    steps = [t for r in runs for t in r["steps"]]
    step = statistics.median(steps)
    out = {k: statistics.mean(r[k] for r in runs) for k in runs[0] if k != "steps"}
    out.update(step_s=step, steps=steps, tokens_per_s=out["tokens"] / step, rounds=len(runs))
    return out


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of the default row and of TRL, alternating (load drift hits "
                    "both); each row is the median over all their timed steps")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=15, help="rollout comparison runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    import logging

    import torch

    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    tok = build_tokenizer()
    model_dir = save_tiny(tiny_qwen2(tok, seed=0), tok, Path(tempfile.mkdtemp()) / "tiny")

    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch threads {args.threads}",
        "config": vars(args) | {"json": str(args.json) if args.json else None},
    }
    print(f"# GRPO bench: B={args.batch} n={args.n} max_tokens={args.max_tokens} "
          f"steps={args.steps}(+{args.warmup} warm-up)", flush=True)  # fmt: skip
    ours, trl_runs = [], []
    for r in range(args.rounds):
        ours.append(run_ours(model_dir, args, None))
        print(f"ours (default), round {r + 1}: {_brief(ours[-1])}", flush=True)
        if not args.skip_trl:
            trl_runs.append(run_trl(model_dir, args))
            print(f"trl, round {r + 1}: {_brief(trl_runs[-1])}", flush=True)
    results["ours"] = merge(ours)
    if trl_runs:
        results["trl"] = merge(trl_runs)
    results["ours_recompute"] = run_ours(model_dir, args, "recompute")
    print(f"ours (recompute): {_brief(results['ours_recompute'])}", flush=True)
    results["ours_rollout_lp"] = run_ours(model_dir, args, "rollout")
    print(f"ours (rollout lp): {_brief(results['ours_rollout_lp'])}", flush=True)
    results["rollouts"] = run_rollouts(model_dir, args)
    print(f"rollouts: {results['rollouts']}", flush=True)
    results["load"] = {"start": load_start, "end": os.getloadavg()}

    trl = results.get("trl", {})
    rows = [("ours, default (old_logprobs=auto)", results["ours"])]
    rows.append(("ours (old_logprobs=recompute)", results["ours_recompute"]))
    rows.append(("ours (old_logprobs=rollout)", results["ours_rollout_lp"]))
    if trl:
        rows.append(("TRL GRPOTrainer", trl))
    sep = "|" if args.markdown else " "
    print()
    header = ["engine", "step s", "tokens/s", "completion len", "vs TRL step",
              "rollout s", "old lp s", "update s"]  # fmt: skip
    lines = [header]
    for name, r in rows:
        ratio = r["step_s"] / trl["step_s"] if trl else float("nan")
        lines.append([name, fmt(r["step_s"]), fmt(r["tokens_per_s"], 0),
                      fmt(r["completion_len"], 1), fmt(ratio, 2), fmt(r["rollout_s"]),
                      fmt(r.get("old_logprobs_s", float("nan"))),
                      fmt(r.get("update_s", float("nan")))])  # fmt: skip
    ro = results["rollouts"]
    _print_table(lines, sep)
    print()
    rr = ro["loop_s"] / ro["raw_s"]
    _print_table(
        [
            ["rollout (B x n rows, 1 turn)", "median s", "policy tokens"],
            ["raw batched generate", fmt(ro["raw_s"]), fmt(ro["raw_tokens"], 0)],
            ["agent loop (AgentEpisode)", fmt(ro["loop_s"]), fmt(ro["loop_tokens"], 0)],
            ["ratio loop / raw", fmt(rr, 2), ""],
        ],
        sep,
    )
    print()
    verdicts = []
    if trl:
        best = min(r["step_s"] for name, r in rows if name.startswith("ours"))
        default = results["ours"]["step_s"] / trl["step_s"]
        verdicts.append(
            f"step time vs TRL: default {default:.2f}x, best {best / trl['step_s']:.2f}x "
            f"(target <= {TARGET_STEP_RATIO}x): "
            + ("met" if default <= TARGET_STEP_RATIO else "MISSED")
        )
    verdicts.append(
        f"agent loop vs raw generate: {rr:.2f}x (target <= {TARGET_ROLLOUT_RATIO}x): "
        + ("met" if rr <= TARGET_ROLLOUT_RATIO else "MISSED")
    )
    for v in verdicts:
        print(v)
    print(f"machine: {results['machine']}; load avg {load_start[0]:.1f} -> "
          f"{results['load']['end'][0]:.1f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


def _brief(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in r.items() if isinstance(v, float))


def _print_table(lines: list[list[str]], sep: str) -> None:
    if sep == "|":
        print("| " + " | ".join(lines[0]) + " |")
        print("|" + "|".join("---" for _ in lines[0]) + "|")
        for row in lines[1:]:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    for row in lines:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
