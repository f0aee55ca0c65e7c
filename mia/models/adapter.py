"""Small shippable weight deltas ("delta adapters") of a fine-tuned model over its base.

A LoRA fine-tune (the SFT warm start, GRPO on top of it) changes each adapted matrix by a
low-rank ``B @ A``. The exported (merged) folder holds ``W + B @ A``; this module recovers the
deltas from the merged folder and the base (an SVD of ``tuned - base`` per matrix, truncated to
``rank``: exact for a LoRA of rank <= ``rank``, and for a stack of LoRAs whose ranks add up to
it) and writes them as one small safetensors file; :func:`apply_adapter` rebuilds the tuned
folder from the base and that file. Deltas of 1-D weights (norms), when any, are stored whole.

    python -m mia.models.adapter extract --base BASE --tuned TUNED --out A.safetensors --rank 16
    python -m mia.models.adapter apply --base BASE --adapter A.safetensors --out DIR
    python -m mia.models.adapter info A.safetensors

File layout: for a weight ``name``, ``name@A`` ([rank, in]) and ``name@B`` ([out, rank]) with
``delta = B @ A``, or ``name@full``; float16 by default. Metadata: ``format``
(:data:`FORMAT`), ``rank``, ``base_sha256`` (of the base's ``model.safetensors``) and any
caller-provided strings (e.g. the recipe key).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mia.errors import MiaError
from mia.paths import atomic_dir, file_sha256

FORMAT = "mia-delta-adapter/1"
WEIGHTS = "model.safetensors"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = folder / WEIGHTS
    if not path.is_file():
        raise MiaError(f"adapter: no {WEIGHTS} in {folder} (one-file safetensors folders only)")
    return load_file(str(path))


def extract_adapter(
    base: str | Path,
    tuned: str | Path,
    out: str | Path,
    *,
    rank: int,
    dtype: str = "float16",
    metadata: Mapping[str, str] | None = None,
    tol: float = 0.0,
) -> dict[str, Any]:
    """Write the delta adapter of ``tuned`` over ``base``; returns a report (matrices, params,
    bytes, the worst relative reconstruction error before the dtype cast)."""
    from safetensors.torch import save_file

    if rank < 1:
        raise MiaError(f"adapter: rank must be >= 1, got {rank}")
    if dtype not in _DTYPES:
        raise MiaError(f"adapter: dtype must be one of {', '.join(_DTYPES)}")
    bw, tw = _weights(Path(base)), _weights(Path(tuned))
    if set(bw) != set(tw):
        raise MiaError("adapter: base and tuned folders hold different weights")
    tensors: dict[str, torch.Tensor] = {}
    worst, matrices = 0.0, 0
    for name in sorted(bw):
        b, t = bw[name].float(), tw[name].float()
        if b.shape != t.shape:
            raise MiaError(f"adapter: {name} has shape {tuple(b.shape)} vs {tuple(t.shape)}")
        delta = t - b
        if float(delta.abs().max()) <= tol:
            continue
        if delta.dim() != 2:
            tensors[f"{name}@full"] = delta.to(_DTYPES[dtype]).contiguous()
            continue
        u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
        r = min(rank, int(s.numel()))
        root = s[:r].sqrt()
        bm = (u[:, :r] * root).float()
        am = (root[:, None] * vh[:r]).float()
        err = float((bm @ am - delta).norm() / delta.norm().clamp_min(1e-30))
        worst = max(worst, err)
        tensors[f"{name}@A"] = am.to(_DTYPES[dtype]).contiguous()
        tensors[f"{name}@B"] = bm.to(_DTYPES[dtype]).contiguous()
        matrices += 1
    if not tensors:
        raise MiaError("adapter: the tuned weights equal the base weights")
    meta = {
        "format": FORMAT,
        "rank": str(rank),
        "dtype": dtype,
        "base_sha256": file_sha256(Path(base) / WEIGHTS),
        **{str(k): str(v) for k, v in (metadata or {}).items()},
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return {
        "path": str(path),
        "matrices": matrices,
        "full": sum(1 for k in tensors if k.endswith("@full")),
        "params": sum(v.numel() for v in tensors.values()),
        "bytes": path.stat().st_size,
        "max_rel_error": worst,
        "metadata": meta,
    }


def read_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise MiaError(f"adapter file not found: {p}")
    with safe_open(str(p), "pt") as f:
        meta = dict(f.metadata() or {})
    if meta.get("format") != FORMAT:
        raise MiaError(f"{p}: not a {FORMAT} file (format {meta.get('format')!r})")
    return load_file(str(p)), meta


def apply_adapter(
    base: str | Path,
    adapter: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    check_base: bool = True,
) -> Path:
    """The tuned folder: ``base``'s files with every delta of ``adapter`` added (in float32,
    stored as ``dtype``), written atomically to ``out``."""
    from safetensors.torch import save_file

    base_dir = Path(base)
    tensors, meta = read_adapter(adapter)
    if check_base and meta.get("base_sha256") != file_sha256(base_dir / WEIGHTS):
        raise MiaError(f"{adapter}: made for another base model than {base_dir}")
    if dtype not in _DTYPES:
        raise MiaError(f"adapter: dtype must be one of {', '.join(_DTYPES)}")
    weights = {k: v.float() for k, v in _weights(base_dir).items()}
    names = {k.rsplit("@", 1)[0] for k in tensors}
    unknown = sorted(names - set(weights))
    if unknown:
        raise MiaError(f"{adapter}: delta for a weight the base lacks: {unknown[0]}")
    for name in names:
        if f"{name}@full" in tensors:
            delta = tensors[f"{name}@full"].float()
        else:
            delta = tensors[f"{name}@B"].float() @ tensors[f"{name}@A"].float()
        weights[name] = weights[name] + delta
    target = _DTYPES[dtype]
    with atomic_dir(Path(out)) as tmp:
        for f in base_dir.iterdir():
            if f.is_file() and f.name not in (WEIGHTS, "mia-model.json"):
                shutil.copy2(f, tmp / f.name)
        save_file({k: v.to(target).contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS),
                  metadata={"format": "pt"})  # fmt: skip
        cfg_path = tmp / "config.json"
        if cfg_path.is_file():
            cfg = json.loads(cfg_path.read_text())
            for key in ("dtype", "torch_dtype"):
                if key in cfg:
                    cfg[key] = dtype
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "adapter.json").write_text(
            json.dumps({"adapter": str(adapter), **meta}, indent=2) + "\n"
        )
        tmp.chmod(0o755)
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mia.models.adapter", description=__doc__.split("\n")[0])  # fmt: skip
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract", help="tuned folder - base folder -> adapter file")
    e.add_argument("--base", required=True, type=Path)
    e.add_argument("--tuned", required=True, type=Path)
    e.add_argument("--out", required=True, type=Path)
    e.add_argument("--rank", required=True, type=int)
    e.add_argument("--dtype", default="float16", choices=list(_DTYPES))
    e.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    a = sub.add_parser("apply", help="base folder + adapter file -> tuned folder")
    a.add_argument("--base", required=True, type=Path)
    a.add_argument("--adapter", required=True, type=Path)
    a.add_argument("--out", required=True, type=Path)
    a.add_argument("--dtype", default="float32", choices=list(_DTYPES))
    i = sub.add_parser("info", help="print an adapter file's metadata and size")
    i.add_argument("adapter", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "extract":
            meta = dict(m.split("=", 1) for m in args.meta)
            rep = extract_adapter(args.base, args.tuned, args.out, rank=args.rank,
                                  dtype=args.dtype, metadata=meta)  # fmt: skip
            print(json.dumps(rep, indent=2))
        elif args.cmd == "apply":
            print(apply_adapter(args.base, args.adapter, args.out, dtype=args.dtype))
        else:
            tensors, meta = read_adapter(args.adapter)
            size = args.adapter.stat().st_size
            params = sum(v.numel() for v in tensors.values())
            print(json.dumps({"bytes": size, "params": params, **meta}, indent=2))
    except MiaError as err:
        print(f"adapter: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
