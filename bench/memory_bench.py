"""memory_serve benchmark: retrieval latency and insert rate, ours vs the reference algorithm.

    python bench/memory_bench.py                          # 10k and 100k memories
    python bench/memory_bench.py --quick                  # 1k and 10k, fewer queries (~1 min)
    python bench/memory_bench.py --sizes 10000,100000 --queries 500 --inserts 300

What is timed (LLM and text encoding excluded: every embedding is a precomputed random unit
vector of dim 384, the size of all-MiniLM-L6-v2's):

- **ours**: ``memory_serve.store.MemoryStore`` on a real SQLite file (WAL). Retrieval is
  ``store.retrieve(..., q_emb=, c_emb=)`` (bucket scan, min-max, score, rank, top-k). An insert is
  ``store.write(mem, q_emb, c_emb)``: dedup scan, SQLite transaction, index update.
- **reference**: docs/reference.md §4.4-4.5 as the reference implements it: a Python list of entry
  dicts with the embeddings ``torch.cat``-ed onto one tensor on every insert (after a dedup scan),
  and per query a full rescan: similarities, min-max, a Python score list, two sorts. Cosines are
  one ``torch.mv`` on unit vectors (the cheapest faithful form, so the reference is not
  handicapped).

Both hold the same data: ``N`` memories in ONE bucket (text-only/others: the default config, where
the classifier is off), half correct, random win-rates. ``N`` is loaded in bulk (ours:
``import_memories``; reference: one tensor), then ``--inserts`` single inserts are timed at that
size (a per-insert build of 100k would rescan ~7 TB of vectors for either side), then
``--queries`` retrievals. "agree" counts queries where both return the same positive and
negative ids. "scan floor" is one bare ``numpy`` matrix-vector product over the bucket: the memory
traffic any exact full scan pays.

Targets (issue 3, docs/benchmarks.md): retrieval p95 <= 5 ms at 100k and >= 20x faster than the reference.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DIM = 384
TOP_K = 2
TARGET_P95_MS = 5.0
TARGET_SPEEDUP = 20.0


# ----------------------------------------------------------------------------- data


@dataclass
class Data:
    """``n`` stored memories + ``inserts`` new ones + ``queries`` query vectors."""

    q: np.ndarray  # [n + inserts, DIM] question embeddings (unit rows)
    correct: np.ndarray  # [n + inserts] bool
    usage: np.ndarray  # [n + inserts] int
    success: np.ndarray  # [n + inserts] int
    queries: np.ndarray  # [queries, DIM]

    def question(self, i: int) -> str:
        return f"benchmark question {i}"


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def make_data(n: int, inserts: int, queries: int, seed: int) -> Data:
    rng = np.random.default_rng(seed)
    total = n + inserts
    usage = rng.integers(1, 8, size=total)
    return Data(
        q=unit_rows(rng, total),
        correct=rng.random(total) < 0.5,
        usage=usage,
        success=rng.integers(0, usage + 1),
        queries=unit_rows(rng, queries),
    )


class LookupEmbedder:
    """The :class:`mia.embedding.Embedder` protocol over precomputed vectors (bulk load only)."""

    name = "bench-random-unit"
    dim = DIM

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors
        self.zero = np.zeros(DIM, dtype=np.float32)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors.get(t, self.zero) if t else self.zero for t in texts])


# ----------------------------------------------------------------------------- reference


class ReferenceMemory:
    """One bucket of the reference memory: entry dicts + torch.cat'ed embeddings, full rescans."""

    def __init__(self, q: Any, c: Any, entries: list[dict[str, Any]]) -> None:
        self.q_embs, self.c_embs, self.entries = q, c, entries

    def _similarities(self, q: Any, c: Any | None) -> Any:
        sims = self.q_embs.mv(q)
        if c is not None:
            sims = 0.8 * sims + 0.2 * self.c_embs.mv(c)
        return sims

    def insert(self, entry: dict[str, Any], q: Any, c: Any, has_caption: bool) -> str:
        import torch

        if self.entries:  # dedup (docs/reference.md §4.5)
            sims = self._similarities(q, c if has_caption else None)
            best = int(torch.argmax(sims))
            if float(sims[best]) >= 0.9999:
                old = self.entries[best]
                if old["judgement"] != "correct" or len(entry["workflow_summary"].split()) < len(
                    old["workflow_summary"].split()
                ):
                    self.entries[best] = entry
                    return "replaced"
                return "kept_existing"
        self.entries.append(entry)
        self.q_embs = torch.cat([self.q_embs, q.unsqueeze(0)], dim=0)
        self.c_embs = torch.cat([self.c_embs, c.unsqueeze(0)], dim=0)
        return "inserted"

    def retrieve(self, q: Any, c: Any | None, top_k: int, pass_num: int = 0) -> tuple[list, list]:
        if not self.entries:
            return [], []
        sims = self._similarities(q, c)
        lo, hi = sims.min(), sims.max()
        norm = ((sims - lo) / (hi - lo + 1e-8)).tolist()
        scored = [
            (0.7 * s + 0.3 * e["win_rate"], e) for s, e in zip(norm, self.entries, strict=True)
        ]
        pos = [x for x in scored if x[1]["judgement"] == "correct"]
        neg = [x for x in scored if x[1]["judgement"] != "correct"]
        pos.sort(key=lambda x: x[0], reverse=True)  # stable: ties keep insertion order
        neg.sort(key=lambda x: x[0], reverse=True)
        window = slice(pass_num, pass_num + top_k)
        return [e for _, e in pos[window]], [e for _, e in neg[window]]


def ref_entry(data: Data, i: int, item_id: int) -> dict[str, Any]:
    u, s = int(data.usage[i]), int(data.success[i])
    return {
        "id": item_id,
        "question": data.question(i),
        "image_caption": "",
        "workflow_summary": "1. step",
        "judgement": "correct" if data.correct[i] else "incorrect",
        "usage_count": u,
        "success_count": s,
        "win_rate": round(s / u, 4),
    }


# ----------------------------------------------------------------------------- measurement


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def timed(fn: Callable[[int], Any], n: int, label: str = "") -> tuple[list[float], list[Any]]:
    """Seconds per call of ``fn(i)`` for i in range(n), and the results.

    Slow loops (the reference at 100k) print a line with rate and ETA every ~10 s.
    """
    times, out = [], []
    start = last = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        out.append(fn(i))
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if label and t1 - last > 10 and i + 1 < n:
            rate = (i + 1) / (t1 - start)
            progress(f"{label}: {i + 1}/{n} ({rate:,.1f}/s, ETA {(n - i - 1) / rate:.0f}s)")
            last = t1
    return times, out


def progress(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def new_memory(data: Data, i: int) -> Any:
    from memory_serve.records import NewMemory

    u, s = int(data.usage[i]), int(data.success[i])
    return NewMemory(
        question=data.question(i),
        workflow_summary="1. step",
        judgement="correct" if data.correct[i] else "incorrect",
        usage_count=u,
        success_count=s,
        win_rate=round(s / u, 4),
    )


def bench_ours(data: Data, n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Bulk load N (untimed setup), then timed single writes and retrievals at size N."""
    from memory_serve.config import StoreConfig
    from memory_serve.store import MemoryStore

    res: dict[str, Any] = {}
    zero = np.zeros(DIM, dtype=np.float32)
    db = workdir / f"memory-{n}.sqlite"
    embedder = LookupEmbedder({data.question(i): data.q[i] for i in range(n)})
    with MemoryStore(db, embedder, StoreConfig()) as store:
        t0 = time.perf_counter()
        store.import_memories(
            [new_memory(data, i) for i in range(n)], batch_size=1024, progress=True
        )
        res["ours_bulk_per_s"] = n / (time.perf_counter() - t0)
        progress(f"ours: {len(store):,} memories loaded ({res['ours_bulk_per_s']:,.0f}/s)")

        def insert(k: int) -> str:
            return store.write(new_memory(data, n + k), data.q[n + k], zero).action

        ins, actions = timed(insert, args.inserts, "ours inserts")
        assert set(actions) == {"inserted"}, "random vectors never deduplicate"
        res["ours_insert_per_s"] = len(ins) / sum(ins)
        progress(f"ours: {args.inserts} inserts at {n:,} ({res['ours_insert_per_s']:,.0f}/s)")

        def query(k: int) -> tuple[list[int], list[int]]:
            r = store.retrieve("query", top_k=TOP_K, q_emb=data.queries[k], c_emb=zero)
            return list(r.positive_ids), list(r.negative_ids)

        for k in range(min(5, args.queries)):  # warm up
            query(k)
        lat, res["ours_ids"] = timed(query, args.queries, "ours queries")
        res["ours_p50_ms"], res["ours_p95_ms"] = pct(lat, 50) * 1e3, pct(lat, 95) * 1e3
        progress(f"ours: {args.queries} queries, p95 {res['ours_p95_ms']:.2f} ms")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return res


def bench_floor(data: Data, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One bare matrix-vector product over the bucket's question matrix per query."""
    qmat = np.ascontiguousarray(data.q[: n + args.inserts])
    lat, _ = timed(lambda k: qmat @ data.queries[k], args.queries)
    return {"floor_p50_ms": pct(lat, 50) * 1e3, "floor_p95_ms": pct(lat, 95) * 1e3}


def bench_reference(data: Data, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The reference's state after N inserts, then timed single inserts and retrievals."""
    import torch

    res: dict[str, Any] = {}
    ref = ReferenceMemory(
        torch.from_numpy(data.q[:n].copy()),
        torch.zeros((n, DIM), dtype=torch.float32),
        [ref_entry(data, i, i + 1) for i in range(n)],
    )
    tq, tzero = torch.from_numpy(data.q), torch.zeros(DIM, dtype=torch.float32)

    def insert(k: int) -> str:
        return ref.insert(ref_entry(data, n + k, n + k + 1), tq[n + k], tzero, False)

    ins, actions = timed(insert, args.inserts, "reference inserts")
    assert set(actions) == {"inserted"}
    res["ref_insert_per_s"] = len(ins) / sum(ins)
    progress(f"reference: {args.inserts} inserts at {n:,} ({res['ref_insert_per_s']:,.0f}/s)")
    tqueries = torch.from_numpy(data.queries)

    def query(k: int) -> tuple[list[int], list[int]]:
        pos, neg = ref.retrieve(tqueries[k], None, TOP_K)
        return [e["id"] for e in pos], [e["id"] for e in neg]

    for k in range(min(5, args.queries)):
        query(k)
    lat, res["ref_ids"] = timed(query, args.queries, "reference queries")
    res["ref_p50_ms"], res["ref_p95_ms"] = pct(lat, 50) * 1e3, pct(lat, 95) * 1e3
    progress(f"reference: {args.queries} queries, p95 {res['ref_p95_ms']:.2f} ms")
    return res


def bench_size(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    data = make_data(n, args.inserts, args.queries, args.seed)
    res: dict[str, Any] = {"size": n}
    for part in (
        lambda: bench_ours(data, n, args, workdir),
        lambda: bench_floor(data, n, args),
        lambda: bench_reference(data, n, args),
    ):
        res.update(part())
        gc.collect()  # the previous part's matrices go before the next allocates its own
    res["agree"] = sum(a == b for a, b in zip(res.pop("ours_ids"), res.pop("ref_ids"), strict=True))
    return res


# ----------------------------------------------------------------------------- report


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ",".join(
            f"{i['internal_api']}={i['num_threads']}"
            for i in threadpool_info()
            if i["user_api"] == "blas"
        )
    except Exception:  # threadpoolctl is optional
        return "unknown"


def limit_threads(n: int) -> None:
    """Cap numpy's BLAS pool and torch's intra-op pool at ``n`` threads (0: leave them)."""
    if n <= 0:
        return
    import torch
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    threadpool_limits(limits=n, user_api="blas")
    torch.set_num_threads(n)


def header(args: argparse.Namespace) -> str:
    import torch

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"memory_bench {dt.datetime.now():%Y-%m-%d %H:%M}  python {platform.python_version()}  "
        f"numpy {np.__version__}  torch {torch.__version__}\n"
        f"cpus {os.cpu_count()}  load avg (1/5/15 min) {load}  BLAS threads {blas_threads()}  "
        f"torch threads {torch.get_num_threads()}\n"
        f"one bucket, dim {DIM}, top_k {TOP_K}+{TOP_K}, {args.queries} queries, "
        f"{args.inserts} timed inserts per size, seed {args.seed}"
    )


def table(results: list[dict[str, Any]], queries: int) -> str:
    rows = [
        "| memories | impl | retrieve p50 (ms) | retrieve p95 (ms) | inserts/s | "
        "p50 speedup | p95 speedup | insert speedup | agree |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        n = f"{r['size']:,}"
        rows.append(
            f"| {n} | ours | {r['ours_p50_ms']:.2f} | {r['ours_p95_ms']:.2f} | "
            f"{r['ours_insert_per_s']:,.0f} | {r['ref_p50_ms'] / r['ours_p50_ms']:.1f}x | "
            f"{r['ref_p95_ms'] / r['ours_p95_ms']:.1f}x | "
            f"{r['ours_insert_per_s'] / r['ref_insert_per_s']:.1f}x | {r['agree']}/{queries} |"
        )
        rows.append(
            f"| {n} | reference | {r['ref_p50_ms']:.2f} | {r['ref_p95_ms']:.2f} | "
            f"{r['ref_insert_per_s']:,.0f} | 1.0x | 1.0x | 1.0x | |"
        )
        rows.append(
            f"| {n} | scan floor | {r['floor_p50_ms']:.2f} | {r['floor_p95_ms']:.2f} | | | | | |"
        )
    return "\n".join(rows)


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in results:
        p95, speed = r["ours_p95_ms"], r["ref_p95_ms"] / r["ours_p95_ms"]
        ok_p95 = "met" if p95 <= TARGET_P95_MS else "MISSED"
        ok_speed = "met" if speed >= TARGET_SPEEDUP else "MISSED"
        out.append(
            f"{r['size']:,}: p95 {p95:.2f} ms vs <= {TARGET_P95_MS:g} ms: {ok_p95}; "
            f"{speed:.1f}x the reference vs >= {TARGET_SPEEDUP:g}x: {ok_speed}"
        )
    return out


def fail(message: str) -> None:
    """Bad flags: one line, exit code 2 (as every MIA command)."""
    print(f"memory_bench: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        fail(f"--sizes must be positive integers separated by commas, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="memory counts (comma-separated)")
    p.add_argument("--queries", type=int, default=200, help="timed retrievals per size")
    p.add_argument("--inserts", type=int, default=200, help="timed single inserts per size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="folder for the SQLite files (default: temp)")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="BLAS and torch threads for both sides (0 = the libraries' defaults, as the service)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1k and 10k, 50 queries")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.inserts = "1000,10000", 50, 50
    if args.queries < 1 or args.inserts < 1:
        fail("--queries and --inserts must be >= 1")
    sizes = parse_sizes(args.sizes)
    limit_threads(args.threads)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="membench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(header(args), flush=True)
    results = []
    try:
        for n in sizes:
            print(f"size {n:,}", flush=True)
            results.append(bench_size(n, args, workdir))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(results, args.queries))
    print()
    for line in verdicts(results):
        print(line)


if __name__ == "__main__":
    main()
