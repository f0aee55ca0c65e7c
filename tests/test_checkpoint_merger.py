"""Policy training, resumable checkpoints and the model merger on tiny real models (world size 1)."""

from __future__ import annotations

import json
import random
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mia.errors import MiaError
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2, tiny_qwen25vl
from mia.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from mia.rl.model_merger import cli as merger_cli
from mia.rl.policy import PolicyConfig, PolicyModel
from mia.vision import expand_image_pads, preprocess_images

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, tokenizer) -> Path:
    return save_tiny(tiny_qwen2(tokenizer), tokenizer, tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory, tokenizer) -> Path:
    return save_tiny(tiny_qwen25vl(tokenizer), tokenizer, tmp_path_factory.mktemp("qwen25vl"))


def text_batch(seed: int, n: int = 4, vocab: int = 1000) -> dict:
    """Left-padded prompts, right-padded responses with an injected (mask 0) tool span."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [5 + (seed + i) % 4 for i in range(n)]
    resp_lens = [6 + (seed * 3 + i) % 5 for i in range(n)]
    p_max, r_max = max(prompt_lens), max(resp_lens)
    ids = torch.zeros(n, p_max + r_max, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids)
    for i, (pl, rl) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        ids[i, p_max - pl : p_max + rl] = torch.randint(10, vocab, (pl + rl,), generator=g)
        attn[i, p_max - pl : p_max + rl] = 1
        resp[i, p_max : p_max + rl] = 1
        resp[i, p_max + 2 : p_max + 4] = 0  # a tool response inside the turn: not trained on
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5][:n] * (n // 4 or 1))[:n]
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "advantages": adv}


def with_old_logprobs(policy: PolicyModel, batch: dict) -> dict:
    # Slightly off-policy behaviour log-probs, drawn from the global RNG (like sampling noise):
    # a resumed run only matches if that RNG was restored too.
    lp = policy.compute_logprobs(batch)
    noise = 0.05 * torch.randn(lp.shape) * batch["response_mask"]
    return {**batch, "old_logprobs": lp + noise}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def policy_cfg(model_dir: Path, **over) -> dict:
    cfg = {
        "model_path": str(model_dir),
        "micro_batch_size": 2,
        "optim": {
            "lr": 1e-3,
            "warmup_steps": 2,
            "schedule": "cosine",
            "total_steps": 6,
            "min_lr_ratio": 0.1,
        },
    }
    cfg.update(over)
    return cfg


def run_steps(policy: PolicyModel, steps: range) -> list[tuple[float, float, float, float]]:
    out = []
    for s in steps:
        batch = with_old_logprobs(policy, text_batch(s))
        m = policy.train_step(batch)
        out.append((m["loss"], m["lr"], m["grad_norm"], random.random() + float(np.random.rand())))
    return out


def logits(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        return model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=pos
        ).logits


# ----------------------------------------------------------------------------- policy basics


def test_policy_logprobs_match_a_plain_forward(qwen2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    batch = text_batch(0)
    policy = PolicyModel(policy_cfg(qwen2_dir))
    lp = policy.compute_logprobs(batch)
    ref = torch.log_softmax(logits(AutoModelForCausalLM.from_pretrained(str(qwen2_dir)), batch), -1)
    ref = ref[:, :-1].gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["response_mask"][:, 1:].bool()
    assert lp.shape == batch["input_ids"].shape
    assert torch.allclose(lp[:, 1:][mask], ref[mask], atol=1e-5)
    assert (lp[:, 1:][~mask] == 0).all()  # prompt, padding and tool tokens carry no log-prob


def test_policy_config_yaml_mirrors_dataclass_defaults() -> None:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "rl" / "policy.yaml"))
    assert PolicyConfig.from_dict(data) == PolicyConfig()
    with pytest.raises(MiaError, match="unknown key"):
        PolicyConfig.from_dict({"loss": {"clip": 0.2}})


def test_bad_batch_is_a_clear_error(qwen2_dir: Path) -> None:
    policy = PolicyModel(policy_cfg(qwen2_dir))
    batch = text_batch(0)
    with pytest.raises(MiaError, match="lacks old_logprobs"):
        policy.train_step(batch)
    batch["old_logprobs"] = torch.zeros(4, 3)
    with pytest.raises(MiaError, match="old_logprobs has shape"):
        policy.train_step(batch)


def test_kl_to_a_frozen_reference_and_entropy_bonus(qwen2_dir: Path) -> None:
    from mia.rl.grpo import aggregate

    policy = PolicyModel(policy_cfg(qwen2_dir, loss={"kl_coef": 0.1, "entropy_coef": 0.01}))
    assert policy.ref_module is not None
    batch = with_old_logprobs(policy, text_batch(2))
    ref_before = policy.compute_ref_logprobs(batch)
    _, entropy = policy.compute_logprobs(batch, return_entropy=True)
    first = policy.train_step(batch)
    assert first["kl_loss"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before any update
    assert first["entropy"] == pytest.approx(
        aggregate(entropy, batch["response_mask"]).item(), abs=1e-5
    )
    assert first["loss"] == pytest.approx(first["pg_loss"] - 0.01 * first["entropy"], abs=1e-6)
    second = policy.train_step(batch)
    assert second["kl_loss"] > 0
    assert second["loss"] == pytest.approx(
        second["pg_loss"] + 0.1 * second["kl_loss"] - 0.01 * second["entropy"], abs=1e-6
    )
    assert torch.equal(policy.compute_ref_logprobs(batch), ref_before)  # the reference stays frozen


# ----------------------------------------------------------------------------- resume


def test_resume_reproduces_the_uninterrupted_run(qwen2_dir: Path, tmp_path: Path) -> None:
    seed_everything(123)
    straight = PolicyModel(policy_cfg(qwen2_dir))
    expected = run_steps(straight, range(3))

    seed_everything(123)
    first = PolicyModel(policy_cfg(qwen2_dir))
    got = run_steps(first, range(2))
    ckpt = save_checkpoint(first, tmp_path / "ckpt", data_state={"epoch": 0, "cursor": 2})
    del first
    seed_everything(999)  # a new process would start with other RNG states
    resumed = PolicyModel(policy_cfg(qwen2_dir))
    state = load_checkpoint(resumed, tmp_path / "ckpt")
    assert state == {"step": 2, "data_state": {"epoch": 0, "cursor": 2}, "path": str(ckpt)}
    assert resumed.step == 2
    got += run_steps(resumed, range(2, 3))

    assert got[:2] == expected[:2]
    loss, lr, gnorm, draw = got[2]
    assert loss == pytest.approx(expected[2][0], abs=1e-6)
    assert lr == expected[2][1]  # the schedule resumed mid-warmup-decay, not from scratch
    assert gnorm == pytest.approx(expected[2][2], abs=1e-6)
    assert draw == expected[2][3]  # python + numpy RNG restored
    for (name, a), b in zip(
        straight.module.state_dict().items(), resumed.module.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name


def test_checkpoint_layout_atomicity_and_pruning(qwen2_dir: Path, tmp_path: Path) -> None:
    policy = PolicyModel(policy_cfg(qwen2_dir))
    root = tmp_path / "ckpt"
    for step in (1, 2, 3):
        save_checkpoint(policy, root, step=step, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == [
        "global_step_2",
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]
    step3 = root / "global_step_3"
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "3\n"
    assert {p.name for p in step3.iterdir()} == {
        "dcp",
        "huggingface",
        "rng",
        "trainer_state.json",
        "meta.json",
        "COMPLETE",
    }
    assert (step3 / "huggingface" / "tokenizer.json").is_file()
    assert not list((step3 / "huggingface").glob("*.safetensors"))
    assert json.loads((step3 / "meta.json").read_text())["world_size"] == 1
    # A crash mid-save leaves a temp folder or an unmarked one: neither counts.
    (root / ".tmp-global_step_9" / "dcp").mkdir(parents=True)
    shutil.copytree(step3, root / "global_step_7")
    (root / "global_step_7" / "COMPLETE").unlink()
    assert latest_checkpoint(root) == step3
    with pytest.raises(MiaError, match="incomplete"):
        load_checkpoint(policy, root / "global_step_7")
    assert latest_checkpoint(tmp_path / "nothing") is None


# ----------------------------------------------------------------------------- merger


@pytest.fixture(scope="module")
def trained_ckpt(qwen2_dir: Path, tmp_path_factory) -> tuple[PolicyModel, Path]:
    policy = PolicyModel(policy_cfg(qwen2_dir, optim={"lr": 1e-2}))
    run_steps(policy, range(2))
    return policy, save_checkpoint(policy, tmp_path_factory.mktemp("ck") / "ckpt")


@pytest.mark.filterwarnings("ignore:.*found in sys.modules")
def test_merge_cli_round_trip_gives_identical_logits(
    trained_ckpt, qwen2_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    from transformers import AutoModelForCausalLM

    policy, ckpt = trained_ckpt
    out = tmp_path / "hf"
    # `python -m mia.rl.model_merger ...`, run in-process (a fresh interpreter costs ~10 s of imports)
    argv = ["model_merger", "merge", "--backend", "fsdp", "--local_dir", str(ckpt)]
    argv += ["--target_dir", str(out), "--tie-word-embedding", "--trust-remote-code"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_module("mia.rl.model_merger", run_name="__main__", alter_sys=True)
    assert capsys.readouterr().out == f"merged {ckpt} -> {out}\n"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in out.iterdir()
    }
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    batch = text_batch(5)
    assert torch.allclose(logits(merged, batch), logits(policy.module, batch), atol=1e-6)
    original = AutoModelForCausalLM.from_pretrained(str(qwen2_dir))
    assert not torch.allclose(
        logits(original, batch), logits(merged, batch), atol=1e-3
    )  # it trained


def test_merger_test_command_compares_with_a_reference(
    trained_ckpt, tmp_path: Path, capsys
) -> None:
    policy, ckpt = trained_ckpt
    ref = policy.export_hf(tmp_path / "export")
    merger_cli(["test", "--backend", "fsdp", "--local_dir", str(ckpt), "--test_hf_dir", str(ref)])
    assert capsys.readouterr().out.startswith("ok: ")
    with pytest.raises(SystemExit) as exc:
        merger_cli(["test", "--local_dir", str(ckpt), "--test_hf_dir", str(policy.cfg.model_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "differs from the reference" in err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("delete", "incomplete: shard of rank 0 missing (__0_0.distcp)"),
        ("truncate", "corrupt: shard of rank 0 is truncated"),
        ("unmark", "incomplete: no COMPLETE marker"),
    ],
)
def test_merger_names_the_broken_shard(
    trained_ckpt, tmp_path: Path, capsys, damage: str, message: str
) -> None:
    _, ckpt = trained_ckpt
    broken = tmp_path / "global_step_2"
    shutil.copytree(ckpt, broken)
    shard = broken / "dcp" / "__0_0.distcp"
    if damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    else:
        (broken / "COMPLETE").unlink()
    with pytest.raises(SystemExit) as exc:
        merger_cli(["merge", "--local_dir", str(broken), "--target_dir", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_lora_policy_merges_adapters_and_uses_base_as_reference(
    qwen2_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    cfg = policy_cfg(
        qwen2_dir, optim={"lr": 5e-2}, lora={"rank": 4, "alpha": 8}, loss={"kl_coef": 0.1}
    )
    policy = PolicyModel(cfg)
    batch = with_old_logprobs(policy, text_batch(1))
    base_lp = policy.compute_ref_logprobs(batch)
    metrics = policy.train_step(batch)
    assert metrics["kl_loss"] == pytest.approx(0.0, abs=1e-9)  # adapters start at B = 0
    assert not torch.allclose(policy.compute_logprobs(batch), base_lp, atol=1e-4)  # LoRA learned
    assert torch.allclose(policy.compute_ref_logprobs(batch), base_lp, atol=1e-6)  # base frozen
    ckpt = save_checkpoint(policy, tmp_path / "ckpt")
    assert json.loads((ckpt / "meta.json").read_text())["lora"]["rank"] == 4
    merger_cli(["merge", "--local_dir", str(ckpt), "--target_dir", str(tmp_path / "hf")])
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert torch.allclose(logits(merged, batch), logits(policy.module, batch), atol=1e-5)


# ----------------------------------------------------------------------------- Qwen2.5-VL


def vl_batch(tokenizer, image_token_id: int) -> dict:
    """Two samples with an image each (different sizes), one text-only; ragged per-sample lists."""
    from PIL import Image

    images = [
        Image.new("RGB", (56, 56), (200, 30, 30)),
        None,
        Image.new("RGB", (84, 56), (20, 40, 220)),
    ]
    rows, pixels, grids = [], [], []
    for i, img in enumerate(images):
        text = f"Question {i}: what is in the picture?"
        pv = grid = None
        if img is not None:
            text = "<|vision_start|><|image_pad|><|vision_end|>" + text
            pre = preprocess_images([img])
            pv, grid = pre["pixel_values"], pre["image_grid_thw"]
        prompt = tokenizer(text)["input_ids"]
        if grid is not None:
            prompt = expand_image_pads(prompt, grid, image_token_id=image_token_id)
        rows.append((prompt, tokenizer(f" The answer is {i}.")["input_ids"]))
        pixels.append(pv)
        grids.append(grid)
    p_max = max(len(p) for p, _ in rows)
    r_max = max(len(r) for _, r in rows)
    n = len(rows)
    ids = torch.full((n, p_max + r_max), tokenizer.pad_token_id)
    attn, resp = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, p_max - len(p) : p_max + len(r)] = torch.tensor(p + r)
        attn[i, p_max - len(p) : p_max + len(r)] = 1
        resp[i, p_max : p_max + len(r)] = 1
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": resp,
        "advantages": torch.tensor([1.0, -0.5, -0.5]),
        "pixel_values": pixels,
        "image_grid_thw": grids,
    }


def test_vl_policy_trains_and_merges_as_image_text_to_text(
    vl_dir: Path, tokenizer, tmp_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText

    policy = PolicyModel(policy_cfg(vl_dir, optim={"lr": 1e-2}))
    batch = vl_batch(tokenizer, policy.hf_model.config.image_token_id)
    # Per-sample log-probs must not depend on what else shares the micro-batch.
    alone = torch.cat(
        [policy.compute_logprobs({k: v[i : i + 1] for k, v in batch.items()}) for i in range(3)]
    )
    lp = policy.compute_logprobs(batch)
    assert torch.allclose(lp, alone, atol=1e-5)
    metrics = policy.train_step({**batch, "old_logprobs": lp})
    assert metrics["n_seqs"] == 3 and metrics["grad_norm"] > 0
    visual = dict(policy.module.named_parameters())["model.visual.blocks.0.attn.qkv.weight"]
    ckpt = save_checkpoint(policy, tmp_path / "ckpt")
    out = tmp_path / "hf"
    merger_cli(["merge", "--backend", "fsdp", "--local_dir", str(ckpt), "--target_dir", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert (out / "preprocessor_config.json").is_file()
    merged = AutoModelForImageTextToText.from_pretrained(str(out))
    assert torch.equal(
        merged.state_dict()["model.visual.blocks.0.attn.qkv.weight"], visual.detach()
    )
    # The merged model scores the batch like the trained policy (images included).
    reloaded = PolicyModel(policy_cfg(out))
    assert torch.allclose(
        reloaded.compute_logprobs(batch), policy.compute_logprobs(batch), atol=1e-5
    )
    i = 0  # and a plain transformers forward with images agrees
    a = batch["attention_mask"][i].bool()
    ids = batch["input_ids"][i : i + 1, a]
    mm = (ids == merged.config.image_token_id).int()
    kw = {
        "pixel_values": batch["pixel_values"][i],
        "image_grid_thw": batch["image_grid_thw"][i],
        "mm_token_type_ids": mm,
    }
    with torch.no_grad():
        got = merged(input_ids=ids, **kw).logits
        want = policy.module(input_ids=ids, **kw).logits
    assert torch.allclose(got, want, atol=1e-5)


# ----------------------------------------------------------------------------- veRL checkpoints


def test_verl_fsdp2_shards_merge_to_the_same_model(qwen2_dir: Path, tmp_path: Path, capsys) -> None:
    """Two real ranks wrap the model with ``fully_shard`` (gloo) and ``torch.save`` their
    DTensor state dicts as veRL does; the merger glues them back: logits equal the unsharded
    model's, and ``test`` agrees with the original folder."""
    import subprocess

    from transformers import AutoModelForCausalLM

    from mia.rl.dist import find_free_port

    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    port = str(find_free_port())
    script = str(REPO / "tests" / "verl_layout.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(r), "2", port, str(qwen2_dir), str(actor)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    shard = torch.load(actor / "model_world_size_2_rank_1.pt", weights_only=False)
    from torch.distributed.tensor import DTensor

    emb = shard["model.embed_tokens.weight"]
    assert isinstance(emb, DTensor) and emb.to_local().shape[0] < emb.shape[0]  # really sharded
    out = tmp_path / "hf"
    # veRL's own command line, pointed at global_step_K (actor/ is found)
    merger_cli(
        ["merge", "--backend", "fsdp", "--local_dir", str(actor.parent), "--target_dir", str(out)]
    )
    assert capsys.readouterr().out == f"merged {actor.parent} -> {out}\n"
    merged = AutoModelForCausalLM.from_pretrained(str(out))
    original = AutoModelForCausalLM.from_pretrained(str(qwen2_dir))
    batch = text_batch(7)
    assert torch.equal(logits(merged, batch), logits(original, batch))
    merger_cli(["test", "--local_dir", str(actor), "--test_hf_dir", str(qwen2_dir)])
    assert capsys.readouterr().out.startswith("ok: ")


def test_verl_fsdp1_plain_shards_of_a_transformers4_vl_model(
    vl_dir: Path, tokenizer, tmp_path: Path
) -> None:
    """FSDP1-era shards (plain tensors, each rank's rows) of a Qwen2.5-VL saved with the
    transformers-4 names (``visual.*``, ``model.layers.*``), three ranks with uneven rows: the
    merged image-text-to-text model scores an image batch like the original."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText
    from verl_layout import copy_hf_config, write_plain_shards

    sd = load_file(str(vl_dir / "model.safetensors"))
    old = {}
    for k, v in sd.items():
        k = k.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
        old[k] = v
    assert any(k.startswith("visual.") for k in old) and any(k.startswith("model.") for k in old)
    ckpt = tmp_path / "global_step_1" / "actor"
    write_plain_shards(old, 3, ckpt)
    copy_hf_config(vl_dir, ckpt)
    out = tmp_path / "hf"
    merger_cli(["merge", "--local_dir", str(ckpt), "--target_dir", str(out)])
    merged = AutoModelForImageTextToText.from_pretrained(str(out))
    original = AutoModelForImageTextToText.from_pretrained(str(vl_dir))
    batch = vl_batch(tokenizer, original.config.image_token_id)
    a = batch["attention_mask"][0].bool()
    ids = batch["input_ids"][0:1, a]
    kw = {
        "pixel_values": batch["pixel_values"][0],
        "image_grid_thw": batch["image_grid_thw"][0],
        "mm_token_type_ids": (ids == original.config.image_token_id).int(),
    }
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids, **kw).logits, original(input_ids=ids, **kw).logits)


def test_verl_shard_missing_or_unsafe_is_one_line(qwen2_dir: Path, tmp_path: Path, capsys) -> None:
    from safetensors.torch import load_file
    from verl_layout import copy_hf_config, write_plain_shards

    ckpt = tmp_path / "actor"
    write_plain_shards(load_file(str(qwen2_dir / "model.safetensors")), 2, ckpt)
    copy_hf_config(qwen2_dir, ckpt)
    (ckpt / "model_world_size_2_rank_1.pt").unlink()
    for path, message in (
        ("missing", "incomplete: shard of rank 1 missing (model_world_size_2_rank_1.pt)"),
        ("unsafe", "cannot read veRL shard"),
    ):
        if path == "unsafe":  # a pickle that would run code is refused, not executed
            torch.save({"x": Path("/etc")}, ckpt / "model_world_size_2_rank_1.pt")
        with pytest.raises(SystemExit) as exc:
            merger_cli(["merge", "--local_dir", str(ckpt), "--target_dir", str(tmp_path / "o")])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()
