"""The trainable policy: an HF model (causal LM or Qwen2.5-VL), optimizer, schedule, GRPO step.

One class serves every layout. With a process group of world size > 1 each decoder layer (and
vision block) and then the root are wrapped with FSDP2 ``fully_shard`` (gloo on CPU, NCCL on
GPU); with world size 1 the module stays plain. Nothing else branches on the world size: the
loss of every micro-batch is its share of the *global* batch loss (global token or sequence
count), so 1 rank x 8 samples and 2 ranks x 4 samples give the same gradient.

Batch format (a dict; every token tensor is [B, L] and aligned with ``input_ids``):

- ``input_ids`` (long), ``attention_mask`` (0 = padding; prompts left-padded, responses
  right-padded, tool/user tokens inside the response are attended),
- ``response_mask`` (1 = a token the policy sampled; the loss and log-probs cover only those),
- ``old_logprobs`` (float; log-prob of token t under the behaviour policy, 0 elsewhere), or
  None: the update's own log-probs, detached, are the old ones (exact for the first optimizer
  step on a batch, when the weights are still the ones that sampled it: TRL with
  ``num_iterations=1``; saves a forward pass),
- optional ``rollout_logprobs`` (the generator's log-probs of the same tokens): with
  ``old_logprobs`` None, :meth:`PolicyModel.train_step` reports their gap to its own,
- ``advantages`` ([B] or [B, L]), optional ``ref_logprobs`` ([B, L]),
- multimodal (Qwen2.5-VL): ``pixel_values`` and ``image_grid_thw`` as *lists of length B*, one
  entry per sample (a [patches, dim] / [images, 3] tensor, or None for a text-only sample).
  Ragged per-sample lists slice with the batch; a micro-batch concatenates its entries in
  sample order, which is the order the model consumes image placeholders in.

``logprobs[b, t]`` = log p(input_ids[b, t] | input_ids[b, :t]) where ``response_mask`` is 1 (every
position when a batch has no response mask, except position 0), and 0 elsewhere.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mia import precision
from mia.errors import MiaError
from mia.models.hf import is_vision_config, merge_lora_state_dict, write_hf_folder
from mia.rl import dist as D
from mia.rl.batches import PER_SAMPLE_LIST_KEYS as PER_SAMPLE_LIST_KEYS
from mia.rl.batches import TOKEN_KEYS as TOKEN_KEYS
from mia.rl.batches import Batch, split_batch, validate_batch
from mia.rl.batches import batch_size as batch_size
from mia.rl.batches import concat_batches as concat_batches
from mia.rl.batches import slice_batch as slice_batch
from mia.rl.grpo import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    sft_loss,
    token_logprobs,
)
from mia.rl.lr_schedule import LRSchedule
from mia.rl.policy_build import build_module
from mia.rl.policy_build import restrict_trainable as restrict_trainable
from mia.rl.policy_config import LoraConfig as LoraConfig
from mia.rl.policy_config import LossConfig as LossConfig
from mia.rl.policy_config import OptimConfig as OptimConfig
from mia.rl.policy_config import PolicyConfig
from mia.rl.policy_config import config_from_dict as config_from_dict
from mia.rl.policy_config import plain_config as plain_config

# The batch helpers (mia.rl.batches), the LR schedule (mia.rl.lr_schedule), the config
# dataclasses (mia.rl.policy_config) and the model building (mia.rl.policy_build) live in their
# own modules; their names stay importable from here.

# train_step metrics that are token-weighted means (summed as value x tokens, then / tokens).
TOKEN_MEAN_METRICS = (
    "clipfrac",
    "clipfrac_dual",
    "approx_kl",
    "ratio_mean",
    "token_entropy",
    "rollout_logprob_diff_mean",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


# ----------------------------------------------------------------------------- the policy


class PolicyModel:
    """Model + optimizer + schedule for one data-parallel rank (or the only process)."""

    def __init__(self, cfg: PolicyConfig | dict[str, Any]):
        self.cfg = PolicyConfig.from_dict(cfg)
        if not self.cfg.model_path or not Path(self.cfg.model_path).is_dir():
            raise MiaError(f"policy model folder not found: {self.cfg.model_path!r}")
        self.dist = D.info()
        self.device = self._resolve_device()
        self.step = 0  # optimizer steps taken
        self.use_lora = self.cfg.lora.rank > 0
        # Seeded in a forked RNG: every rank gets the same LoRA init, and the caller's random
        # stream (sampling, shuffling) is left untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            self.module, self.hf_model = self._build(trainable=True)
        self.is_vl = is_vision_config(self.hf_model.config)
        self.ref_module = None
        if self.cfg.loss.kl_coef > 0 and not self.use_lora:
            # With LoRA the reference is the same module with its adapters disabled.
            self.ref_module, _ = self._build(trainable=False)
        params = [p for p in self.module.parameters() if p.requires_grad]
        o = self.cfg.optim
        fused = self.dist.world_size == 1 if o.fused is None else o.fused
        self.optimizer = torch.optim.AdamW(
            params,
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=fused or None,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, LRSchedule(o.warmup_steps, o.schedule, o.total_steps, o.min_lr_ratio)
        )

    # -- construction ---------------------------------------------------------------------

    def _resolve_device(self) -> torch.device:
        want = self.cfg.device
        if want == "auto":
            return D.default_device()
        if want == "cuda" and not torch.cuda.is_available():
            raise MiaError("policy.device=cuda but no GPU is visible")
        return (
            torch.device("cuda", torch.cuda.current_device())
            if want == "cuda"
            else torch.device(want)
        )

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        # bf16 only where the device computes it natively (mia.precision): emulated bf16 on an
        # AVX2-only CPU is ~60x slower than float32.
        return precision.autocast_dtype(self.cfg.mixed_precision, self.device)

    def _build(self, trainable: bool) -> tuple[torch.nn.Module, Any]:
        return build_module(
            self.cfg, self.device, self.dist.world_size, self.autocast_dtype, trainable
        )

    # -- forward ----------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _position_ids(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mb: Batch
    ) -> torch.Tensor:
        """Positions that skip left padding, as generation computes them.

        Qwen2.5-VL additionally needs 3-D (time, height, width) rotary positions for image
        tokens, returned as [4, B, L] (text row first, the layout ``generate`` uses).
        """
        text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
        grid = mb.get("image_grid_thw")
        if not self.is_vl or grid is None:
            return text
        cfg = self.hf_model.config
        mm = torch.zeros_like(input_ids, dtype=torch.int)
        mm[input_ids == cfg.image_token_id] = 1
        vision, _ = self.hf_model.model.get_rope_index(
            input_ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=attention_mask
        )
        return torch.cat([text[None], vision.to(text)], dim=0)

    def _forward(
        self,
        module: torch.nn.Module,
        mb: Batch,
        need_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token log-probs (and entropies) [b, L] for one micro-batch; zeros where undefined.
        ``entropy_grad=False``: the entropies are a metric only (no autograd graph)."""
        ids_full = mb["input_ids"].to(self.device)
        attn_full = mb["attention_mask"].to(self.device)
        b, length = ids_full.shape
        # Drop columns that are padding in every row (micro-batches are often narrower).
        cols = attn_full.bool().any(0).nonzero().flatten()
        lo, hi = (int(cols[0]), int(cols[-1]) + 1) if cols.numel() else (0, length)
        ids, attn = ids_full[:, lo:hi], attn_full[:, lo:hi]
        resp = mb.get("response_mask")
        # Only positions from the first response token onwards need logits (saves the
        # [b, prompt_len, V] head output, the largest tensor for long prompts).
        first = 1
        if resp is not None:
            rcols = resp[:, lo:hi].bool().any(0).nonzero().flatten()
            first = max(1, int(rcols[0])) if rcols.numel() else hi - lo
        first = min(first, hi - lo)
        inputs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": self._position_ids(ids, attn, mb),
            "use_cache": False,
            "logits_to_keep": hi - lo - first + 1,
        }
        pv = [p for p in (mb.get("pixel_values") or []) if p is not None]
        keepalive: contextlib.AbstractContextManager = contextlib.nullcontext()
        if self.is_vl and pv:
            inputs["pixel_values"] = torch.cat(pv).to(self.device)
            inputs["image_grid_thw"] = mb["image_grid_thw"].to(self.device)
        elif self.is_vl:
            keepalive = self._vision_keepalive(module)
        with keepalive:
            logits = module(**inputs).logits[:, :-1]  # [b, K, V]: position p predicts token p + 1
        if self.cfg.loss.temperature != 1.0:
            logits = logits / self.cfg.loss.temperature
        targets = ids[:, first:]
        # An entropy without gradient comes from the log-softmax the log-probs take anyway.
        metric_entropy = need_entropy and (not entropy_grad or not torch.is_grad_enabled())
        if metric_entropy:
            lp, ent = token_logprobs(logits, targets, self.cfg.logits_chunk_size, True)
        else:
            lp = token_logprobs(logits, targets, self.cfg.logits_chunk_size)
        out = torch.zeros(b, length, dtype=lp.dtype, device=lp.device)
        out[:, lo + first : hi] = lp
        if resp is not None:  # tool/user tokens inside the response carry no log-prob either
            out = out * resp.to(out.device, out.dtype)
        ent_out = None
        if need_entropy:
            if not metric_entropy:
                with contextlib.nullcontext() if entropy_grad else torch.no_grad():
                    ent = entropy_from_logits(logits, self.cfg.logits_chunk_size)
            ent_out = torch.zeros(b, length, dtype=ent.dtype, device=ent.device)
            ent_out[:, lo + first : hi] = ent
        return out, ent_out

    @contextlib.contextmanager
    def _vision_keepalive(self, module: torch.nn.Module) -> Iterator[None]:
        """Run the vision tower on a dummy image during a text-only forward.

        Under FSDP every rank must run the same collectives in the same order: a rank whose
        micro-batch has no image would skip the vision blocks' all-gathers (and their gradient
        reduce-scatters) while another rank runs them, and the group would deadlock. Adding
        0 x (dummy image features) to the token embeddings runs the tower at the point where
        real images are encoded and gives its weights zero gradients; values are unchanged.
        """
        hf = self.ref_module if module is self.ref_module else self.hf_model
        visual = hf.model.visual
        vcfg = hf.config.vision_config
        side = 2 * vcfg.spatial_merge_size
        dim = vcfg.in_channels * vcfg.temporal_patch_size * vcfg.patch_size**2
        pixels = torch.zeros(side * side, dim, device=self.device)
        grid = torch.tensor([[1, side, side]], device=self.device)

        def add_zero_image(_mod: torch.nn.Module, _inp: Any, embeds: torch.Tensor) -> torch.Tensor:
            feats = visual(pixels.to(visual.dtype), grid_thw=grid)
            feats = getattr(feats, "pooler_output", feats)
            return embeds + 0.0 * feats.mean().to(embeds.dtype)

        handle = hf.get_input_embeddings().register_forward_hook(add_zero_image)
        try:
            yield
        finally:
            handle.remove()

    def _micro_batches(self, batch: Batch, size: int) -> Iterator[Batch]:
        for mb in split_batch(batch, size):
            grids = mb.get("image_grid_thw")
            if isinstance(grids, list):
                # Per-sample ragged lists -> one tensor per micro-batch, in sample order.
                present = [g.reshape(-1, 3) for g in grids if g is not None]
                mb["image_grid_thw"] = torch.cat(present).long() if present else None
            yield mb

    # -- public API -------------------------------------------------------------------------

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, return_entropy: bool = False) -> Any:
        """Log-probs [B, L] (float32, CPU) of the current policy; optionally also entropies."""
        validate_batch(batch, ("input_ids", "attention_mask"))
        lps, ents = [], []
        for mb in self._micro_batches(batch, self.cfg.logprob_micro_batch_size):
            with self._autocast():
                lp, ent = self._forward(self.module, mb, need_entropy=return_entropy)
            lps.append(lp.float().cpu())
            if ent is not None:
                ents.append(ent.float().cpu())
        lp_all = torch.cat(lps)
        return (lp_all, torch.cat(ents)) if return_entropy else lp_all

    @torch.no_grad()
    def compute_ref_logprobs(self, batch: Batch) -> torch.Tensor:
        """Log-probs [B, L] under the frozen reference (base weights)."""
        validate_batch(batch, ("input_ids", "attention_mask"))
        out = []
        for mb in self._micro_batches(batch, self.cfg.logprob_micro_batch_size):
            out.append(self._ref_forward(mb).float().cpu())
        return torch.cat(out)

    def _ref_forward(self, mb: Batch) -> torch.Tensor:
        if self.use_lora:
            with self.module.disable_adapter(), self._autocast():
                return self._forward(self.module, mb)[0]
        if self.ref_module is None:
            raise MiaError("no reference model: set loss.kl_coef > 0 to load one")
        with self._autocast():
            return self._forward(self.ref_module, mb)[0]

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on this rank's share of the global batch; global metrics.

        Every rank must call it with the same number of samples (hence of micro-batches):
        FSDP's collectives pair up forward by forward. ``old_logprobs`` None (on-policy, the
        first update on a batch): each micro-batch's own log-probs, detached, are the old
        ones, and the metrics add ``token_entropy`` (token mean) and, with the batch's
        ``rollout_logprobs`` and an untempered loss, ``rollout_logprob_diff_mean|max`` (the
        generator-vs-trainer gap that ``old_logprobs="recompute"`` callers measure with
        :meth:`compute_logprobs`).
        """
        need = ("input_ids", "attention_mask", "response_mask", "old_logprobs", "advantages")
        validate_batch(batch, need)
        lc = self.cfg.loss
        on_policy = batch["old_logprobs"] is None
        gap_check = (
            on_policy and batch.get("rollout_logprobs") is not None and lc.temperature == 1.0
        )
        mask = batch["response_mask"]
        # Global normalisers: shares of every micro-batch on every rank add up to the batch mean.
        counts = torch.tensor(
            [float(mask.sum()), float(mask.shape[0])], dtype=torch.float64, device=self.device
        )
        D.all_reduce(counts)
        n_tokens, n_seqs = float(counts[0]), float(counts[1])
        denom = n_tokens if lc.agg == "token-mean" else n_seqs
        sums: dict[str, float] = {}
        ratio_max, ratio_min, gap_max = -math.inf, math.inf, 0.0
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self._micro_batches(batch, self.cfg.micro_batch_size):
            m, mb_tokens, gap = self._micro_batch_loss(mb, denom, on_policy, gap_check, sums)
            if gap is not None:
                gap_max = max(gap_max, gap)
            if mb_tokens:
                ratio_max = max(ratio_max, float(m["ratio_max"]))
                ratio_min = min(ratio_min, float(m["ratio_min"]))
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = self._clip_and_step()
        stepped = math.isfinite(grad_norm)
        if stepped:  # a skipped update does not advance the schedule either
            self.scheduler.step()
        metrics = self._reduce_metrics(sums, n_tokens, ratio_max, ratio_min, gap_max)
        if not gap_check:
            metrics.pop("rollout_logprob_diff_max")
        metrics.update(
            grad_norm=grad_norm,
            lr=lr,
            n_tokens=n_tokens,
            n_seqs=n_seqs,
            step=float(self.step),
            skipped=0.0 if stepped else 1.0,
        )
        return metrics

    def _micro_batch_loss(
        self, mb: Batch, denom: float, on_policy: bool, gap_check: bool, sums: dict[str, float]
    ) -> tuple[dict[str, Any], float, float | None]:
        """Forward, loss and backward of one :meth:`train_step` micro-batch; adds its metric
        sums to ``sums``. Returns :func:`~mia.rl.grpo.policy_loss`'s metrics, the micro-batch's
        response tokens and (``gap_check``) its largest rollout/trainer log-prob gap."""
        lc = self.cfg.loss
        largest_gap = None
        mmask = mb["response_mask"].to(self.device)
        mb_tokens = float(mmask.sum())
        ref_lp = mb.get("ref_logprobs")
        if lc.kl_coef > 0 and ref_lp is None:
            with torch.no_grad():
                ref_lp = self._ref_forward(mb)
        with self._autocast():
            lp, ent = self._forward(
                self.module,
                mb,
                need_entropy=lc.entropy_coef != 0 or on_policy,
                entropy_grad=lc.entropy_coef != 0,
            )
        old = lp.detach() if on_policy else mb["old_logprobs"].to(self.device, lp.dtype)
        pg, m = policy_loss(
            lp,
            old,
            mb["advantages"].to(self.device, lp.dtype),
            mmask,
            clip_low=lc.clip_low,
            clip_high=lc.clip_high,
            clip_ratio_c=lc.clip_ratio_c,
            agg=lc.agg,  # type: ignore[arg-type]
            denom=denom,
        )
        loss = pg
        parts = {"pg_loss": pg.detach()}
        if lc.kl_coef > 0:
            kl = aggregate(
                kl_penalty(lp, ref_lp.to(self.device, lp.dtype), lc.kl_kind),
                mmask,
                lc.agg,
                denom,
            )  # type: ignore[arg-type]
            loss = loss + lc.kl_coef * kl
            parts["kl_loss"] = kl.detach()
        if ent is not None and lc.entropy_coef != 0:
            ent_term = aggregate(ent, mmask, lc.agg, denom)  # type: ignore[arg-type]
            loss = loss - lc.entropy_coef * ent_term
            parts["entropy"] = ent_term.detach()
        if on_policy and ent is not None:  # the metric the recomputing caller would log
            sums["token_entropy"] = sums.get("token_entropy", 0.0) + float(
                (ent.detach() * mmask).sum()
            )
        if gap_check:
            gap = (mb["rollout_logprobs"].to(self.device, lp.dtype) - old).abs() * mmask
            key = "rollout_logprob_diff_mean"
            sums[key] = sums.get(key, 0.0) + float(gap.sum())
            largest_gap = float(gap.max())
        # FSDP averages gradients over ranks; the shares are already global, so undo that.
        (loss * self.dist.world_size).backward()
        parts["loss"] = loss.detach()
        for key, value in parts.items():
            sums[key] = sums.get(key, 0.0) + float(value)
        for key in ("clipfrac", "clipfrac_dual", "approx_kl", "ratio_mean"):
            sums[key] = sums.get(key, 0.0) + float(m[key]) * mb_tokens  # token-weighted
        return m, mb_tokens, largest_gap

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step: cross-entropy on the ``response_mask`` tokens.

        Same batch layout, micro-batching and global normalisation as :meth:`train_step` (every
        rank must call it with the same number of samples). Metrics: ``loss`` (mean NLL per
        token for token-mean), ``grad_norm``, ``lr``, ``n_tokens``, ``n_seqs``, ``step``.
        """
        validate_batch(batch, ("input_ids", "attention_mask", "response_mask"))
        agg = self.cfg.loss.agg
        mask = batch["response_mask"]
        counts = torch.tensor(
            [float(mask.sum()), float(mask.shape[0])], dtype=torch.float64, device=self.device
        )
        D.all_reduce(counts)
        n_tokens, n_seqs = float(counts[0]), float(counts[1])
        denom = n_tokens if agg == "token-mean" else n_seqs
        total = 0.0
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self._micro_batches(batch, self.cfg.micro_batch_size):
            with self._autocast():
                lp, _ = self._forward(self.module, mb)
            loss = sft_loss(lp, mb["response_mask"].to(self.device), agg, denom)  # type: ignore[arg-type]
            (loss * self.dist.world_size).backward()  # undo FSDP's mean over ranks
            total += float(loss.detach())
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = self._clip_and_step()
        stepped = math.isfinite(grad_norm)
        if stepped:
            self.scheduler.step()
        summed = torch.tensor([total], dtype=torch.float64, device=self.device)
        D.all_reduce(summed)
        return {
            "loss": float(summed[0]),
            "grad_norm": grad_norm,
            "lr": lr,
            "n_tokens": n_tokens,
            "n_seqs": n_seqs,
            "step": float(self.step),
            "skipped": 0.0 if stepped else 1.0,
        }

    def _clip_and_step(self) -> float:
        params = [p for p in self.module.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else torch.tensor(0.0)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor of per-shard partial norms
            norm = norm.full_tensor()
        norm_f = float(norm)
        if not math.isfinite(norm_f):
            # A NaN/inf gradient would poison AdamW's moments for good: skip this update.
            self.optimizer.zero_grad(set_to_none=True)
            return norm_f
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.optim.grad_clip, norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return norm_f

    def _reduce_metrics(
        self,
        sums: dict[str, float],
        n_tokens: float,
        ratio_max: float,
        ratio_min: float,
        gap_max: float,
    ) -> dict[str, float]:
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        D.all_reduce(t)
        ext = torch.tensor(
            [ratio_max, -ratio_min, gap_max], dtype=torch.float64, device=self.device
        )
        D.all_reduce(ext, op="max")
        out = {}
        for key, value in zip(keys, t.tolist(), strict=True):
            weighted = key in TOKEN_MEAN_METRICS
            out[key] = value / max(n_tokens, 1.0) if weighted else value
        out["ratio_max"], out["ratio_min"] = float(ext[0]), float(-ext[1])
        out["rollout_logprob_diff_max"] = float(ext[2])
        return out

    # -- state ------------------------------------------------------------------------------

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) HF-named weights on CPU, LoRA merged in; rank 0 gets them, others {}.

        A COLLECTIVE with FSDP: every rank must call it, or all of them hang.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(self.module, options=opts)
        if self.dist.rank != 0:
            return {}
        if self.use_lora:
            sd = merge_lora_state_dict(sd, self.cfg.lora.alpha / self.cfg.lora.rank)
        return sd

    def export_hf(self, out_dir: str | Path, dtype: str = "auto") -> Path | None:
        """Write a Hugging Face folder of the current weights (collective; rank 0 writes)."""
        sd = self.state_dict_for_export()
        out = None
        if self.dist.rank == 0:
            out = write_hf_folder(sd, self.cfg.model_path, out_dir, dtype=dtype)
        D.barrier()
        return out

    def copy_hf_assets(self, out_dir: str | Path) -> None:
        """Copy config, tokenizer, processor, chat template, generation config (no weights)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for f in Path(self.cfg.model_path).iterdir():
            if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
                shutil.copy2(f, out / f.name)

    def rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": _numpy_state_to_torch(np.random.get_state()),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        random.setstate(_as_tuple(state["python"]))
        np.random.set_state(_numpy_state_from_torch(state["numpy"]))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def _numpy_state_to_torch(state: tuple) -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = state
    return {
        "kind": kind,
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _numpy_state_from_torch(state: dict[str, Any]) -> tuple:
    keys = state["keys"].numpy().astype(np.uint32)
    return (state["kind"], keys, state["pos"], state["has_gauss"], state["cached"])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
