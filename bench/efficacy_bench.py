"""The efficacy bench: the pre-registered protocol (docs/protocol.md), or the development table
on world 1.

    python bench/efficacy_bench.py                     # the protocol: configs/efficacy/protocol.yaml
    python bench/efficacy_bench.py --protocol configs/efficacy/dev.yaml        # dev worlds
    python bench/efficacy_bench.py --protocol configs/efficacy/dev.yaml --baselines
    python bench/efficacy_bench.py --protocol configs/efficacy/dev.yaml --questions 8 \
        -- eval.workers=4                                   # dev only: mia demo arguments after --

**--protocol FILE** (default ``configs/efficacy/protocol.yaml``, the test worlds) runs exactly what the protocol file fixes (:mod:`mia.apps.protocol`): per
world, its stream (the test split's convention questions and its first N standard text
questions, in file order), in each order (``file``, and ``shuffled`` with
``random.Random("mia-protocol-order:<seed>")``), every row (``none``, ``mia``, ``feedback``, the
controls, ``rag``, ``ttrl``, ``ttrl_lr0``) on a fresh memory, as ``mia demo`` runs it, in
float32 (``MIA_BF16=0``). ``none`` reads and writes no memory, so it runs once per world and
stands for both orders (the output says so). It prints one table per scope (all, standard,
convention, and each question type): accuracy with 95% bootstrap intervals clustered by
(world, template), and the paired clustered differences against ``none`` and ``mia``; then the
targets, met or missed, each with its number. Under the run folder (``--out``, default
``runs/protocol-<name>-<time>``): ``streams/world-<seed>-<order>.json`` (each stream's
questions and every row's outcome per question), ``protocol.json`` (every table, difference and
target), ``protocol.png``, and each row's own files under ``world-<seed>/<order>/<row>/``.
Rerunning the same command with the same ``--out`` resumes. ``--baselines`` adds the five
memory baselines (mem0, amem, expel, memento, reasoningbank) on the same streams, as a second
table.

A **test** protocol (its worlds in the test range of configs/world/seeds.yaml) appends a row to
the ledger (``--ledger``, docs/ledger.md) when it starts and another when it ends, refuses to
look again at roles the ledger already holds a run of once the code has changed since that run
(``--another-look`` takes one, recorded like any other; on unchanged code a run is a
reproduction, and its ledger row names the run it reproduces), and runs as fixed: ``--questions``, ``--bf16``, ``--config`` and demo
overrides are for dev protocols; after ``--`` it takes only ``--model`` and the role endpoints
(``--executor-url`` ...). A dev protocol never writes the ledger.

**--world-1** runs the development table of world 1, as docs/results.md's
runs did: ``mia demo --config configs/demo/efficacy.yaml`` (world seed 1, its first 64 text test
questions, policies none / plan_only / rag / mia, then TTRL supervised and no-GT;
``--questions N`` another count, ``--baselines`` configs/demo/baselines.yaml: the five memory
baselines in one table, no TTRL). It reads back ``demo.json`` and writes ``efficacy.json`` and
``efficacy.png``. World 1 is a development world (docs/results.md): its table is not a claim.

Both run the embedded roles in float32 (``MIA_BF16=0``) on every CPU, so a table is the same
from run to run and from machine to machine: batched bfloat16 decoding depends on which
requests share a batch, which depends on timing (docs/results.md). ``--bf16`` keeps the
precision the machine would choose (faster where bf16 is native; not reproducible; dev only).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mia.apps.demo_report import answer_correct  # noqa: E402
from mia.errors import MiaError  # noqa: E402
from mia.eval.stats import format_comparison, paired_cluster_bootstrap_ci  # noqa: E402
from ttrl.curve import format_steps  # noqa: E402


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["policy"] for r in rows]
    acc = [100 * r["accuracy"] for r in rows]
    err = [[100 * (r["accuracy"] - r["ci"][0]) for r in rows],
           [100 * (r["ci"][1] - r["accuracy"]) for r in rows]]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.bar(names, acc, yerr=err, capsize=4, color="#4a7ab7")
    ax.set_ylabel("exact match, % (95% bootstrap CI)")
    ax.set_title(f"development world 1, {rows[0]['n']} questions")
    for i, r in enumerate(rows):
        d = r.get("delta")
        if d:
            ax.annotate(f"{100 * d['mean']:+.1f}", (i, acc[i] + 2), ha="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def targets(
    rows: list[dict], outcomes: dict[str, dict[str, float]], templates: dict[str, str]
) -> list[str]:
    """The development table's targets and paired differences, intervals clustered by
    template (``templates``: question id -> template, from demo.json)."""
    by = {r["policy"]: r for r in rows}
    lines = []
    if "mia" in by and "none" in by:
        d = by["mia"]["delta"]
        ok = d["mean"] >= 0.10 and d["ci"][0] > 0
        lines.append(
            f"mia - none = {100 * d['mean']:+.1f} points [{100 * d['ci'][0]:+.1f}, "
            f"{100 * d['ci'][1]:+.1f}]: target >= +10 with the interval above 0: "
            f"{'met' if ok else 'MISSED'}"
        )
    for name in ("mem0", "amem", "expel", "memento", "reasoningbank", "rag", "plan_only"):
        if name in outcomes and "mia" in outcomes and name in by:
            ids = sorted(set(outcomes["mia"]) & set(outcomes[name]))
            m, lo, hi = paired_cluster_bootstrap_ci(
                [outcomes["mia"][i] for i in ids],
                [outcomes[name][i] for i in ids],
                [templates.get(i, i) for i in ids],
            )
            lines.append(f"mia - {name} = {100 * m:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]")
    for name in ("ttrl", "ttrl-nogt"):
        if name in outcomes and "mia" in outcomes:
            ids = sorted(set(outcomes[name]) & set(outcomes["mia"]))
            m, lo, hi = paired_cluster_bootstrap_ci(
                [outcomes[name][i] for i in ids],
                [outcomes["mia"][i] for i in ids],
                [templates.get(i, i) for i in ids],
            )
            ok = m >= 0.05 and lo > 0
            lines.append(
                f"{name} - mia = {100 * m:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]: "
                f"target >= +5 with the interval above 0: {'met' if ok else 'MISSED'}"
            )
    return lines


def outcomes_from(out: Path, rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per-question correctness again, from the run's files (for extra paired differences)."""
    res: dict[str, dict[str, float]] = {}
    for r in rows:
        name = r["policy"]
        results = out / name / "results.jsonl"
        if results.is_file():
            res[name] = {
                (row := json.loads(line))["id"]: float(bool(row["correct"]))
                for line in results.read_text().splitlines()
                if line.strip()
            }
        elif (out / name / "accuracy.jsonl").is_file():
            res[name] = {
                q["data_id"]: float(answer_correct(q) or 0)
                for line in (out / name / "accuracy.jsonl").read_text().splitlines()
                if line.strip()
                for q in json.loads(line).get("per_question") or []
            }
    return res


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--protocol",
        default=str(ROOT / "configs" / "efficacy" / "protocol.yaml"),
        help="a protocol file (configs/efficacy/*.yaml): run it (docs/protocol.md); default "
        "the test protocol, configs/efficacy/protocol.yaml",
    )
    p.add_argument(
        "--world-1",
        action="store_true",
        help="instead of a protocol: the development table of world 1 (not a claim)",
    )
    p.add_argument(
        "--questions",
        type=int,
        default=None,
        help="the first N questions of each stream (dev protocols; with --world-1: of "
        "world 1's text test questions)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="run folder (default: runs/protocol-<name>-<time> with --protocol, else a temp "
        "folder); the same folder resumes a protocol run",
    )
    p.add_argument(
        "--config",
        default=None,
        help="demo config (dev protocols: the rows' base, default configs/demo/default.yaml; "
        "--world-1: default efficacy.yaml)",
    )
    p.add_argument(
        "--baselines",
        action="store_true",
        help="the memory baselines too (with --protocol: the protocol's list, a second table; "
        "--world-1: configs/demo/baselines.yaml, no TTRL)",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="the precision the machine chooses (bf16 where native: faster, not reproducible; "
        "not for a test protocol)",
    )
    p.add_argument(
        "--ledger",
        default=str(ROOT / "docs" / "ledger.md"),
        help="the ledger a test protocol appends its rows to (default docs/ledger.md)",
    )
    p.add_argument(
        "--another-look",
        action="store_true",
        help="run a test protocol on roles the ledger already holds a run of (recorded too)",
    )
    p.add_argument("demo_args", nargs="*", help="more demo arguments / overrides (after --)")
    return p


def main() -> None:
    args = _parser().parse_args()
    if not args.world_1:
        try:
            run_protocol_command(args)
        except MiaError as err:
            print(f"efficacy_bench: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    if args.config is None:
        name = "baselines.yaml" if args.baselines else "efficacy.yaml"
        args.config = str(ROOT / "configs" / "demo" / name)
    out = Path(args.out or tempfile.mkdtemp(prefix="mia-efficacy-"))
    cmd = [sys.executable, "-m", "mia.cli", "demo", "--config", args.config, "--out", str(out)]
    if args.questions is not None:
        cmd += ["--questions", str(args.questions)]
    cmd += args.demo_args
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if not args.bf16:
        # float32 decodes every question the same way in every run and on every machine.
        env["MIA_BF16"] = "0"
    proc = subprocess.run(cmd, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)
    demo = json.loads((out / "demo.json").read_text())
    rows = demo["comparison"]
    extra = {
        s["policy"]: {
            "tools": s.get("tool_calls_per_question"),
            "tokens": s.get("tokens_per_question"),
            "seconds": (s.get("wall_s") or 0) / max(1, s.get("questions") or 1),
        }
        for s in demo["summaries"]
    }
    outcomes = outcomes_from(out, rows)
    lines = targets(rows, outcomes, demo.get("templates") or {})
    # How much each TTRL pass could learn: GRPO steps skipped (every group tied) and why.
    grpo = {s["policy"]: s["grpo"] for s in demo["summaries"] if s.get("grpo")}
    lines += [f"{name}: {format_steps(report)}" for name, report in grpo.items()]
    record = {
        "command": " ".join(cmd),
        "precision": "machine's choice" if args.bf16 else "float32",
        "world": demo["world"],
        "questions": demo["questions"],
        "comparison": rows,
        "per_question_extra": extra,
        "grpo": grpo,
        "targets": lines,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    (out / "efficacy.json").write_text(json.dumps(record, indent=2) + "\n")
    plot(rows, out / "efficacy.png")
    print()
    print(format_comparison(rows, extra))
    print()
    print("\n".join(lines))
    print(f"\n{out / 'efficacy.json'}\n{out / 'efficacy.png'}")


def run_protocol_command(args: argparse.Namespace) -> None:
    """``--protocol FILE``: load and check the protocol, set the precision, run it."""
    from mia.eval.protocol import load_protocol

    protocol = load_protocol(args.protocol)
    if protocol.kind == "test" and args.bf16:
        raise MiaError(f"{args.protocol} is a test protocol: its precision is fixed (no --bf16)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Torch is not imported yet, so OpenMP reads this: the TTRL trainer in this process decodes
    # beside the services, and spinning threads starve them (mia.eval.supervisor.thread_env).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if protocol.precision == "float32" and not args.bf16:
        # float32 decodes every question the same way in every run and on every machine.
        os.environ["MIA_BF16"] = "0"
    from mia.apps.protocol import ProtocolOptions, run_protocol

    path = Path(args.protocol)
    out = Path(args.out or ROOT / "runs" / f"protocol-{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    demo_argv = [*(["--config", args.config] if args.config else []), *args.demo_args]
    opts = ProtocolOptions(
        path=path,
        out=out,
        demo_argv=demo_argv,
        questions=args.questions,
        baselines=args.baselines,
        ledger=Path(args.ledger),
        another_look=args.another_look,
        command=shlex.join(["python", "bench/efficacy_bench.py", *sys.argv[1:]]),
        root=ROOT,
    )
    run_protocol(protocol, opts)


if __name__ == "__main__":
    main()
