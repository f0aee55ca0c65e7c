"""Memory inspector benchmark: how fast the page's data routes answer over a big store.

    python bench/inspector_bench.py                      # 100k memories, dim 384
    python bench/inspector_bench.py --size 10000 --requests 20

``--size`` memories are inserted straight into a fresh SQLite store (random unit embeddings of
``--dim``; text like "question number 123 ..."; a tenth in another bucket, a third incorrect),
memory_serve is started on a real uvicorn server (no LLM), and every request the inspector makes
is timed over HTTP, ``--requests`` times each: the first page, the last page (deep OFFSET), a
search (substring of question or summary: a full scan), a filter (judgement + bucket: an index),
a sort by win-rate, a memory's detail with its history. Reported: p50 / p95 / max in ms.

Target (issue 16): every page request at 100k memories answers in well under a second (the page
never loads the store: paging, filtering and search are SQL).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET_MS = 1000.0


class RandomEmbedder:
    """Stands in for the text encoder (no query embedding is timed here)."""

    name = "bench-random"

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        v = np.random.default_rng(0).standard_normal((len(texts), self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def fill(db: Path, n: int, dim: int) -> None:
    from memory_serve.store import MemoryStore

    MemoryStore(db, RandomEmbedder(dim)).close()  # the schema
    rng = np.random.default_rng(0)
    conn = sqlite3.connect(db)
    batch = 10_000
    for start in range(0, n, batch):
        m = min(batch, n - start)
        q = rng.standard_normal((m, dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        zero = np.zeros(dim, dtype=np.float32).tobytes()
        rows = []
        for j in range(m):
            i = start + j
            uses = int(rng.integers(1, 20))
            wins = int(rng.integers(0, uses + 1))
            rows.append(
                (
                    f"question number {i} about topic {i % 997}",
                    f"1. search (query 'topic {i % 997}' -> passage {i})\n2. answer",
                    "incorrect" if i % 3 == 0 else "correct",
                    uses,
                    wins,
                    wins / uses,
                    "text-only",
                    "location" if i % 10 == 0 else "others",
                    1_700_000_000.0 + i,
                    q[j].tobytes(),
                    zero,
                )
            )
        conn.executemany(
            "INSERT INTO memories (question, workflow_summary, judgement, usage_count, "
            "success_count, win_rate, modality, category, created_at, q_emb, c_emb) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.commit()
        print(f"  inserted {start + m}/{n}", file=sys.stderr, flush=True)
    ids = [(i % n + 1, f"a later question {i}", i % 2, 1_800_000_000.0 + i) for i in range(500)]
    conn.executemany(
        "INSERT INTO memory_uses (memory_id, question, success, created_at) VALUES (?, ?, ?, ?)",
        [(1, q, s, t) for _, q, s, t in ids],
    )
    conn.commit()
    conn.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--requests", type=int, default=30, help="timed requests per kind")
    args = p.parse_args(argv)

    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.http import ServerThread

    with tempfile.TemporaryDirectory(prefix="mia-inspector-bench-") as tmp:
        db = Path(tmp) / "memory.sqlite"
        t0 = time.perf_counter()
        fill(db, args.size, args.dim)
        print(f"filled {args.size} memories in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        cfg = load_config(None, ["llm.enabled=false", "compress.mode=identity"])
        t0 = time.perf_counter()
        store = MemoryStore(db, RandomEmbedder(args.dim), cfg.store)
        print(f"opened the store in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        service = MemoryService(cfg, store, None)
        last = max(0, args.size - 50)
        kinds = {
            "first page": "/memories?limit=50",
            "last page (offset)": f"/memories?limit=50&offset={last}",
            "search (substring)": "/memories?limit=50&q=topic%20996",
            "filter (judgement+bucket)": "/memories?limit=50&judgement=incorrect"
            "&bucket=text-only/location",
            "sort by win-rate": "/memories?limit=50&sort=win_rate_asc",
            "detail + history": "/memories/1?history=200",
        }
        rows = []
        try:
            with ServerThread(build_app(service)) as url, httpx.Client(base_url=url) as client:
                for label, path in kinds.items():
                    r = client.get(path)
                    assert r.status_code == 200, r.text
                    times = []
                    for _ in range(args.requests):
                        t = time.perf_counter()
                        client.get(path).raise_for_status()
                        times.append((time.perf_counter() - t) * 1000)
                    times.sort()
                    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
                    rows.append((label, statistics.median(times), p95, times[-1]))
        finally:
            store.close()
    print(
        f"\ninspector routes over {args.size} memories (dim {args.dim}), "
        f"{args.requests} requests each, ms"
    )
    print(f"{'request':<28}{'p50':>9}{'p95':>9}{'max':>9}")
    for label, p50, p95, worst in rows:
        print(f"{label:<28}{p50:>9.1f}{p95:>9.1f}{worst:>9.1f}")
    worst = max(r[2] for r in rows)
    verdict = "met" if worst <= TARGET_MS else "MISSED"
    print(f"\ntarget: every p95 <= {TARGET_MS:.0f} ms: {verdict} (worst p95 {worst:.1f} ms)")


if __name__ == "__main__":
    main()
