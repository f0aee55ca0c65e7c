"""Executor GRPO where the shipped SFT Executor has headroom: bridge and comparison questions.

    python bench/executor_grpo.py                        # world 116's 192 questions, 16 steps
    python bench/executor_grpo.py --steps 2 --eval-limit 8 --out /tmp/eg   # a short real run

1. Worlds: the train world ``--train-world`` (train range, configs/world/seeds.yaml; no shipped
   role trained on 116) and the dev worlds ``--dev-worlds``, each generated and indexed with
   BM25 once under ``$MIA_HOME/demo``, as ``mia demo`` builds them. Training questions: the
   train world's ``train`` split, text-only, types ``bridge`` and ``comparison``; evaluation
   questions: the same types of each dev world's ``test`` split.
2. GRPO: ``python -m executor_train experiment=embedded_sft_grpo`` on the shipped SFT Executor
   (``python -m mia.apps.warm_start executor``) against the train world's local_search, with
   ``--steps``, ``--batch`` questions x ``--n`` rollouts a step and ``--lr`` (after ``--``:
   more ``executor_train`` overrides). Then the last checkpoint merged into a folder.
3. Evaluation: ``bench/executor_eval.py`` (the Executor alone, greedy, float32, as the eval
   policy ``none`` serves it, the demo's loop stop) of the SFT Executor and of the GRPO one on
   the dev questions, and the paired difference GRPO - SFT per type with 95 % intervals
   clustered by (world, relation chain).

It prints each step's mean reward, its accuracy and the share of tied groups (every rollout of a
question scored alike, so GRPO's advantage is 0 and the group teaches nothing), then both
models' accuracy and the paired difference, and writes them to ``OUT/executor_grpo.json``.
Rerunning with the same ``--out`` resumes: finished stages are read back, training resumes from
its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import executor_eval  # noqa: E402
from ci import em, load_rows  # noqa: E402

TYPES = ("bridge", "comparison")


def sh(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def world(seed: int) -> tuple[Path, Path]:
    """(world folder, BM25 index folder) of ``seed``, generated once under ``$MIA_HOME/demo``
    as ``mia demo`` and the efficacy bench build them."""
    from mia.apps.demo import demo_home, ensure_index, ensure_world

    folder = ensure_world(demo_home(), seed, "default")
    return folder, ensure_index(demo_home(), folder)


def subset(src: Path, dst: Path) -> list[dict[str, Any]]:
    """The text-only bridge and comparison questions of ``src``, written to ``dst``."""
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    keep = [
        r for r in rows
        if r["modality"] == "text-only" and r["extra_info"]["question_type"] in TYPES
    ]  # fmt: skip
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return keep


def train(args: argparse.Namespace, sft: Path, data: Path, index: Path) -> Path:
    """GRPO on ``data`` against ``index``'s local_search; the merged last checkpoint."""
    from mia.eval.supervisor import ServiceGroup, ServiceSpec, thread_env

    merged = args.out / "grpo-merged"
    if (merged / "config.json").is_file():
        print(f"GRPO: done earlier, {merged}", flush=True)
        return merged
    run_dir = args.out / "grpo"
    with ServiceGroup(args.out / "services", log_fn=print) as group:
        url = group.start(
            [
                ServiceSpec(
                    "local_search",
                    "local_search",
                    ["serve", "--index", str(index)],
                    env=thread_env(1),
                )
            ]  # fmt: skip
        )["local_search"]
        sh([sys.executable, "-m", "executor_train", "experiment=embedded_sft_grpo",
            f"model_path={sft}", f"data.train={data}", f"agent.tools.search.params.url={url}",
            f"trainer.run_dir={run_dir}", f"trainer.total_steps={args.steps}",
            f"trainer.batch_size={args.batch}", f"trainer.n={args.n}",
            *([f"trainer.policy.optim.lr={args.lr}"] if args.lr else []), f"trainer.seed={args.seed}",
            "trainer.resume=auto", *args.overrides])  # fmt: skip
    last = run_dir / "checkpoints" / f"global_step_{args.steps}"
    sh([sys.executable, "-m", "mia.rl.model_merger", "merge", "--backend", "fsdp",
        "--local_dir", str(last), "--target_dir", str(merged)])  # fmt: skip
    return merged


def evaluate(args: argparse.Namespace, name: str, model: Path, worlds: list[str]) -> Path:
    out = args.out / f"eval-{name}"
    if not (out / "summary-ci.json").is_file():
        os.environ["MIA_BF16"] = "0"  # float32: greedy decoding reproducible on every CPU
        argv = ["--model", str(model), "--out", str(out), "--repeat-stop", "32"]
        argv += [a for w in worlds for a in ("--world", w)]
        if args.eval_limit:
            argv += ["--limit", str(args.eval_limit)]
        executor_eval.main(argv)
    return out


def steps_table(run_dir: Path) -> list[dict[str, float]]:
    """Per step: mean reward, accuracy and the share of tied groups (metrics.jsonl)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    keys = {"reward/mean": "reward", "reward/acc_final": "acc", "reward/groups_all_equal": "tied",
            "actor/skipped": "skipped", "actor/grad_norm": "grad_norm"}  # fmt: skip
    return [{"step": r["step"], **{v: r[k] for k, v in keys.items() if k in r}} for r in rows]


def paired(sft: Path, grpo: Path, dev: dict[str, Path]) -> dict[str, Any]:
    """GRPO - SFT per type and overall, clustered by (world, relation chain)."""
    from mia.eval.stats import paired_cluster_bootstrap_ci

    out: dict[str, Any] = {}
    pooled: dict[str, list[tuple[float, float, str]]] = {}
    for name, folder in dev.items():
        info = {}
        for line in (folder / "test.jsonl").read_text().splitlines():
            r = json.loads(line)
            info[str(r["id"])] = (r["extra_info"]["question_type"], r["extra_info"]["relation"])
        a = {str(r["id"]): em(r) for r in load_rows(grpo / name / "none" / "results.jsonl")}
        b = {str(r["id"]): em(r) for r in load_rows(sft / name / "none" / "results.jsonl")}
        for qid in sorted(set(a) & set(b)):
            kind, relation = info[qid]
            for g in ("all", kind):
                pooled.setdefault(g, []).append((a[qid], b[qid], f"{name}:{relation}"))
    for g, trip in pooled.items():
        x, y, c = zip(*trip, strict=True)
        d, lo, hi = paired_cluster_bootstrap_ci(x, y, c)
        out[g] = {"n": len(x), "sft": statistics.mean(y), "grpo": statistics.mean(x),
                  "delta": d, "ci95_clustered": [lo, hi], "clusters": len(set(c)),
                  "won": sum(u > v for u, v in zip(x, y, strict=True)),
                  "lost": sum(u < v for u, v in zip(x, y, strict=True))}  # fmt: skip
    return out


def drift(sft: Path, grpo: Path, evals: Path, names: list[str]) -> dict[str, float]:
    """How far GRPO moved the Executor, read on the GRPO model's own dev transcripts, tokenised
    as the agent loop holds them (``mia.rl.sft_data``): the mean per-token KL(GRPO || SFT) over
    the Executor's tokens and the share of those tokens whose most likely next token differs
    between the two models (greedy decoding follows it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mia.rl.sft_data import tokenize_rows

    tok = AutoTokenizer.from_pretrained(sft)
    rows = [r for name in names for r in load_rows(evals / name / "none" / "results.jsonl")]
    chats, report = tokenize_rows(rows, tok)
    models = [
        AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32).eval() for m in (grpo, sft)
    ]
    kl_sum, flips, n = 0.0, 0, 0
    for chat in chats:
        ids = torch.tensor([chat.input_ids])
        keep = torch.tensor(chat.loss_mask[1:], dtype=torch.bool)  # token t is predicted at t - 1
        with torch.no_grad():
            g, s = (torch.log_softmax(m(ids).logits[0, :-1], -1)[keep] for m in models)
        kl_sum += float((g.exp() * (g - s)).sum())
        flips += int((g.argmax(-1) != s.argmax(-1)).sum())
        n += int(keep.sum())
    return {"transcripts": len(chats), "refused": len(report.errors), "tokens": n,
            "kl_per_token": kl_sum / max(n, 1), "top1_changed": flips / max(n, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-world", type=int, default=116, help="a train-range world seed")
    p.add_argument("--dev-worlds", default="10000,10001,10002", help="dev-range world seeds")
    p.add_argument("--steps", type=int, default=16, help="GRPO steps")
    p.add_argument("--batch", type=int, default=8, help="questions per step")
    p.add_argument("--n", type=int, default=4, help="rollouts per question")
    p.add_argument("--lr", type=float, help="LoRA learning rate (default: the experiment's)")
    p.add_argument("--seed", type=int, default=0, help="the trainer's seed")
    p.add_argument("--eval-limit", type=int, help="first N questions of each dev subset")
    p.add_argument("--out", type=Path, default=Path("runs/executor_grpo"))
    p.add_argument("overrides", nargs="*", help="after --: executor_train key=value overrides")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mia.apps.warm_start import warm_role_dir

    args.out = args.out.resolve()
    tw, tidx = world(args.train_world)
    data = args.out / "data" / "train.jsonl"
    print(f"train world {args.train_world}: {len(subset(tw / 'train.jsonl', data))} questions")
    dev, specs = {}, []
    for seed in (int(s) for s in args.dev_worlds.split(",")):
        w, idx = world(seed)
        folder = args.out / "data" / f"dev-{seed}"
        print(f"dev world {seed}: {len(subset(w / 'test.jsonl', folder / 'test.jsonl'))} questions")
        dev[f"dev{seed}"] = folder
        specs.append(f"dev{seed}={folder}:{idx}")
    sft = Path(warm_role_dir("executor"))
    grpo = train(args, sft, data, tidx)
    ev_sft = evaluate(args, "sft", sft, specs)
    ev_grpo = evaluate(args, "grpo", grpo, specs)
    steps = steps_table(args.out / "grpo")
    diff = paired(ev_sft, ev_grpo, dev)
    moved = drift(sft, grpo, ev_grpo, list(dev))
    print("\n| step | reward | accuracy | tied groups |\n|---|---|---|---|")
    for s in steps:
        print(f"| {s['step']} | {s.get('reward', 0):.3f} | {s.get('acc', float('nan')):.3f} "
              f"| {s.get('tied', 0):.2f} |")  # fmt: skip
    print(
        "\n| dev questions | n | clusters | SFT | SFT + GRPO | won / lost | GRPO - SFT [95% clustered] |"
    )
    print("|---|---|---|---|---|---|---|")
    for g, v in diff.items():
        lo, hi = v["ci95_clustered"]
        print(f"| {g} | {v['n']} | {v['clusters']} | {100 * v['sft']:.1f} | {100 * v['grpo']:.1f} "
              f"| {v['won']} / {v['lost']} | {100 * v['delta']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] |")  # fmt: skip
    print(
        f"\nmoved: KL(GRPO || SFT) {moved['kl_per_token']:.2e} a token, top-1 token changed at "
        f"{100 * moved['top1_changed']:.2f} % of {moved['tokens']} Executor tokens "
        f"({moved['transcripts']} transcripts, {moved['refused']} refused)"
    )
    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "sft_model": str(sft), "steps": steps, "paired": diff, "drift": moved}  # fmt: skip
    (args.out / "executor_grpo.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
