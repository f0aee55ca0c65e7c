"""local_search benchmark: BM25 (bm25s) vs rank_bm25, dense Flat vs IVF-PQ. Prints tables.

    python bench/search_bench.py                      # 100k + 1M BM25, rank_bm25 at 100k, dense 100k
    python bench/search_bench.py --quick              # small sizes, a smoke run (~1 min)
    python bench/search_bench.py --sizes 100000 --dense-size 20000

Corpus: the synthetic research world (``mia.data.world.iter_corpus``), queries from
``mia.data.world.benchmark_queries``; both written once under ``--workdir`` and reused.

Every measurement runs in a fresh child process, so RAM is the child's RSS growth over its own
baseline (build: peak; serve: after opening + querying, mmap pages included). Latency is one
query per ``search`` call (p50/p95 over all queries); "batch QPS" sends all queries in one call
(what ``POST /retrieve`` does with a list). rank_bm25 scores every passage in Python, so it runs
on ``--rank-bm25-queries`` queries only; its tokenisation is the same as ours (lower-case, bm25s
splitter, English stopwords, PyStemmer) so both do the same work per query.

Dense: passages are embedded once (the Flat index build, timed); IVF-PQ is trained from those
same vectors with ``local_search.dense.build_faiss``, so its build time excludes embedding.
recall@3 = |top-3 IVF-PQ ∩ top-3 Flat| / 3, averaged over the queries.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from mia.heap import peak_resident_bytes, resident_bytes  # noqa: E402

# ----------------------------------------------------------------------------- helpers


def _isolated(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``fn(*args)`` in a fresh spawned process (clean RSS baseline) and return its dict."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args)


def _dir_size(path: Path, skip: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file() and p.name not in skip)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _world() -> Any:
    """The synthetic world's corpus generator (``mia.data.world``; its module as a fallback)."""
    try:
        from mia.data import world
    except ImportError:
        from mia.data import world_corpus as world
    return world


def prepare(
    workdir: Path, size: int, num_queries: int, seed: int
) -> tuple[Path, list[str], list[str] | None]:
    """Write the corpus JSONL once (cached); the queries and, when the world provides them, the
    id of the passage each query is about."""
    world = _world()
    corpus = workdir / f"corpus-{size}-s{seed}.jsonl"
    if not corpus.exists():
        t0 = time.perf_counter()
        tmp = corpus.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in world.iter_corpus(size, seed=seed):
                f.write(json.dumps({"id": doc["id"], "contents": doc["contents"]}) + "\n")
        tmp.rename(corpus)
        print(f"  wrote {corpus.name} in {time.perf_counter() - t0:.0f}s", flush=True)
    queries = [str(q) for q in world.benchmark_queries(num_queries, size, seed)]
    if not queries:
        raise SystemExit("benchmark_queries returned no queries")
    gold = None
    if hasattr(world, "benchmark_qrels"):
        gold = [str(pid) for _, pid in world.benchmark_qrels(num_queries, size, seed)]
    return corpus, queries, gold


def _hit_at_3(top_ids: list[list[str]], gold: list[str] | None) -> float | None:
    if gold is None:
        return None
    return float(np.mean([g in ids for ids, g in zip(top_ids, gold, strict=False)]))


def _latencies(search: Callable[[list[str]], Any], queries: list[str]) -> dict[str, float]:
    search(queries[:5])  # warm caches / lazy init
    lat = []
    for q in queries:
        t0 = time.perf_counter()
        search([q])
        lat.append(time.perf_counter() - t0)
    return {
        "p50_ms": _pct(lat, 50) * 1e3,
        "p95_ms": _pct(lat, 95) * 1e3,
        "qps_single": len(lat) / sum(lat),
    }


# ----------------------------------------------------------------------------- children


def child_bm25_build(corpus: str, out: str) -> dict[str, Any]:
    from local_search import build_index

    rss0 = resident_bytes()
    t0 = time.perf_counter()
    build_index(corpus, out, "bm25")
    return {
        "build_s": time.perf_counter() - t0,
        "build_peak_ram": peak_resident_bytes() - rss0,
        "disk": _dir_size(Path(out)),
        "disk_index": _dir_size(Path(out), skip=("docs.jsonl", "docs.offsets.npy")),
    }


def child_bm25_query(index: str, queries: list[str]) -> dict[str, Any]:
    from local_search import open_index

    rss0 = resident_bytes()
    t0 = time.perf_counter()
    r = open_index(index)
    load_s = time.perf_counter() - t0
    res = _latencies(lambda qs: r.search(qs, 3), queries)
    t0 = time.perf_counter()
    hits = r.search(queries, 3)
    res["qps_batch"] = len(queries) / (time.perf_counter() - t0)
    res["top_ids"] = [[str(h.id) for h in row] for row in hits]
    res["load_s"] = load_s
    res["serve_ram"] = resident_bytes() - rss0
    return res


def child_rank_bm25(corpus: str, queries: list[str], num_queries: int) -> dict[str, Any]:
    import re

    import Stemmer
    from bm25s.stopwords import STOPWORDS_EN
    from rank_bm25 import BM25Okapi

    split = re.compile(r"(?u)\b\w\w+\b").findall
    stop = frozenset(STOPWORDS_EN)
    stem = Stemmer.Stemmer("english").stemWords

    def tok(text: str) -> list[str]:
        return stem([w for w in split(text.lower()) if w not in stop])

    rss0 = resident_bytes()
    t0 = time.perf_counter()
    with open(corpus, encoding="utf-8") as f:
        docs = [tok(json.loads(line)["contents"]) for line in f]
    model = BM25Okapi(docs)
    del docs
    build_s = time.perf_counter() - t0
    build_ram = resident_bytes() - rss0

    def search(qs: list[str]) -> list[list[str]]:
        out = []
        for q in qs:
            scores = model.get_scores(tok(q))
            top = np.argpartition(-scores, 3)[:3]
            out.append([str(i) for i in top])  # corpus ids are row numbers
        return out

    res = _latencies(search, queries[:num_queries])
    res.update(build_s=build_s, serve_ram=build_ram, qps_batch=res["qps_single"])
    res["top_ids"] = search(queries[:num_queries])
    return res


def child_dense(
    corpus: str,
    out: str,
    queries: list[str],
    nprobes: list[int],
    batch_size: int,
    rerank: int,
    reuse: bool,
) -> dict[str, Any]:
    import faiss

    from local_search import ServeConfig, build_index, open_index
    from local_search.config import DenseConfig
    from local_search.dense import build_faiss
    from local_search.dense import rerank as dense_rerank

    flat_build_s = None
    if not (reuse and (Path(out) / "index.json").exists()):
        t0 = time.perf_counter()
        build_index(corpus, out, "dense", faiss="flat", batch_size=batch_size)
        flat_build_s = time.perf_counter() - t0
    r = open_index(out, ServeConfig())
    n = r.index.ntotal
    flat_bytes = len(faiss.serialize_index(r.index))
    t0 = time.perf_counter()
    qemb = r.embed_queries(queries)
    embed_ms = (time.perf_counter() - t0) / len(queries) * 1e3
    _, flat_top = r.index.search(qemb, 3)
    flat_lat = _latencies(lambda qs: r.search(qs, 3), queries[:200])

    vectors = r.index.reconstruct_n(0, n)
    t0 = time.perf_counter()
    ivf, params = build_faiss(vectors, DenseConfig(faiss="ivfpq"))
    ivf_build_s = time.perf_counter() - t0
    vectors16 = vectors.astype(np.float16)  # what the index stores for re-ranking (on disk)
    del vectors
    ivf_bytes = len(faiss.serialize_index(ivf))
    ids = [str(r.docs.get(i)["id"]) for i in range(n)]
    out: dict[str, dict[int, Any]] = {"recall": {}, "ms": {}, "top": {}}
    for nprobe in nprobes:
        faiss.extract_index_ivf(ivf).nprobe = nprobe
        for rr in (0, rerank):
            t0 = time.perf_counter()
            if rr:
                top = [
                    [row for row, _ in hits]
                    for hits in dense_rerank(vectors16, qemb, ivf.search(qemb, 3 * rr)[1], 3)
                ]
            else:
                top = ivf.search(qemb, 3)[1].tolist()
            key = f"{nprobe}/{rr}"
            out["ms"][key] = (time.perf_counter() - t0) / len(queries) * 1e3
            out["recall"][key] = float(
                np.mean([len(set(a) & set(b)) / 3 for a, b in zip(top, flat_top, strict=True)])
            )
            out["top"][key] = [[ids[i] for i in row if i >= 0] for row in top]
    t0 = time.perf_counter()
    r.index.search(qemb, 3)
    flat_search_ms = (time.perf_counter() - t0) / len(queries) * 1e3
    return {
        "n": n,
        "flat_build_s": flat_build_s,
        "embed_rate": n / flat_build_s if flat_build_s else None,
        "flat_bytes": flat_bytes,
        "flat_search_ms": flat_search_ms,
        "query_embed_ms": embed_ms,
        "flat_p50_ms": flat_lat["p50_ms"],
        "flat_p95_ms": flat_lat["p95_ms"],
        "ivf_build_s": ivf_build_s,
        "ivf_bytes": ivf_bytes,
        "ivf_params": params,
        "vectors_f16_bytes": n * r.index.d * 2,
        "rerank": rerank,
        "recall": out["recall"],
        "ivf_search_ms": out["ms"],
        "top_ids": [[ids[i] for i in row] for row in flat_top],
        "ivf_top_ids": out["top"],
    }


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100000,1000000", help="BM25 corpus sizes")
    p.add_argument("--queries", type=int, default=1000, help="queries per size")
    p.add_argument("--rank-bm25-size", type=int, default=100_000, help="0 = skip rank_bm25")
    p.add_argument("--rank-bm25-queries", type=int, default=50)
    p.add_argument("--dense-size", type=int, default=100_000, help="0 = skip dense")
    p.add_argument("--dense-queries", type=int, default=1000)
    p.add_argument("--nprobe", default="16,32,64,128", help="IVF-PQ nprobe values to report")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    p.add_argument("--rerank", type=int, default=10, help="IVF-PQ re-rank factor to report")
    p.add_argument(
        "--reuse-dense",
        action="store_true",
        help="reuse the Flat index of an earlier run (skips the slow embedding; no build time)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=str(ROOT / ".mia" / "bench" / "search"))
    p.add_argument("--quick", action="store_true", help="smoke run: 5k/20k BM25, 2k dense")
    p.add_argument("--json", default=None, help="also write the raw numbers here")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.rank_bm25_size = "5000,20000", 200, 5000
        args.rank_bm25_queries, args.dense_size, args.dense_queries = 50, 2000, 200
    sizes = [int(s) for s in args.sizes.split(",") if s]
    nprobes = [int(x) for x in args.nprobe.split(",") if x]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    print(
        f"# local_search bench — {time.strftime('%Y-%m-%d')} — {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start — "
        f"python {sys.argv[0]} {' '.join(argv or sys.argv[1:])}",
        flush=True,
    )
    raw: dict[str, Any] = {"bm25": {}, "rank_bm25": {}, "dense": {}}
    for size in sorted(set(sizes) | ({args.rank_bm25_size} - {0})):
        print(f"== {size:,} passages", flush=True)
        corpus, queries, gold = prepare(work, size, args.queries, args.seed)
        if size in sizes:
            out = work / f"bm25-{size}-s{args.seed}"
            b = _isolated(child_bm25_build, str(corpus), str(out))
            q = _isolated(child_bm25_query, str(out), queries)
            q["hit3"] = _hit_at_3(q.pop("top_ids"), gold)
            raw["bm25"][size] = {**b, **q}
            print(f"  bm25s: {raw['bm25'][size]}", flush=True)
        if size == args.rank_bm25_size:
            rb = _isolated(child_rank_bm25, str(corpus), queries, args.rank_bm25_queries)
            rb["hit3"] = _hit_at_3(rb.pop("top_ids"), gold)
            raw["rank_bm25"][size] = rb
            print(f"  rank_bm25: {rb}", flush=True)
    if args.dense_size:
        print(f"== dense, {args.dense_size:,} passages", flush=True)
        corpus, queries, gold = prepare(work, args.dense_size, args.dense_queries, args.seed)
        out = work / f"dense-flat-{args.dense_size}-s{args.seed}"
        d = _isolated(
            child_dense,
            str(corpus),
            str(out),
            queries,
            nprobes,
            args.batch_size,
            args.rerank,
            args.reuse_dense,
        )
        d["hit3"] = _hit_at_3(d.pop("top_ids"), gold)
        d["ivf_hit3"] = {k: _hit_at_3(v, gold) for k, v in d.pop("ivf_top_ids").items()}
        raw["dense"][args.dense_size] = d
        print(f"  dense: {raw['dense'][args.dense_size]}", flush=True)

    print()
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    print(report(raw, args))
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2, default=str))


def report(raw: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "### BM25",
        "",
        "| engine | passages | build | disk (index / total) | RAM build peak | RAM serving "
        "| p50 | p95 | QPS 1-query | QPS batch | hit@3 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [("bm25s (local_search)", s, r) for s, r in sorted(raw["bm25"].items())]
    rows += [("rank_bm25 BM25Okapi", s, r) for s, r in sorted(raw["rank_bm25"].items())]
    for name, size, r in rows:
        disk = f"{_mb(r['disk_index'])} / {_mb(r['disk'])}" if "disk" in r else "— (in RAM)"
        peak = _mb(r["build_peak_ram"]) if "build_peak_ram" in r else "—"
        lines.append(
            f"| {name} | {size:,} | {r['build_s']:.1f} s | {disk} | {peak} | "
            f"{_mb(r['serve_ram'])} | {r['p50_ms']:.2f} ms | {r['p95_ms']:.2f} ms | "
            f"{r['qps_single']:,.1f} | {r['qps_batch']:,.1f} | {_fmt(r.get('hit3'))} |"
        )
    for size, rb in raw["rank_bm25"].items():
        if size in raw["bm25"]:
            ours = raw["bm25"][size]
            lines.append("")
            lines.append(
                f"Speed-up over rank_bm25 at {size:,}: {ours['qps_single'] / rb['qps_single']:,.0f}x "
                f"(single-query QPS), {ours['qps_batch'] / rb['qps_single']:,.0f}x (batched); "
                f"rank_bm25 measured on {args.rank_bm25_queries} queries, bm25s on {args.queries}."
            )
    for d in raw["dense"].values():
        lines += [
            "",
            f"### Dense ({d['n']:,} passages, all-MiniLM-L6-v2, 384-d)",
            "",
            (
                f"Embedding + Flat build: {d['flat_build_s']:.0f} s ({d['embed_rate']:.0f} passages/s); "
                if d["flat_build_s"]
                else "Flat index reused from an earlier run (--reuse-dense); "
            )
            + f"query embedding {d['query_embed_ms']:.1f} ms/query (batched), "
            f"end-to-end single query p50 {d['flat_p50_ms']:.1f} ms / p95 {d['flat_p95_ms']:.1f} ms "
            f"(Flat). IVF-PQ {d['ivf_params']} trained in {d['ivf_build_s']:.1f} s.",
            "",
            "| index | nprobe | RAM (index) | vs Flat | disk extra | search (batched, per query) "
            "| recall@3 vs Flat | hit@3 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            f"| Flat (IndexFlatIP) | — | {_mb(d['flat_bytes'])} | 1x | — | "
            f"{d['flat_search_ms']:.2f} ms | 1.000 | {_fmt(d.get('hit3'))} |",
        ]
        ratio = d["flat_bytes"] / d["ivf_bytes"]
        for key, rec in d["recall"].items():
            nprobe, rr = key.split("/")
            name = f"IVF-PQ + re-rank {rr}x" if rr != "0" else "IVF-PQ (PQ scores)"
            extra = _mb(d["vectors_f16_bytes"]) + " f16 (mmap)" if rr != "0" else "—"
            lines.append(
                f"| {name} | {nprobe} | {_mb(d['ivf_bytes'])} | {ratio:.1f}x smaller | {extra} | "
                f"{d['ivf_search_ms'][key]:.2f} ms | {rec:.3f} | {_fmt(d['ivf_hit3'].get(key))} |"
            )
    lines += [
        "",
        "hit@3: share of queries whose target passage (benchmark_qrels) is in the top 3.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
