"""Replaying gold programs (:mod:`mia.apps.gold`) through the real loop: a local_search server
on the world's index, the agent's real tools, and a :class:`mia.llm.scripted.ScriptedChat` whose
replies are the program's turns, so ``Trajectory.messages`` is what training and serving see;
and the checks a replay must pass to be gold.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Generator
from contextlib import ExitStack
from copy import deepcopy
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mia.apps.gold_records import GoldExample, GoldReport, GoldSkip, Message, Skipped
from mia.errors import MiaError
from mia.trace import content_text

if TYPE_CHECKING:
    from local_search import Retriever
    from mia.agent import AgentConfig, Trajectory
    from mia.data.world import Question, World

Program = Generator[str, str, None]  # yields assistant turns, receives observation texts


class Writer(Protocol):
    """What a replay needs of :class:`mia.apps.gold.GoldWriter`."""

    variant_use: Counter[int]

    def plan(self, q: Question) -> str: ...

    def program(self, q: Question) -> Program: ...

    def planner_chats(
        self, q: Question, plan: str, trace: str
    ) -> tuple[list[Message], list[Message]]: ...


class _Script:
    """``ScriptedChat`` reply function driving a program: the first call starts it, every later
    call sends it the text of the last message (the observation)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.started = False

    def __call__(self, messages: list[Message]) -> str:
        if not self.started:
            self.started = True
            return next(self.program)
        try:
            return self.program.send(content_text(messages[-1].get("content")))
        except StopIteration:
            raise GoldSkip("the loop asked for a turn after the final answer") from None


def validate_replay(traj: Trajectory, q: Question) -> None:
    """Raise :class:`GoldSkip` unless the replay is a clean, correct trajectory."""
    from mia.agent import check_format
    from mia.judge.rules import RuleJudge

    if traj.stop_reason != "answer":
        raise GoldSkip(f"the replay stopped with {traj.stop_reason!r}")
    bad = [r for r in traj.tool_calls if not (r.ok and r.strict_json and not r.repaired)]
    if bad or traj.tool_errors:
        detail = bad[0].error if bad else traj.tool_errors[0]
        raise GoldSkip(f"a tool call failed in the replay: {detail}")
    check = check_format(traj.assistant_texts())
    if not check.ok:
        raise GoldSkip(f"the replay breaks the format rules: {'; '.join(check.issues)}")
    verdict = RuleJudge(mode="em").grade_sync(q.question, traj.answer, q.answers)
    if not verdict.correct:
        raise GoldSkip(f"the replayed answer {traj.answer!r} is not {q.answer!r}")


def _tools_config(cfg: AgentConfig, search_url: str, cache_root: Path | None) -> dict[str, Any]:
    tools = deepcopy(dict(cfg.tools))
    search = tools.get("search")
    if not search or search.get("type") != "search":
        raise MiaError("gold: the agent config needs a 'search' tool of type search")
    params = search.setdefault("params", {})
    if params.get("backend", "local") != "local":
        raise MiaError("gold: the search tool must use backend: local (the world's index)")
    params["url"] = search_url
    params.pop("token", None)
    image = tools.get("web_image_to_image_search")
    if image and cache_root is not None:
        image.setdefault("params", {})["cache_roots"] = [str(cache_root)]
    return tools


def corpus_sha256(world: World) -> str:
    """The sha256 of the world's ``corpus.jsonl`` as :meth:`World.write` writes it."""
    from mia.data.world_io import corpus_lines

    h = hashlib.sha256()
    for line in corpus_lines(world):
        h.update(line.encode())
    return h.hexdigest()


def gets_plan(question_id: str, with_plan: bool | str) -> bool:
    """Whether a question's Executor prompt carries the gold plan. ``"alternate"``: a stable
    function of the id (crc32 parity), so about half of each type get one."""
    if with_plan == "alternate":
        return zlib.crc32(question_id.encode("utf-8")) % 2 == 0
    return bool(with_plan)


def replay_gold(
    world: World,
    index: str | os.PathLike[str] | Retriever,
    questions: list[Question],
    image_cache_root: str | os.PathLike[str] | None,
    writer_for: Callable[[Retriever, int], Writer],
    *,
    agent_config: AgentConfig | None,
    with_plan: bool | str,
    progress: bool | Callable[[int, int], None],
) -> GoldReport:
    """Replay each question's program (``writer_for(retriever, topk)`` writes them) through
    the real loop on ``index`` (a folder or an opened retriever of THIS world's corpus, checked
    by sha256), with the world's image cache (written to a temporary folder when
    ``image_cache_root`` is None and a question needs it); see
    :func:`mia.apps.gold.generate_gold`."""
    from local_search import open_index

    with ExitStack() as stack:
        if isinstance(index, str | os.PathLike):
            retriever = open_index(index)
            stack.callback(retriever.close)
        else:
            retriever = index
        want = corpus_sha256(world)
        if retriever.manifest.corpus_sha256 != want:
            raise MiaError(
                f"gold: the index {retriever.index_dir} was built from another corpus "
                f"(sha256 {retriever.manifest.corpus_sha256[:12]}..., this world's corpus.jsonl "
                f"is {want[:12]}...): build it from the world's corpus.jsonl"
            )
        cache_root = Path(image_cache_root) if image_cache_root is not None else None
        if cache_root is None and any(q.type == "image" for q in questions):
            from mia.data.world_io import _write_cache

            cache_root = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "image_cache"
            _write_cache(world, cache_root, show=False)
        elif cache_root is not None and not cache_root.is_dir():
            raise MiaError(f"gold: image cache folder not found: {cache_root}")
        return asyncio.run(
            _replay_all(
                retriever, questions, cache_root, agent_config, with_plan, progress, writer_for
            )
        )


async def _replay_all(
    retriever: Retriever,
    questions: list[Question],
    cache_root: Path | None,
    agent_config: AgentConfig | None,
    with_plan: bool | str,
    progress: bool | Callable[[int, int], None],
    writer_for: Callable[[Retriever, int], Writer],
) -> GoldReport:
    from local_search import ServeConfig
    from local_search.server import create_search_app
    from mia.agent import AgentConfig, build_tools
    from mia.http import ServerThread

    cfg = (agent_config or AgentConfig()).validate()
    topk = int(cfg.tools.get("search", {}).get("params", {}).get("topk", 3))
    serve = ServeConfig(default_topk=topk, max_topk=max(100, topk))
    report = GoldReport()
    writer = writer_for(retriever, topk)
    with ServerThread(create_search_app(retriever, serve)) as url:
        cfg = replace(cfg, tools=_tools_config(cfg, url, cache_root))
        tools = build_tools(cfg.tools)
        try:
            for done, q in enumerate(_progress(questions, progress), 1):
                try:
                    report.examples.append(
                        await _replay_one(writer, q, tools, cfg, gets_plan(q.id, with_plan))
                    )
                except GoldSkip as why:
                    report.skipped.append(Skipped(q.id, q.type, q.relation, str(why)))
                if callable(progress):
                    progress(done, len(questions))
        finally:
            await tools.aclose()
    report.variant_use = dict(sorted(writer.variant_use.items()))
    return report


def _progress(questions: list[Question], progress: bool | Callable[[int, int], None]) -> Any:
    if progress is True:
        from tqdm import tqdm

        return tqdm(questions, desc="gold", unit="q")
    return questions


async def _replay_one(
    writer: Writer,
    q: Question,
    tools: Any,
    cfg: AgentConfig,
    with_plan: bool,
) -> GoldExample:
    from mia.agent import ChatPolicy, ExecutorLoop
    from mia.llm.scripted import ScriptedChat

    plan = writer.plan(q)
    loop = ExecutorLoop(ChatPolicy(ScriptedChat(_Script(writer.program(q)))), tools, cfg)
    task = {
        "question": q.question,
        "images": [q.image_png] if q.image_png else [],
        "plan": plan if with_plan else None,
        "data_id": q.id,
        "image_caption": q.image_caption or None,
    }
    traj = await loop.run(task)
    validate_replay(traj, q)
    planner, reflection = writer.planner_chats(q, plan, traj.trace)
    return GoldExample(
        id=q.id,
        type=q.type,
        relation=q.relation,
        split=q.split,
        question=q.question,
        answer=q.answer,
        plan=plan,
        messages=traj.messages,
        planner_messages=planner,
        reflection_messages=reflection,
    )
