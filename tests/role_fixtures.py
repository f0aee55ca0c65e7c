"""Real services and tiny models for the role-trainer tests (executor_train, planner_train, ttrl,
ttrl_streaming): memory_serve, serve and the reward server on ephemeral loopback ports, with
ScriptedChat standing in for the LLMs whose replies the tests need to control (the Executor
behind serve, the Manager's summaries, the panel judge)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from mia.http import ServerThread
from mia.llm.base import ChatResult, Message, SamplingParams
from mia.llm.scripted import ScriptedChat
from mia.trace import content_text

# The two questions of the Executor training tests, their passages and plans.
EXECUTOR_GOLD = {
    "Who founded Vorlanic Institute?": "Kaleth Morvaine",
    "Where was Ilsa Drovan born?": "Velmora",
}
EXECUTOR_PASSAGES = [
    {
        "id": "0",
        "contents": "Vorlanic Institute\nVorlanic Institute was founded by Kaleth Morvaine.",
    },
    {"id": "1", "contents": "Ilsa Drovan\nIlsa Drovan was born in Velmora in 1952."},
]
PLAN_COLUMN = "1. Search the institute.\n2. Read the founder."
PLAN_FROM_SERVICE = "1. Search the person.\n2. Read the birthplace."

_PLAN = re.compile(r"Here is a guide for your reference:\n(.*?)\nBegin your answer:", re.S)
_REPLAN = re.compile(r"I have a revised plan for you to follow:\n(.*?)\nPlease continue", re.S)


def build_tiny_model(out: Path, seed: int = 0) -> Path:
    """A random tiny Qwen2 + its offline tokenizer, saved as a Hugging Face folder."""
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2

    tok = build_tokenizer()
    return save_tiny(tiny_qwen2(tok, seed=seed), tok, out)


def plan_of(messages: list[Message]) -> str:
    """The plan the Executor was given (first user turn), '' when none."""
    for m in messages:
        if m.get("role") == "user":
            found = _PLAN.search(content_text(m.get("content")))
            return found.group(1).strip() if found else ""
    return ""


def replan_of(messages: list[Message]) -> str | None:
    for m in reversed(messages):
        if m.get("role") == "user":
            found = _REPLAN.search(content_text(m.get("content")))
            if found:
                return found.group(1).strip()
    return None


def question_of(messages: list[Message]) -> str:
    for m in messages:
        if m.get("role") == "user":
            text = content_text(m.get("content"))
            found = re.search(r"Question: (.*?)\n", text)
            return found.group(1).strip() if found else ""
    return ""


@contextlib.contextmanager
def search_service(root: Path, passages: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """local_search (BM25) over ``passages`` (``{"id", "contents"}`` rows), its corpus and index
    written under ``root``; yields the server's URL."""
    from local_search import ServeConfig, build_index, open_index
    from local_search.server import create_search_app

    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in passages))
    build_index(corpus, root / "idx", method="bm25")
    with (
        open_index(root / "idx") as index,
        ServerThread(create_search_app(index, ServeConfig())) as url,
    ):
        yield url


@contextlib.contextmanager
def memory_service(
    db: Path,
    manager: Any = None,
    planner: Any = None,
    overrides: tuple[str, ...] = (),
) -> Iterator[tuple[str, Any]]:
    """memory_serve on a real uvicorn server; ``manager`` defaults to a fixed summariser.

    Its persistence folder (``persist.allowed_root``) is the database's folder, where the tests
    keep their run folders."""
    from memory_serve.app import build_app
    from memory_serve.config import load_config
    from memory_serve.service import MemoryService
    from memory_serve.store import MemoryStore
    from mia.embedding import shared_embedder

    if manager is None:
        manager = ScriptedChat(lambda _m: "1. Search the question (question -> passage)")
    cfg = load_config(None, [f"persist.allowed_root={db.parent}", *overrides])
    store = MemoryStore(db, shared_embedder(), cfg.store)
    service = MemoryService(cfg, store, manager, planner)
    try:
        with ServerThread(build_app(service)) as url:
            yield url, service
    finally:
        store.close()


@contextlib.contextmanager
def memory_client(
    cfg: Any, store: Any, manager: Any = None, planner: Any = None, *, token: str | None = None
) -> Iterator[tuple[httpx.Client, Any]]:
    """memory_serve (``cfg``) over ``store`` on a real server and an httpx client on it (with
    ``token`` as its bearer token, when given); yields the client and the service. The store is
    closed at the end."""
    from memory_serve.app import build_app
    from memory_serve.service import MemoryService

    service = MemoryService(cfg, store, manager, planner)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with (
            ServerThread(build_app(service, token=token)) as url,
            httpx.Client(base_url=url, timeout=60, headers=headers) as client,
        ):
            yield client, service
    finally:
        store.close()


@contextlib.contextmanager
def executor_service(
    reply: Callable[[list[Message]], str], tools: Any = None, agent: dict | None = None
) -> Iterator[tuple[str, ScriptedChat]]:
    """serve with a scripted Executor LLM (``reply(messages) -> text``) and ``tools``."""
    from mia.agent import ToolSet, load_agent_config
    from serve.app import ExecutorService, create_serve_app

    backend = ScriptedChat(reply, name="executor")
    cfg = load_agent_config({"tools": {}, "max_turns": 4, **(agent or {})})
    service = ExecutorService(backend, tools if tools is not None else ToolSet([]), cfg)
    with ServerThread(create_serve_app(service)) as url:
        yield url, backend


@contextlib.contextmanager
def reward_service(db: Path, judge: Any = None, reward_fn: Any = None) -> Iterator[str]:
    from mia.judge import RuleJudge
    from mia.rewards.hooks import planner_gt_reward
    from ttrl_streaming.reward_server import GTStore, create_reward_app

    store = GTStore(db)
    app = create_reward_app(store, judge or RuleJudge(), reward_fn or planner_gt_reward)
    try:
        with ServerThread(app) as url:
            yield url
    finally:
        store.close()


class ScriptedGenerator:
    """A token generator with scripted replies (``reply(prompt_text) -> text``) over a real
    tokenizer: the trainer's rollouts become deterministic while the policy (a real tiny model)
    still trains on their exact ids. A reply without ``</tool_call>`` ends with eos."""

    name = "scripted-tokens"

    def __init__(self, tokenizer: Any, reply: Callable[[str], str]) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.max_context = None
        self.weight_version = 0
        self.tokenizer_lock = threading.Lock()
        self.prompts: list[str] = []

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        multimodal: dict[str, Any] | None = None,
    ) -> ChatResult:
        with self.tokenizer_lock:
            prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(prompt)
        text = self.reply(prompt)
        with self.tokenizer_lock:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if "</tool_call>" not in text:
            ids.append(self.eos)
        return ChatResult(
            text=text,
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            completion_tokens=len(ids),
            extra={"weight_version": self.weight_version},
        )

    generate_ids = generate

    def update_weights(self, state_dict: Any = None, path: Any = None) -> int:
        self.weight_version += 1
        return self.weight_version

    def close(self) -> None:
        return None


def one_step(run_dir: Path) -> list[str]:
    """Trainer overrides of the role-trainer tests: one step of 2 questions x 2 rollouts, in
    order, rollout errors raised, runs in ``run_dir``, no console."""
    return [
        "trainer.batch_size=2",
        "trainer.n=2",
        "trainer.total_steps=1",
        "trainer.shuffle=false",
        "trainer.rollout_errors=raise",
        f"trainer.run_dir={run_dir}",
        "trainer.logging.console=false",
        "trainer.policy.optim.lr=1e-3",
    ]


def record_rewards(trainer: Any) -> list[tuple[dict, Any, float, dict]]:
    """Wrap ``trainer.reward_fn`` so every ``(sample, trajectory, score, extras)`` it computes
    is appended to the returned list (the assertions read the real rewards)."""
    seen: list[tuple[dict, Any, float, dict]] = []
    inner = trainer.reward_fn

    async def recording(sample: dict, traj: Any) -> tuple[float, dict]:
        score, extras = await inner(sample, traj)
        seen.append((sample, traj, score, extras))
        return score, extras

    trainer.reward_fn = recording
    return seen


def scores_by_question(seen: list[tuple[dict, Any, float, dict]]) -> dict[str, list[float]]:
    """Sorted rounded scores per ``data_id``."""
    by_q: dict[str, list[float]] = {}
    for sample, _, score, _ in seen:
        by_q.setdefault(sample["data_id"], []).append(round(score, 6))
    return {k: sorted(v) for k, v in by_q.items()}
