"""A synthetic image-question task for the multimodal RL tests: read an emblem's field colour.

Each sample shows one emblem drawn by the synthetic world's own renderer
(:class:`mia.data.world_emblem.Emblem`: a coloured field, a shape of another colour, sometimes an
accent) and asks "What colour is the field of this emblem?". The answer is one of
``COLOURS`` (one or two tokens each in the tiny tokenizer), so a guess is right 1 time in 4, and only
the image tells the right one: the shape and accent colours are distractors drawn from the
whole palette::

    user:      <image> What colour is the field of this emblem?
    assistant: <answer>green</answer>

:func:`transcripts` runs the real agent loop in token mode (TokenPolicy expanding the image
pads, the images travelling with the trajectory) with a scripted engine, so warm-up data has
exactly the layout of a real rollout.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from toy_tool_task import run_scripted

from mia.agent import ExecutorLoop
from mia.agent.images import content_with_images, prepare_image
from mia.data.world_emblem import COLOURS as PALETTE
from mia.data.world_emblem import SHAPES, Emblem
from mia.llm.base import ChatResult, SamplingParams
from mia.rl.episode import AgentEpisode

COLOURS = ["red", "green", "blue", "black"]
QUESTION = "<image> What colour is the field of this emblem?"
SYSTEM = "Answer with the colour."
IMAGE_SIZE = 56  # 4x4 patches -> 4 image tokens per emblem
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def make_samples(n: int, seed: int = 0, prefix: str = "img") -> list[dict[str, Any]]:
    """``n`` emblem questions; every block of 4 consecutive samples has each field colour once,
    so an unshuffled batch of 4k samples is balanced."""
    rng = random.Random(seed)
    out = []
    block: list[str] = []
    for i in range(n):
        if not block:
            block = rng.sample(COLOURS, len(COLOURS))
        field = block.pop()
        others = [c for c in PALETTE if c != field]
        accent = rng.choice(["none", "border", "horizontal band", "vertical band"])
        emblem = Emblem(
            kind="emblem",
            field=field,
            shape=rng.choice(SHAPES),
            shape_colour=rng.choice(others),
            accent=accent,
            accent_colour="" if accent == "none" else rng.choice(others),
        )
        out.append(
            {
                "question": QUESTION,
                "images": [emblem.png(IMAGE_SIZE)],
                "colour": field,
                "data_id": f"{prefix}{i}",
            }
        )
    return out


class EmblemLoop(ExecutorLoop):
    """The Executor loop with a short prompt holding the emblem (the research prompt is long)."""

    def build_messages(self, task: Any) -> tuple[list[dict[str, Any]], list[Any]]:
        images = [prepare_image(src, self.cfg.image_size) for src in task.images]
        user = content_with_images(task.question, images, self.cfg.image_format)
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], images


AGENT_CFG = {
    "max_turns": 1,
    "max_tool_calls": 0,
    "max_replans": 0,
    "context_budget": 128,
    "answer_reserve_tokens": 8,
    "image_size": IMAGE_SIZE,
    "tools": {},
}


def make_episode() -> AgentEpisode:
    return AgentEpisode([], AGENT_CFG, loop_cls=EmblemLoop)


def reward(sample: Mapping[str, Any], traj: Any) -> tuple[float, dict[str, float]]:
    """1 when the final ``<answer>`` names the field colour; extra: an answer was given."""
    found = _ANSWER.findall(traj.final_text or "")
    answer = found[-1].strip() if found else None
    return float(answer == sample["colour"]), {"answered": float(answer is not None)}


def answer_text(colour: str) -> str:
    return f"<answer>{colour}</answer>"


class ScriptedTokens:
    """A token engine replying with fixed texts (each ends with eos). ``hf_config`` tells the
    TokenPolicy the model's vision settings (image pad id, patch and merge sizes)."""

    def __init__(self, tokenizer: Any, hf_config: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.hf_config = hf_config
        self.replies = list(replies)
        self.eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.max_context = None
        self.seen: list[dict[str, Any] | None] = []

    async def generate_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        self.seen.append(multimodal)
        text = self.replies.pop(0)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eos]
        return ChatResult(
            text=text, token_ids=ids, logprobs=[0.0] * len(ids), completion_tokens=len(ids)
        )


def transcripts(
    tokenizer: Any,
    hf_config: Any,
    samples: list[Mapping[str, Any]],
    guess: bool = False,
    seed: int = 0,
) -> list[Any]:
    """Trajectories of the real loop answering each sample: the right colour, or with ``guess``
    a random one (the format without the skill)."""
    rng = random.Random(seed)

    def engine(sample: Mapping[str, Any]) -> ScriptedTokens:
        colour = rng.choice(COLOURS) if guess else str(sample["colour"])
        return ScriptedTokens(tokenizer, hf_config, [answer_text(colour)])

    return run_scripted(make_episode(), samples, engine)
