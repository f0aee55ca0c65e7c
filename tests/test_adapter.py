"""Delta adapters (mia.models.adapter): a LoRA-style low-rank change of a model is recovered
from the merged folder and the base, stored small, and rebuilds the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mia.errors import MiaError
from mia.models.adapter import apply_adapter, extract_adapter, main, read_adapter


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    tok = build_tokenizer()
    return save_tiny(tiny_qwen2(tok, seed=0), tok, tmp_path_factory.mktemp("base") / "m")


def _tuned(base: Path, out: Path, ranks: tuple[int, ...], seed: int = 0) -> dict[str, torch.Tensor]:
    """A copy of ``base`` whose q/v projections of layer 1 move by a sum of LoRA products."""
    import shutil

    shutil.copytree(base, out)
    w = load_file(str(base / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    changed = {}
    for name in list(w):
        if ".layers.1." in name and name.endswith(("q_proj.weight", "v_proj.weight")):
            delta = (
                sum(
                    torch.randn(w[name].shape[0], r, generator=g)
                    @ torch.randn(r, w[name].shape[1], generator=g)
                    for r in ranks
                )
                * 1e-2
            )
            w[name] = (w[name].float() + delta).to(w[name].dtype)
            changed[name] = w[name]
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return changed


def test_extract_and_apply_rebuild_the_tuned_weights(base: Path, tmp_path: Path) -> None:
    changed = _tuned(base, tmp_path / "tuned", ranks=(2, 3))  # two stacked LoRAs: rank 5
    rep = extract_adapter(base, tmp_path / "tuned", tmp_path / "a.safetensors", rank=5,
                          dtype="float32", metadata={"recipe_key": "abc"})  # fmt: skip
    assert rep["matrices"] == len(changed) == 2 and rep["max_rel_error"] < 1e-6
    tensors, meta = read_adapter(tmp_path / "a.safetensors")
    assert meta["recipe_key"] == "abc" and meta["rank"] == "5"
    assert {k.rsplit("@", 1)[0] for k in tensors} == set(changed)
    out = apply_adapter(base, tmp_path / "a.safetensors", tmp_path / "rebuilt")
    rebuilt, tuned = (
        load_file(str(out / "model.safetensors")),
        load_file(str(tmp_path / "tuned" / "model.safetensors")),
    )
    for name, value in tuned.items():
        assert rebuilt[name].dtype == torch.float32
        assert torch.allclose(rebuilt[name], value.float(), atol=1e-4), name
    assert (out / "tokenizer.json").is_file() and (out / "adapter.json").is_file()
    # too small a rank loses part of the change, and says so
    low = extract_adapter(base, tmp_path / "tuned", tmp_path / "low.safetensors", rank=2)
    assert low["max_rel_error"] > 0.05 and low["bytes"] < rep["bytes"]


def test_float16_adapter_is_close_and_errors_are_clear(base: Path, tmp_path: Path) -> None:
    _tuned(base, tmp_path / "tuned", ranks=(4,))
    extract_adapter(base, tmp_path / "tuned", tmp_path / "a.safetensors", rank=4)
    out = apply_adapter(base, tmp_path / "a.safetensors", tmp_path / "rebuilt")
    rebuilt = load_file(str(out / "model.safetensors"))
    tuned = load_file(str(tmp_path / "tuned" / "model.safetensors"))
    assert all(torch.allclose(rebuilt[k], v.float(), atol=1e-3) for k, v in tuned.items())
    other = _tuned(base, tmp_path / "other", ranks=(1,), seed=1)
    assert other
    with pytest.raises(MiaError, match="another base model"):
        apply_adapter(tmp_path / "other", tmp_path / "a.safetensors", tmp_path / "x")
    with pytest.raises(MiaError, match="equal the base"):
        extract_adapter(base, base, tmp_path / "b.safetensors", rank=2)
    with pytest.raises(SystemExit) as err:
        main(["info", str(tmp_path / "nope.safetensors")])
    assert err.value.code == 2
