"""Tiny Qwen2 / Qwen2.5-VL models and a Qwen-like tokenizer, built offline, for tests.

Nothing here touches the hub. The tokenizer is a byte-level BPE trained by the ``tokenizers``
library on a small built-in corpus with Qwen's pre-tokenizer regex and special tokens, so code
that works with it works with the real Qwen tokenizers:

- ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) and the vision tokens are special;
- ``<tool_call>`` / ``</tool_call>`` are single non-special added tokens, as in Qwen2.5(-VL);
- ``<think>``, ``<answer>``, ``<tool_response>`` and their closers are ordinary text split into
  a few BPE pieces, again as in Qwen2.5(-VL). Code must therefore detect them in decoded text
  (stop strings), never by a single token id.

Models are random-initialised from a seed (deterministic) and small enough to build, save, load,
generate and train in well under a second per step on a CPU. Text models use head_dim 32
because vLLM's CPU backend refuses head_dim 16.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia.models.chat_template import chatml_template

if TYPE_CHECKING:
    from transformers import (
        PretrainedConfig,
        PreTrainedModel,
        PreTrainedTokenizerFast,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2ForCausalLM,
    )

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Added but not special: kept by decode(skip_special_tokens=True), exactly like Qwen2.5.
ADDED_TOKENS = ["<tool_call>", "</tool_call>"]
AGENT_TAGS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
]
DEFAULT_SYSTEM = "You are a helpful assistant."
VOCAB_TARGET = 1536
MAX_LENGTH = 32768

# Qwen2's pre-tokenizer split: digits one by one, letters in runs, punctuation runs.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_PROSE = """\
The agent answers hard questions by searching. It thinks first, then calls a tool, reads the
result and thinks again until it can answer. A good plan breaks the question into small steps:
find the entity, look up the fact, check the date, compare the numbers and give a short answer.
Memory keeps what worked before and what failed, so the planner can reuse a good workflow.
The manager compresses every finished trajectory into a numbered list of steps. The judge
compares the answer with the ground truth and says whether it is correct or incorrect.
Search returns passages from a local wiki or the web. Each passage has a title and some text.
The image shows a red bridge over a river in a city with old buildings and a blue sky.
Who wrote the book? When was the company founded? Where is the mountain? How tall is the tower?
Which river flows through the capital? What is the population of the country in the year 2020?
The answer is yes. The answer is no. I am not sure, so I will search again with a better query.
Please follow the plan step by step and put the final answer inside the answer tags.
"""

_WORDS_TEXT = """\
the a an of to in and or is was are were be been has have had it its this that these those
with from by on at for as not no yes what which who whom whose when where why how many much
first second third last next step plan question answer search query result results tool call
image picture photo video text title passage document page source web wiki memory workflow
think reflect replan correct incorrect true false score reward judge manager planner executor
name arguments content role system user assistant function type object string number list
city country river mountain bridge tower museum university company book film song album
year month day date born died founded located population height length area capital
red green blue black white large small old new high low long short left right north south
"""
_WORDS = _WORDS_TEXT.split()

_QUERIES = [
    "capital of France",
    "population of Tokyo 2020",
    "who wrote The Old Bridge",
    "height of the north tower",
    "river through the capital city",
    "year the company was founded",
]


def _corpus() -> list[str]:
    """A deterministic corpus: prose, word lists, numbers, JSON tool calls and agent tags."""
    lines = _PROSE.splitlines()
    lines += [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 12)]
    lines += [" ".join(w.capitalize() for w in _WORDS[i : i + 8]) for i in range(0, len(_WORDS), 8)]
    lines += [
        f"In {1900 + i} the value was {i * 37 % 1000}.{i % 10} and {i * i}" for i in range(60)
    ]
    for i, query in enumerate(_QUERIES):
        args = {"query": query, "top_k": 1 + i % 5}
        call = json.dumps({"name": "search", "arguments": args})
        lines += [
            f"<think>I need to search for {query}.</think>",
            f"<tool_call>\n{call}\n</tool_call>",
            f"<tool_response>\n[{i}] Title {i}: {query} is described here.\n</tool_response>",
            f"<think>The passage says the answer.</think>\n<answer>{query.split()[-1]}</answer>",
            json.dumps({"id": i, "title": query, "score": round(0.5 + i / 20, 2), "ok": True}),
            json.dumps(
                [{"role": "user", "content": query}, {"role": "assistant", "content": None}]
            ),
        ]
    # Repeat so that pair counts reach min_frequency everywhere; order is fixed, so training is too.
    return list(itertools.chain.from_iterable(itertools.repeat(lines, 3)))


@functools.cache
def _tokenizer_json(extra: tuple[str, ...] = (), vocab_size: int = VOCAB_TARGET) -> str:
    """Train the BPE once per process and arguments (~0.2 s) and return its serialised form.
    ``extra``: more training text (e.g. a synthetic world's passages and prompts, so tests on
    that text get short sequences)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() + list(extra), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tok.to_str()


def build_tokenizer(
    out_dir: Path | None = None,
    padding_side: str = "left",
    *,
    extra_corpus: Sequence[str] = (),
    vocab_size: int = VOCAB_TARGET,
) -> PreTrainedTokenizerFast:
    """A fresh Qwen-like tokenizer (deterministic); saved to ``out_dir`` when given.

    ``padding_side`` goes to the constructor: in transformers 5 setting it afterwards is not saved.
    ``extra_corpus`` / ``vocab_size``: train on more text with a larger vocabulary.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(tuple(extra_corpus), vocab_size)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=SPECIAL_TOKENS[3:],
        padding_side=padding_side,
        model_max_length=MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        chat_template=chatml_template(DEFAULT_SYSTEM, vision=True),
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def _token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks Qwen special tokens {missing}")
    return ids


def _text_defaults(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    ids = _token_ids(tokenizer)
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,  # head_dim 32: the smallest vLLM's CPU backend accepts
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
    }


def tiny_qwen2_config(tokenizer: PreTrainedTokenizerFast, **overrides: Any) -> PretrainedConfig:
    """A ``Qwen2Config`` for a ~0.5M-parameter model; ``overrides`` replace any field."""
    from transformers import Qwen2Config

    return Qwen2Config(**{**_text_defaults(tokenizer), **overrides})


def _init_seeded(model_cls: type, config: PretrainedConfig, seed: int) -> PreTrainedModel:
    import torch

    # Seed, build, then restore: the caller's global RNG stream is left as it was.
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = model_cls(config)
    finally:
        torch.random.set_rng_state(state)
    _fix_generation_config(model, config)
    return model.eval()


def _fix_generation_config(model: PreTrainedModel, config: PretrainedConfig) -> None:
    text = config.get_text_config()
    gen = model.generation_config
    gen.bos_token_id = text.bos_token_id
    gen.eos_token_id = text.eos_token_id
    gen.pad_token_id = text.pad_token_id


def tiny_qwen2(
    tokenizer: PreTrainedTokenizerFast | None = None, seed: int = 0, **overrides: Any
) -> Qwen2ForCausalLM:
    """A random tiny ``Qwen2ForCausalLM``; the same seed and overrides give the same weights."""
    from transformers import Qwen2ForCausalLM

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    return _init_seeded(Qwen2ForCausalLM, tiny_qwen2_config(tokenizer, **overrides), seed)


def tiny_qwen25vl_config(tokenizer: PreTrainedTokenizerFast, **overrides: Any) -> PretrainedConfig:
    """A ``Qwen2_5_VLConfig`` with a 2-block vision tower and a tiny text model.

    ``overrides`` replace text/top-level fields; ``vision_config={...}`` is merged into the
    vision defaults. ``mrope_section`` must sum to head_dim / 2 (16 here).
    """
    from transformers import Qwen2_5_VLConfig

    ids = _token_ids(tokenizer)
    top = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    text = _text_defaults(tokenizer)
    top["tie_word_embeddings"] = text.pop("tie_word_embeddings")
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
    }
    for key, value in overrides.items():
        if key == "vision_config":
            vision.update(value)
        elif key == "text_config":
            text.update(value)
        elif key in top:
            top[key] = value
        else:
            text[key] = value
    vision.setdefault("out_hidden_size", text["hidden_size"])
    if "rope_parameters" not in text:
        # Qwen splits the rotary half-dim 1:1.5:1.5 over (time, height, width): 64 -> 16/24/24.
        half = text["hidden_size"] // text["num_attention_heads"] // 2
        t = half // 4
        h = (half - t) // 2
        section = [t, h, half - t - h]
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": section,
        }
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **top)


def tiny_qwen25vl(
    tokenizer: PreTrainedTokenizerFast | None = None, seed: int = 0, **overrides: Any
) -> Qwen2_5_VLForConditionalGeneration:
    """A random tiny ``Qwen2_5_VLForConditionalGeneration`` (deterministic from ``seed``)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    config = tiny_qwen25vl_config(tokenizer, **overrides)
    return _init_seeded(Qwen2_5_VLForConditionalGeneration, config, seed)


def save_tiny(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    processor: Any | None = None,
) -> Path:
    """Save a folder that ``AutoModelForCausalLM`` / ``AutoModelForImageTextToText`` and vLLM load.

    Vision models also get a ``preprocessor_config.json`` (Qwen2-VL image processor settings):
    ``processor.save_pretrained`` when one is given, otherwise the defaults of
    :mod:`mia.vision`.
    """
    from mia.vision import image_processor_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if processor is not None:
        processor.save_pretrained(str(out))
    elif getattr(model.config, "vision_config", None) is not None:
        vision = model.config.vision_config
        cfg = image_processor_config(
            patch_size=vision.patch_size,
            temporal_patch_size=vision.temporal_patch_size,
            merge_size=vision.spatial_merge_size,
        )
        (out / "preprocessor_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
