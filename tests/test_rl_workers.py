"""Data-parallel FSDP2 policy workers on Ray (2 actors, gloo) against the in-process world size 1.

One Ray cluster and one pair of actors serve the whole module (start-up is most of the cost);
the tests run in file order and keep the two groups in lock-step.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from mia.errors import MiaError
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.model_merger import cli as merger_cli
from mia.rl.model_merger import load_model_state_dict
from mia.rl.ray_utils import MAX_TEMP_DIR_CHARS, init_ray, ray_temp_dir
from mia.rl.workers import PolicyGroup

pytestmark = pytest.mark.slow  # ~40 s: Ray start-up plus two actors importing torch/transformers


def make_batch(seed: int, n: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    p_max, r_max = 8, 8
    ids = torch.randint(10, 1000, (n, p_max + r_max), generator=g)
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    for i in range(n):
        attn[i, : (seed + i) % 4] = 0  # left padding of different widths
        rl = 4 + (seed + 2 * i) % 5
        resp[i, p_max : p_max + rl] = 1
        attn[i, p_max + rl :] = 0  # right padding
    resp[:, p_max + 1] = 0  # an injected tool token
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * (n // 4 + 1))[:n]
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "advantages": adv}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    return save_tiny(tiny_qwen2(tok), tok, tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def groups(model_dir: Path, tmp_path_factory):
    cfg = {"model_path": str(model_dir), "micro_batch_size": 1, "optim": {"lr": 1e-3}}
    run = tmp_path_factory.mktemp("run")
    with init_ray(run, num_cpus=2) as info:
        assert info["temp_dir"].is_dir()
        single = PolicyGroup(cfg, world_size=1, mode="single_process")
        with PolicyGroup(cfg, world_size=2) as pair:
            yield pair, single
        single.shutdown()


def test_workers_are_two_ranks_in_other_processes(groups) -> None:
    pair, _ = groups
    assert [w["rank"] for w in pair.workers_info] == [0, 1]
    assert len({w["pid"] for w in pair.workers_info}) == 2


def test_two_fsdp_workers_match_one_process(groups) -> None:
    pair, single = groups
    for seed in (0, 1):
        batch = make_batch(seed)
        lp1 = single.compute_logprobs(batch)
        assert torch.allclose(pair.compute_logprobs(batch), lp1, atol=1e-5)
        noise = 0.05 * torch.randn(lp1.shape, generator=torch.Generator().manual_seed(seed))
        batch["old_logprobs"] = lp1 + noise * batch["response_mask"]
        m1, m2 = single.train_step(batch), pair.train_step(batch)
        assert m1["n_tokens"] == m2["n_tokens"] == float(batch["response_mask"].sum())
        for key in ("loss", "pg_loss", "clipfrac", "approx_kl", "ratio_max"):
            assert m2[key] == pytest.approx(m1[key], abs=1e-5), key
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    sd1, sd2 = single.state_dict_for_export(), pair.state_dict_for_export()
    assert sd1.keys() == sd2.keys()
    for key in sd1:
        assert torch.allclose(sd1[key], sd2[key], atol=1e-5), key
    assert pair.step == single.step == 2


def test_logprobs_of_a_batch_that_does_not_split_evenly(groups) -> None:
    pair, single = groups
    batch = make_batch(7, n=3)  # padded to 4 for the two ranks, trimmed back
    out = pair.compute_logprobs(batch)
    assert out.shape == (3, 16)
    assert torch.allclose(out, single.compute_logprobs(batch), atol=1e-5)
    with pytest.raises(MiaError, match="does not split evenly over 2"):
        pair.train_step({**batch, "old_logprobs": out})


def test_world2_checkpoint_resumes_on_two_ranks_and_reshards_to_one(
    groups, model_dir, tmp_path
) -> None:
    pair, _ = groups
    ckpt = pair.save_checkpoint(tmp_path / "ckpt", data_state={"cursor": 8})
    assert sorted(p.name for p in (ckpt / "dcp").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    batch = make_batch(3)
    batch["old_logprobs"] = pair.compute_logprobs(batch)
    continued = pair.train_step(batch)

    assert pair.load_checkpoint(tmp_path / "ckpt")["data_state"] == {"cursor": 8}
    assert pair.step == 2
    again = pair.train_step(batch)
    assert again["loss"] == pytest.approx(continued["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(continued["grad_norm"], rel=1e-6)

    fresh = PolicyGroup(
        {"model_path": str(model_dir), "micro_batch_size": 2, "optim": {"lr": 1e-3}},
        mode="single_process",
    )
    assert fresh.load_checkpoint(ckpt)["step"] == 2
    resharded = fresh.train_step(batch)
    assert resharded["loss"] == pytest.approx(continued["loss"], abs=1e-5)

    # The merger reassembles both ranks' shards into the weights the workers hold.
    merged = load_model_state_dict(ckpt)
    fresh.load_checkpoint(ckpt)
    exported = fresh.state_dict_for_export()
    assert merged.keys() == exported.keys()
    assert all(torch.equal(merged[k], exported[k]) for k in merged)


def test_merger_names_the_missing_rank(groups, tmp_path, capsys) -> None:
    pair, _ = groups
    ckpt = pair.save_checkpoint(tmp_path / "ckpt")
    broken = tmp_path / "broken" / ckpt.name
    shutil.copytree(ckpt, broken)
    (broken / "dcp" / "__1_0.distcp").unlink()
    with pytest.raises(SystemExit) as exc:
        merger_cli(
            [
                "merge",
                "--backend",
                "fsdp",
                "--local_dir",
                str(broken),
                "--target_dir",
                str(tmp_path / "o"),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "shard of rank 1 missing (__1_0.distcp)" in err


def test_export_hf_from_two_ranks(groups, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    pair, single = groups
    out = pair.export_hf(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(str(out))
    sd = pair.state_dict_for_export()
    assert all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


def test_ray_temp_dir_is_short_enough_for_unix_sockets(tmp_path) -> None:
    short_run = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    long_run = tmp_path / ("x" * 80)
    try:
        assert ray_temp_dir(short_run) == (short_run / "ray", False)
        temp, standin = ray_temp_dir(long_run)
        assert standin and str(temp).startswith("/tmp/mia-ray-")
        assert len(str(temp)) <= MAX_TEMP_DIR_CHARS
        shutil.rmtree(temp)
    finally:
        shutil.rmtree(short_run)


def test_single_process_mode_is_world_size_one_only(model_dir) -> None:
    with pytest.raises(MiaError, match="single_process mode runs world size 1"):
        PolicyGroup({"model_path": str(model_dir)}, world_size=2, mode="single_process")
    with pytest.raises(MiaError, match="policy model folder not found"):
        PolicyGroup({"model_path": "/nonexistent"}, mode="single_process")


def test_vl_ranks_stay_in_step_when_only_one_has_images(groups, tmp_path) -> None:
    """Rank 0's micro-batch has an image while rank 1's is text-only (and vice versa): without
    the dummy vision pass the FSDP collectives would mismatch and the group would abort."""
    from PIL import Image

    from mia.models.tiny import tiny_qwen25vl
    from mia.vision import expand_image_pads, preprocess_images

    pair, _ = groups
    pair.shutdown()  # free the CPUs for two new actors (this is the module's last Ray test)
    tok = build_tokenizer()
    model = tiny_qwen25vl(tok)
    vl_dir = save_tiny(model, tok, tmp_path / "vl")
    image_id = model.config.image_token_id
    rows, pixels, grids = [], [], []
    for i, has_image in enumerate([True, False, False, True]):
        prompt = tok(f"Question {i}: what is shown?")["input_ids"]
        pv = grid = None
        if has_image:
            pre = preprocess_images([Image.new("RGB", (56 + 28 * i, 56), (30 * i, 90, 200))])
            pv, grid = pre["pixel_values"], pre["image_grid_thw"]
            prompt = (
                expand_image_pads(
                    tok("<|vision_start|><|image_pad|><|vision_end|>")["input_ids"],
                    grid,
                    image_token_id=image_id,
                )
                + prompt
            )
        rows.append((prompt, tok(f" It is {i}.")["input_ids"]))
        pixels.append(pv)
        grids.append(grid)
    p_max, r_max = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
    ids = torch.full((4, p_max + r_max), tok.pad_token_id)
    attn, resp = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, p_max - len(p) : p_max + len(r)] = torch.tensor(p + r)
        attn[i, p_max - len(p) : p_max + len(r)] = 1
        resp[i, p_max : p_max + len(r)] = 1
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": resp,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "pixel_values": pixels,
        "image_grid_thw": grids,
    }
    cfg = {
        "model_path": str(vl_dir),
        "micro_batch_size": 1,
        "logprob_micro_batch_size": 1,
        "optim": {"lr": 1e-3},
    }
    single = PolicyGroup(cfg, mode="single_process")
    with PolicyGroup(cfg, world_size=2) as vl_pair:
        lp = single.compute_logprobs(batch)
        assert torch.allclose(vl_pair.compute_logprobs(batch), lp, atol=1e-5)
        batch["old_logprobs"] = lp
        m1, m2 = single.train_step(batch), vl_pair.train_step(batch)
        assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-5)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        sd1, sd2 = single.state_dict_for_export(), vl_pair.state_dict_for_export()
        after = vl_pair.compute_logprobs(batch)
    # Adam's first step is ~lr * sign(grad): weights whose gradient is ~0 amplify float noise,
    # so weights agree to lr / 10 and the updated policy's log-probs to 1e-4.
    assert all(torch.allclose(sd1[k], sd2[k], atol=1e-4) for k in sd1)
    assert torch.allclose(after, single.compute_logprobs(batch), atol=1e-4)
    assert not torch.allclose(after, lp, atol=1e-3)  # and it did learn
