"""Times the real ``mia demo`` (SmolLM2-135M, embedded default) and prints one table row.

    python bench/demo_bench.py                 # warm: reuses $MIA_HOME (models, world, index)
    python bench/demo_bench.py --cold          # a fresh MIA_HOME: every build (warm start too)
    python bench/demo_bench.py --home DIR      # that MIA_HOME (cold when empty, warm after)
    python bench/demo_bench.py --avx2 --cold   # on AVX2 kernels (a CPU without native bf16)
    python bench/demo_bench.py --questions 8 -- agent.max_turns=2     # demo arguments after --

Reports the wall time and the CPU time of the whole process tree (the demo and its three
service subprocesses, from ``getrusage(RUSAGE_CHILDREN)``), the load average before and after
(other work on a shared machine stretches wall time; CPU seconds / cores is the wall time the
same work needs on otherwise idle cores), the precision the demo chose on this CPU, and the
demo's own table; the demo's stage lines stream to stderr meanwhile. JSON lands in
``.mia/bench/demo.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mia.paths import home_path

ROOT = Path(__file__).resolve().parents[1]
# What --avx2 sets: torch's dispatch, oneDNN and MKL held to AVX2 (same cores and clock).
AVX2_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def precision_line(output: str) -> str:
    """The demo's own "precision: ..." line (what it chose on this CPU)."""
    for line in output.splitlines():
        if line.strip().startswith("precision:"):
            return line.strip().removeprefix("precision:").strip()
    return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cold", action="store_true", help="fresh MIA_HOME (builds everything)")
    p.add_argument("--questions", type=int, default=None, help="demo --questions")
    p.add_argument("--out", default=None, help="demo --out (default: a temp folder)")
    p.add_argument("--home", default=None, help="MIA_HOME to use (default: the environment's)")
    p.add_argument(
        "--avx2",
        action="store_true",
        help="hold torch, oneDNN and MKL to their AVX2 kernels (an AVX2 CPU's code path, bf16 "
        "emulated: the demo must choose float32 itself; docs/results.md)",
    )
    p.add_argument("demo_args", nargs="*", help="more demo arguments (after --)")
    args = p.parse_args()

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if args.avx2:
        env.update(AVX2_KERNELS)
    home_tmp = tempfile.TemporaryDirectory(prefix="mia-demo-bench-") if args.cold else None
    if home_tmp is not None:
        env["MIA_HOME"] = home_tmp.name
    elif args.home:
        env["MIA_HOME"] = str(Path(args.home).resolve())
    # A first run, whether a fresh temporary home (--cold) or an empty/missing --home/MIA_HOME.
    home = home_path(env)
    cold = args.cold or not (home.is_dir() and any(home.iterdir()))
    out = args.out or tempfile.mkdtemp(prefix="mia-demo-out-")
    cmd = [sys.executable, "-m", "mia.cli", "demo", "--out", out, "--no-progress"]
    if args.questions is not None:
        cmd += ["--questions", str(args.questions)]
    cmd += args.demo_args

    load_before = os.getloadavg()
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # The demo's own stage lines stream through (on stderr) while they are kept for the report.
    lines: list[str] = []
    with subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            print(f"  demo | {line.rstrip()}", file=sys.stderr, flush=True)
    returncode = child.returncode
    output = "".join(lines)
    wall = time.perf_counter() - start
    usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    if returncode != 0:
        raise SystemExit(f"mia demo failed with exit code {returncode}")
    cpu = (usage_after.ru_utime - usage_before.ru_utime) + (
        usage_after.ru_stime - usage_before.ru_stime
    )
    cores = os.cpu_count() or 1
    demo = json.loads((Path(out) / "demo.json").read_text())
    summary = demo["summaries"]  # the policies, then the TTRL pass
    result = {
        "mode": "cold" if cold else "warm",
        "questions": summary[0]["questions"] if summary else None,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cores": cores,
        "cpu_s_per_core": round(cpu / cores, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "policies": {s["policy"]: {k: s.get(k) for k in ("accuracy", "wall_s")} for s in summary},
        "built": [line.strip() for line in output.splitlines() if "done in" in line],
        "machine": f"{platform.processor() or platform.machine()}, {cores} cores",
        # Machines differ: the precision the demo chose here (MIA_BF16=0 forces float32, what a
        # CPU without native bf16 gets).
        "precision": precision_line(output),
        "command": " ".join(cmd[2:]),
    }
    bench_dir = ROOT / ".mia" / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    (bench_dir / "demo.json").write_text(json.dumps(result, indent=2) + "\n")
    table = output[output.find("policy ") :].split("\n\n")[0]
    print(table)
    for line in result["built"]:
        print(line)
    print()
    print(
        "| mode | questions/policy | wall | CPU (all processes) | CPU / cores | load avg (1 min) "
        "before -> after | precision |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {result['mode']} | {result['questions']} | {wall:.0f} s | {cpu:.0f} s | "
        f"{cpu / cores:.0f} s | {load_before[0]:.1f} -> {load_after[0]:.1f} | "
        f"{result['precision']} |"
    )
    # Targets: <= 12 minutes on a first run (warm start included), <= 5 once cached (2 cores).
    target = 720 if cold else 300
    verdict = "met" if wall <= target else "missed"
    print(f"target: {result['mode']} run <= {target // 60} min: {verdict} ({wall / 60:.1f} min)")
    if home_tmp is not None:
        home_tmp.cleanup()


if __name__ == "__main__":
    main()
