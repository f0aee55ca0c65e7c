"""Sharded, resumable, atomic training checkpoints.

Layout of ``<root>/global_step_<K>/`` (a step folder is what the model merger reads)::

    dcp/                 torch.distributed.checkpoint: model + optimizer, one shard file per rank
    huggingface/         config, tokenizer, processor, chat template (to rebuild the architecture)
    rng/rank_<r>.pt      python / numpy / torch (/ cuda) RNG states of each rank
    trainer_state.json   step, LR-scheduler state, the trainer's data position (opaque dict)
    meta.json            format, world size, LoRA settings, source model
    COMPLETE             written last

Every rank writes its shard into ``<root>/.tmp-global_step_<K>/``; after a barrier rank 0
writes the rest, the ``COMPLETE`` marker, renames the folder into place and updates
``latest_checkpointed_iteration.txt``. A crash at any point leaves either the previous
checkpoints or a complete new one; :func:`latest_checkpoint` only trusts marked folders.
Resuming works at any world size (DCP reshards); RNG states are restored per rank when the
saved world size matches.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mia.errors import MiaError
from mia.paths import atomic_write_text
from mia.rl import dist as D

if TYPE_CHECKING:
    from mia.rl.policy import PolicyModel

FORMAT = "mia-rl-checkpoint/1"
STEP_PREFIX = "global_step_"
COMPLETE = "COMPLETE"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # veRL's name, for scripts that read it
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, folder), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / COMPLETE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete step folder under ``root`` (None when there is none)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resume_path(want: bool | str | None, root: str | Path) -> Path | None:
    """What a ``resume`` setting points at: off (false, "", "never") -> None; true / "auto" /
    "latest" -> the newest complete checkpoint under ``root`` (None when there is none); else
    a step folder, which must exist."""
    if want is False or want in ("", "false", "never", None):
        return None
    if want is True or want in ("true", "auto", "latest"):
        return latest_checkpoint(root)
    path = Path(str(want))
    if not path.exists():
        raise MiaError(f"resume: checkpoint {path} not found")
    return path


def save_checkpoint(
    policy: PolicyModel,
    root: str | Path,
    step: int | None = None,
    data_state: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Save on every rank (a collective). ``step`` defaults to the policy's optimizer steps.

    ``data_state`` is the trainer's position in its data (epoch, cursor, sampler seed...): any
    JSON-serialisable dict, handed back by :func:`load_checkpoint`. ``keep_last`` prunes older
    complete checkpoints after the new one is in place.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(root)
    step = policy.step if step is None else int(step)
    rank = policy.dist.rank
    final = step_dir(root, step)
    tmp = root / f".tmp-{final.name}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crashed save
        (tmp / "rng").mkdir(parents=True)
    D.barrier()
    from mia.rl.model_merger import quiet_single_process_dcp

    model_sd, optim_sd = get_state_dict(policy.module, policy.optimizer)
    with quiet_single_process_dcp():
        dcp.save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=str(tmp / "dcp"),
            no_dist=not D.is_distributed(),
        )
    torch.save(policy.rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    D.barrier()
    if rank == 0:
        policy.copy_hf_assets(tmp / "huggingface")
        trainer_state = {
            "step": step,
            "policy_step": policy.step,
            "scheduler": policy.scheduler.state_dict(),
            "data_state": data_state or {},
        }
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        lora = policy.cfg.lora
        meta = {
            "format": FORMAT,
            "world_size": policy.dist.world_size,
            "model_path": str(policy.cfg.model_path),
            "is_vl": policy.is_vl,
            "lora": {
                "rank": lora.rank,
                "alpha": lora.alpha,
                "target_modules": list(lora.target_modules),
            }
            if policy.use_lora
            else None,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        (tmp / COMPLETE).write_text(f"{step}\n")
        if final.exists():  # saving the same step again replaces it
            shutil.rmtree(final)
        tmp.rename(final)
        atomic_write_text(root / LATEST_FILE, f"{step}\n")
        if keep_last:
            for _, old in list_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    D.barrier()
    return final


def load_checkpoint(policy: PolicyModel, path: str | Path) -> dict[str, Any]:
    """Restore model, optimizer, LR schedule, step and RNG (on every rank: a collective).

    ``path`` is a step folder or a root holding step folders (the latest is taken). Returns
    ``{"step": int, "data_state": dict, "path": str}``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    if not _STEP_DIR.match(path.name):
        latest = latest_checkpoint(path)
        if latest is None:
            raise MiaError(f"no complete checkpoint under {path}")
        path = latest
    if not (path / COMPLETE).is_file():
        raise MiaError(f"checkpoint {path} is incomplete (no {COMPLETE} marker)")
    from mia.rl.model_merger import check_shards, quiet_single_process_dcp, read_meta

    meta = read_meta(path)
    check_shards(path / "dcp", meta.get("world_size"))
    model_sd, optim_sd = get_state_dict(policy.module, policy.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with quiet_single_process_dcp():
        dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=not D.is_distributed())
    set_state_dict(
        policy.module,
        policy.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    policy.scheduler.load_state_dict(trainer_state["scheduler"])
    policy.step = int(trainer_state["policy_step"])
    rng = path / "rng" / f"rank_{policy.dist.rank}.pt"
    if meta.get("world_size") == policy.dist.world_size and rng.is_file():
        policy.set_rng_state(torch.load(rng, weights_only=True))
    D.barrier()
    return {
        "step": int(trainer_state["step"]),
        "data_state": trainer_state["data_state"],
        "path": str(path),
    }
