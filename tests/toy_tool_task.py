"""A synthetic multi-turn tool task for trainer tests and benchmarks.

Each sample asks for the secret of a key. The model must call the ``lookup`` tool (a
:class:`mia.agent.Tool` registered as ``toy_lookup``; it knows the current question by its
``data_id``) and copy the word it returns into ``<answer>``::

    user:      What is the secret of key 4?
    assistant: <tool_call>{"name": "lookup", "arguments": {}}</tool_call>
    user:      <tool_response>river\nriver\n...</tool_response>
    assistant: <answer>river</answer>

Secrets are drawn per sample (the same key has different secrets in different samples), so the
answer cannot be memorised: it has to come from the tool; a guess is right 1 time in 8. Every
secret is one token of the tiny tokenizer wherever it appears, and the tool writes it 8 times:
both make copying learnable by a 2-layer model in tens of supervised steps rather than
hundreds. The tool takes no argument: copying the key too was not learned in hundreds of steps.

:func:`gold_transcripts` runs the real agent loop with a scripted engine that replies with the
gold turns (or, with ``guess``, answers at once with a random secret), so warm-up data has
exactly the token layout of a real rollout.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mia.agent import ExecutorLoop, Tool, ToolArgumentError, ToolContext, ToolOutput
from mia.agent import register_tool as _register_tool
from mia.agent.tools import TOOL_TYPES
from mia.llm.base import ChatResult, SamplingParams
from mia.rl.episode import AgentEpisode, Rollout, collate

SECRETS = ["river", "book", "year", "capital", "picture", "height", "title", "judge"]
KEYS = [str(d) for d in range(10)]
SYSTEM = "Use the lookup tool."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def make_samples(n: int, seed: int = 0, prefix: str = "s") -> list[dict[str, Any]]:
    """``n`` questions; every block of ``len(SECRETS)`` consecutive samples uses each secret
    once (in a shuffled order), so an unshuffled batch of 8 is balanced: a policy gradient step
    on it cannot just favour whichever words happened to be rewarded in that batch."""
    rng = random.Random(seed)
    out = []
    block: list[str] = []
    for i in range(n):
        if not block:
            block = rng.sample(SECRETS, len(SECRETS))
        key, secret = rng.choice(KEYS), block.pop()
        out.append(
            {
                "question": f"What is the secret of key {key}?",
                "key": key,
                "secret": secret,
                "data_id": f"{prefix}{i}",
            }
        )
    return out


def secret_table(samples: list[Mapping[str, Any]]) -> dict[str, list[str]]:
    """data_id -> [key, secret]: what the lookup tool knows."""
    return {str(s["data_id"]): [str(s["key"]), str(s["secret"])] for s in samples}


class LookupTool(Tool):
    """``lookup()`` -> the secret stored for the current question (found by ``data_id``),
    written ``repeat`` times, one per line."""

    name = "lookup"
    description = "Look up the secret of the key in the question."
    parameters = {"type": "object", "properties": {}}

    def __init__(self, table: Mapping[str, Any], repeat: int = 8) -> None:
        self.table = {str(k): (str(v[0]), str(v[1])) for k, v in table.items()}
        self.repeat = repeat

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if args:
            raise ToolArgumentError(f"lookup takes no arguments, got {sorted(args)}")
        entry = self.table.get(str(ctx.data_id))
        if entry is None:
            raise ToolArgumentError(f"no secret for question {ctx.data_id!r}")
        return ToolOutput("\n".join([entry[1]] * self.repeat))


if "toy_lookup" not in TOOL_TYPES:
    _register_tool("toy_lookup")(LookupTool)


class ToyLoop(ExecutorLoop):
    """The Executor loop with a short prompt (the full research prompt is ~500 tokens)."""

    def build_messages(self, task: Any) -> tuple[list[dict[str, Any]], list[Any]]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.question},
        ], []


AGENT_CFG = {
    "max_turns": 3,
    "max_tool_calls": 2,
    "max_replans": 0,
    "context_budget": 256,
    "answer_reserve_tokens": 16,
    "tools": {},
}


def make_episode(samples: list[Mapping[str, Any]]) -> AgentEpisode:
    """An AgentEpisode whose lookup tool (built through the registry) knows ``samples``."""
    tools = {"lookup": {"type": "toy_lookup", "params": {"table": secret_table(samples)}}}
    return AgentEpisode(tools, AGENT_CFG, loop_cls=ToyLoop)


def reward(sample: Mapping[str, Any], traj: Any) -> tuple[float, dict[str, float]]:
    """1 when the final ``<answer>`` is the secret; extras: a valid lookup call, an answer."""
    found = _ANSWER.findall(traj.final_text or "")
    answer = found[-1].strip() if found else None
    tool_ok = any(c.ok for c in traj.tool_calls)
    correct = answer == sample["secret"]
    return float(correct), {"tool_ok": float(tool_ok), "answered": float(answer is not None)}


def call_text() -> str:
    body = json.dumps({"name": "lookup", "arguments": {}})
    return f"<tool_call>\n{body}\n</tool_call>"


def answer_text(word: str) -> str:
    return f"<answer>{word}</answer>"


class ScriptedTokens:
    """A token engine that replies with fixed texts, in order, tokenised like a real model's
    output: a tool call stops at ``</tool_call>`` (no eos), a final turn ends with eos."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.max_context = None

    async def generate_ids(self, prompt_ids: list[int], params: SamplingParams) -> ChatResult:
        text = self.replies.pop(0)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if "<tool_call>" not in text:
            ids.append(self.eos)
        return ChatResult(
            text=text, token_ids=ids, logprobs=[0.0] * len(ids), completion_tokens=len(ids)
        )


def gold_transcripts(
    tokenizer: Any, samples: list[Mapping[str, Any]], guess: bool = False, seed: int = 0
) -> list[Any]:
    """Transcripts produced by the real loop (exact token layout): the gold behaviour (call
    lookup, copy its word), or with ``guess`` the shortcut (answer at once with a random
    secret, no tool call)."""
    rng = random.Random(seed)

    def engine(sample: Mapping[str, Any]) -> ScriptedTokens:
        if guess:
            return ScriptedTokens(tokenizer, [answer_text(rng.choice(SECRETS))])
        return ScriptedTokens(tokenizer, [call_text(), answer_text(sample["secret"])])

    return run_scripted(make_episode(samples), samples, engine)


def run_scripted(
    episode: AgentEpisode,
    samples: list[Mapping[str, Any]],
    engine: Callable[[Mapping[str, Any]], Any],
) -> list[Any]:
    """The trajectories of ``episode`` on each sample in turn, generated by ``engine(sample)``."""

    async def all_of_them() -> list[Any]:
        return [
            await episode.run(s, Rollout(generator=engine(s), sampling=SamplingParams()))
            for s in samples
        ]

    return asyncio.run(all_of_them())


def sft_batch(tokenizer: Any, trajectories: list[Any]) -> dict[str, Any]:
    """A policy batch (response_mask = the assistant's tokens) for ``PolicyModel.sft_step``."""
    return collate(trajectories, int(tokenizer.pad_token_id))


def step_config(model_dir: Path, run_dir: Path, **workers: Any) -> dict[str, Any]:
    """A Trainer config for one GRPO step of 2 questions x 2 rollouts on a tiny model, without
    checkpoints or console output; ``workers`` overrides the single-process workers."""
    return {
        "model_path": str(model_dir),
        "run_dir": str(run_dir),
        "seed": 7,
        "batch_size": 2,
        "n": 2,
        "total_steps": 1,
        "sampling": {"temperature": 1.0, "max_tokens": 6},
        "policy": {"micro_batch_size": 8, "optim": {"lr": 1e-2}},
        "workers": {"mode": "single_process", **workers},
        "generator": {"max_batch_size": 16},
        "logging": {"console": False},
        "log_rollouts": 0,
        "save_freq": -1,
        "skip_tied_steps": False,
    }


def learning_config(root: Path, *, total_steps: int, max_tokens: int, lr: float) -> dict[str, Any]:
    """The Trainer config of the learning tests: the warm-started model in ``root/warm``, runs
    in ``root/run``, 8 questions in order x 8 rollouts per step, one process, no checkpoints
    or console output."""
    return {
        "model_path": str(root / "warm"),
        "run_dir": str(root / "run"),
        "seed": 0,
        "batch_size": 8,
        "n": 8,
        "shuffle": False,
        "total_steps": total_steps,
        "sampling": {"temperature": 1.0, "max_tokens": max_tokens},
        "policy": {
            "micro_batch_size": 64,
            "logprob_micro_batch_size": 64,
            "optim": {"lr": lr, "weight_decay": 0.0},
        },
        "workers": {"mode": "single_process"},
        "generator": {"max_batch_size": 64},
        "save_freq": -1,
        "logging": {"console": False},
    }
