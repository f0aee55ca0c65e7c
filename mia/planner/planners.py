"""The Planners the flow can run (:class:`mia.planner.flow.Planner`).

- :class:`ConversationPlanner` — the Planner as ONE conversation (plan, then the reflection turn,
  then the replan turn) over an agent policy: :class:`mia.agent.TokenPolicy` (token-exact, the
  trainable policy of Planner GRPO and TTRL) or :class:`mia.agent.ChatPolicy` (any chat
  backend: memory_serve's planner routes, each one step of it; in-process runs).
- :class:`RemotePlanner` — memory_serve's ``/plan``, ``/judge_replan`` and ``/replan`` (each
  one :class:`ConversationPlanner` step server-side): evaluation's ``plan_only`` and ``mia``.
- :class:`NoPlanner` — no plan, no reflection (``none``).
- :class:`GuidePlanner` — the retrieved memory context itself is the guide (``rag``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from mia.agent import Trajectory
from mia.embedding import question_names
from mia.errors import MiaError
from mia.llm.base import SamplingParams
from mia.planner.flow import PlannerRun
from mia.prompts import manager as manager_text
from mia.prompts import planner as planner_text
from mia.services import MemoryClient, RequestFailed

# Segment kinds of the Planner's injected turns (token view).
JUDGE_TURN = "judge_prompt"
REPLAN_TURN = "replan_prompt"
IMAGE_VARIANTS = ("auto", "text", "image")
R = TypeVar("R")


@dataclass
class TurnLimits:
    """Token limits of a :class:`ConversationPlanner`'s turns."""

    max_context: int = field(
        default=32768, metadata={"help": "tokens of the whole planner conversation"}
    )
    plan_max_tokens: int = field(default=1024, metadata={"help": "tokens of the plan turn"})
    decision_max_tokens: int = field(
        default=256, metadata={"help": "tokens of the yes/no reflection turn"}
    )
    replan_max_tokens: int = field(
        default=512, metadata={"help": "tokens of the supplementary plan turn"}
    )
    min_generation_tokens: int = field(
        default=8, metadata={"help": "a turn that cannot get this many tokens ends the flow"}
    )

    def validate(self) -> TurnLimits:
        if min(self.plan_max_tokens, self.decision_max_tokens, self.replan_max_tokens) < 1:
            raise MiaError("the planner's *_max_tokens limits must be >= 1")
        return self


_MEMORY_QUESTION = re.compile(r"^- Question: (.*)$", re.MULTILINE)
_MEMORY_EXPECTED = re.compile(
    "^" + re.escape(manager_text.EXPECTED_LINE.split("{answer}")[0]) + "(.*)$", re.MULTILINE
)
# What the rag guide says in place of a remembered entity or expected answer (redact_remembered).
REDACTED_ENTITY = "[entity]"
REDACTED_ANSWER = "[answer]"


def _phrase(text: str, any_case: bool = True) -> str:
    """A pattern of ``text`` as a whole phrase (not inside a longer word)."""
    return rf"(?<!\w)({'?i:' if any_case else '?:'}{re.escape(text)})(?!\w)"


def remembered(question: str, memory_context: str) -> tuple[list[str], list[str]]:
    r"""What the memory context remembers that ``question`` does not hold: the entity names of
    its memories' questions (the ``- Question:`` lines; :func:`mia.embedding.question_names`)
    that ``question`` lacks, and its failures' expected answers (the ``- Expected Answer:``
    lines, :data:`mia.prompts.manager.EXPECTED_LINE`) that ``question`` does not contain as a
    whole phrase (any case). Strings of three characters or fewer are left out: a plan's
    numbering and small words hold them by chance.

    >>> ctx = "- Question: How old is Pstad?\n- Expected Answer: 1603\n"
    >>> remembered("How old is Lirford?", ctx)
    (['Pstad'], ['1603'])
    """
    names: set[str] = set()
    for line in _MEMORY_QUESTION.findall(memory_context):
        names.update(n for n in question_names(line) if len(n) > 3 and n not in question)
    answers = {a.strip() for a in _MEMORY_EXPECTED.findall(memory_context)}
    answers = {a for a in answers if len(a) > 3 and not re.search(_phrase(a), question)}
    return sorted(names), sorted(answers)


def leaked_entities(plan: str, question: str, memory_context: str) -> list[str]:
    r"""What ``plan`` copies from the retrieved memories that ``question`` lacks
    (:func:`remembered`): a remembered question's entity name (a plan written about that
    entity instead of the one asked) or a remembered failure's expected answer (as a whole
    phrase, any case: another question's answer handed to this one). Sorted, each once.

    >>> ctx = "[Example 1]\n- Judgement: incorrect\n- Question: How old is Pstad?\n"
    >>> leaked_entities("1. Search for 'Pstad age'.", "How old is Lirford?", ctx)
    ['Pstad']
    >>> leaked_entities("1. Search for 'Lirford founded'.", "How old is Lirford?", ctx)
    []
    >>> ctx += "- Expected Answer: 1603\n"
    >>> leaked_entities("1. Check that it is 1603.", "How old is Lirford?", ctx)
    ['1603']
    """
    names, answers = remembered(question, memory_context)
    hits = {n for n in names if n in plan}
    hits |= {a for a in answers if re.search(_phrase(a), plan)}
    return sorted(hits)


def redact_remembered(text: str, question: str, memory_context: str | None = None) -> str:
    r"""``text`` with every remembered entity name and expected answer that ``question`` lacks
    (:func:`remembered` of ``memory_context``, by default ``text`` itself) replaced, as a whole
    phrase, by :data:`REDACTED_ENTITY` / :data:`REDACTED_ANSWER` (names as written, answers in
    any case; a string that is both is an answer; longer strings first, so a name inside a
    longer one is not cut apart). What ``rag``'s guide becomes under
    ``memory.drop_leaked_plans`` (:class:`GuidePlanner`).

    >>> ctx = "- Question: How old is Pstad?\n- Expected Answer: 1603\n"
    >>> print(redact_remembered(ctx, "How old is Lirford?"), end="")
    - Question: How old is [entity]?
    - Expected Answer: [answer]
    """
    names, answers = remembered(question, text if memory_context is None else memory_context)
    if not names and not answers:
        return text
    label = {n.casefold(): REDACTED_ENTITY for n in names}
    label |= {a.casefold(): REDACTED_ANSWER for a in answers}
    strings = sorted({*names, *answers}, key=lambda s: (-len(s), s))
    pattern = "|".join(_phrase(s, any_case=s in answers) for s in strings)
    return re.sub(pattern, lambda m: label[m.group(0).casefold()], text)


def image_prompt(run: PlannerRun, variant: str) -> bool:
    """The plan prompt's variant: ``auto`` = the image prompt iff the question has a caption."""
    if variant != "auto":
        return variant == "image"
    return planner_text.is_image_question(run.task.image_caption, run.task.modality)


async def retrieve(
    memory: MemoryClient | None, run: PlannerRun, top_k: int | None
) -> tuple[str, list[int]]:
    """The task's memories: given with the task, else ``/memory``, else none."""
    t = run.task
    if t.memory_context:
        return t.memory_context, list(t.memory_ids or [])
    if memory is None:
        return planner_text.EMPTY_MEMORY, []
    out = await memory.memory(
        t.question, image_caption=t.image_caption, data_id=t.data_id, top_k=top_k
    )
    return out.context, [*out.positive_ids, *out.negative_ids]


class EmptyReply(MiaError):
    """The Planner gave nothing usable for a step (empty, only ``<think>``, no yes/no) in
    ``attempts`` tries; ``text`` is its last reply."""

    def __init__(self, what: str, attempts: int, text: str) -> None:
        super().__init__(f"no {what} in {attempts} attempt(s) (reply {text[:200]!r})")
        self.what = what
        self.attempts = attempts
        self.text = text


def _answer(text: str) -> str | None:
    return planner_text.text_after_think(text) or None


class ConversationPlanner:
    """The Planner's three turns in one conversation over an agent ``policy``.

    ``memory``: memory_serve, asked for a task's memories when the task brings none.
    ``sampling``: the turns' sampling parameters (each capped by its limit and by the room left
    in ``limits.max_context``).
    ``empty_retries``: None takes every reply as it is (training: the reward judges it); a
    number asks again that many times when a reply holds no plan or no yes/no, then raises
    :class:`EmptyReply` (serving; chat policies only, whose retries leave no trace).
    """

    reflects = True

    def __init__(
        self,
        policy: Any,
        sampling: SamplingParams | None = None,
        *,
        limits: TurnLimits | None = None,
        memory: MemoryClient | None = None,
        memory_top_k: int | None = None,
        image_variant: str = "auto",
        name: str = "planner",
        empty_retries: int | None = None,
    ) -> None:
        if image_variant not in IMAGE_VARIANTS:
            raise MiaError(f"image_variant must be one of {IMAGE_VARIANTS}")
        if empty_retries is not None and policy.token_exact:
            raise MiaError("empty_retries needs a chat policy (a token trajectory keeps samples)")
        self.empty_retries = empty_retries
        self.policy = policy
        self.sampling = sampling or policy.default_params()
        self.limits = (limits or TurnLimits()).validate()
        self.memory = memory
        self.memory_top_k = memory_top_k
        self.image_variant = image_variant
        self.name = name

    # ---- the conversation
    def _room(self, traj: Trajectory) -> int:
        budget = self.limits.max_context
        if self.policy.max_context:
            budget = min(budget, int(self.policy.max_context))
        return budget - self.policy.context_tokens(traj)

    async def _say(
        self, traj: Trajectory, cap: int, what: str, read: Callable[[str], Any]
    ) -> str | None:
        """One Planner generation (mask 1); None when the context has no room left. With
        ``empty_retries``, a reply that ``read`` finds nothing in is asked for again."""
        room = self._room(traj)
        if room < self.limits.min_generation_tokens:
            return None
        params = replace(self.sampling, max_tokens=max(1, min(cap, room)))
        attempts = 1 + (self.empty_retries or 0)
        segments, context = len(traj.segments), traj.state.get("chat_context")
        for _ in range(attempts):
            gen = await self.policy.generate(traj, params)
            if self.empty_retries is None or read(gen.text) is not None:
                traj.messages.append({"role": "assistant", "content": gen.text})
                return gen.text
            del traj.segments[segments:]  # forget the empty reply (chat policy: no tokens)
            traj.state["chat_context"] = context
        raise EmptyReply(what, attempts, gen.text)

    def _inject(self, traj: Trajectory, message: dict[str, Any], kind: str) -> bool:
        """Append a user turn (mask 0) if it leaves room for an answer."""
        injection = self.policy.prepare(traj, [message], kind)
        if self._room(traj) - injection.n_tokens < self.limits.min_generation_tokens:
            return False
        self.policy.commit(traj, injection)
        traj.messages.append(message)
        return True

    async def start(self, run: PlannerRun, messages: list[dict[str, Any]]) -> Trajectory:
        """Open the conversation (a fresh plan prompt, or a past conversation to continue)."""
        conv = Trajectory(question=run.question, data_id=run.data_id, messages=messages)
        run.conversation = conv
        run.messages = conv.messages
        await self.policy.begin(conv)
        return conv

    # ---- the steps
    async def plan(self, run: PlannerRun) -> bool:
        run.memory_context, run.memory_ids = await retrieve(self.memory, run, self.memory_top_k)
        messages = planner_text.plan_messages(
            run.memory_context, run.question, image=image_prompt(run, self.image_variant)
        )
        conv = await self.start(run, messages)
        text = await self._say(conv, self.limits.plan_max_tokens, "plan", _answer)
        if text is None:
            return False
        run.planner = self.name
        run.plan_raw, run.plan = text, planner_text.text_after_think(text)
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:
        conv = run.conversation
        if not self._inject(conv, planner_text.judge_turn(trace), JUDGE_TURN):
            return False
        text = await self._say(
            conv,
            self.limits.decision_max_tokens,
            "yes/no decision",
            planner_text.parse_decision_strict,
        )
        if text is None:
            return False
        run.decision_raw, run.need_replan = text, planner_text.parse_decision(text)
        return True

    async def replan(self, run: PlannerRun, memory: str | None = None) -> bool:
        conv = run.conversation
        if not self._inject(conv, planner_text.replan_turn(run.question, memory), REPLAN_TURN):
            return False
        text = await self._say(conv, self.limits.replan_max_tokens, "revised plan", _answer)
        if text is None:
            return False
        run.replan_raw, run.replan = text, planner_text.text_after_think(text)
        return True


class RemotePlanner:
    """The Planner behind memory_serve: ``/plan`` (memories retrieved there), ``/judge_replan``,
    ``/replan``. ``top_k``: memories per kind for the plan (0: none, the ``plan_only`` mode;
    None: the service's default); ``replan_top_k``: for the replan (0, as the reference).
    ``require_memory``: no plan when memory holds nothing similar (the Executor then answers
    alone and nothing is reflected on, as in ``none``); ``require_failure``: likewise when it
    holds no failed similar question (memories that show only successes say the Executor
    answers such questions alone); both are ``/plan``'s ``plan_if``, decided on the one
    retrieval of that request. ``drop_leaked``: a plan that names a retrieved memory's entity
    or a remembered failure's expected answer the question lacks (:func:`leaked_entities`) is
    dropped: the Executor answers alone, the plan is noted in ``run.planner_errors``."""

    reflects = True

    def __init__(
        self,
        memory: MemoryClient,
        top_k: int | None = None,
        replan_top_k: int = 0,
        *,
        skip_empty: bool = False,
        require_memory: bool = False,
        require_failure: bool = False,
        drop_leaked: bool = False,
    ) -> None:
        self.memory = memory
        self.top_k = top_k
        self.replan_top_k = replan_top_k
        self.skip_empty = skip_empty
        self.require_memory = require_memory and top_k != 0
        self.require_failure = require_failure and top_k != 0
        self.drop_leaked = drop_leaked
        self.name = "remote"

    async def _step(self, run: PlannerRun, call: Awaitable[R]) -> R | None:
        """A route's answer; with ``skip_empty``, None when the Planner LLM gave nothing usable
        (``502 llm_empty``: no plan, no yes/no), recorded in ``run.planner_errors`` (a greedy
        model would say nothing again)."""
        try:
            return await call
        except RequestFailed as err:
            if not self.skip_empty or err.code != "llm_empty":
                raise
            run.planner_errors.append(" ".join(str(err).split()))
            return None

    async def plan(self, run: PlannerRun) -> bool:
        t = run.task
        # One request: memory_serve retrieves once and writes no plan when the gate says so.
        plan_if = "failure" if self.require_failure else "memory" if self.require_memory else None
        out = await self._step(
            run,
            self.memory.plan(
                t.question,
                image_caption=t.image_caption,
                data_id=t.data_id,
                top_k=self.top_k,
                plan_if=plan_if,
            ),
        )
        if out is None or out.planner == "none":  # the Executor goes without a guide
            return True
        run.plan, run.messages = out.plan, list(out.messages)
        run.plan_raw = _last_reply(run.messages, run.plan)
        run.memory_ids = list(out.memory_ids)
        run.memory_context = out.context
        run.planner = out.planner
        if self.drop_leaked and (
            leaked := leaked_entities(run.plan, t.question, run.memory_context)
        ):
            # The Executor goes without it, as in none.
            run.planner_errors.append(
                f"plan dropped: it names {', '.join(leaked)} of a memory, not of the question: "
                + " ".join(run.plan.split())[:300]
            )
            run.plan, run.plan_raw, run.messages, run.memory_ids = "", "", [], []
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:
        if not run.messages:  # no plan conversation to reflect in
            return True
        out = await self._step(run, self.memory.judge_replan(trace, run.messages, run.memory_ids))
        if out is None:
            return True
        run.messages = list(out.messages)
        # ``need_replan`` is the reference's "yes"/"no" text; the boolean is ``replan_needed``.
        run.need_replan = out.replan_needed
        run.decision_raw = _last_reply(run.messages, out.decision)
        return True

    async def replan(self, run: PlannerRun) -> bool:
        t = run.task
        out = await self._step(
            run,
            self.memory.replan(
                t.question,
                run.messages,
                image_caption=t.image_caption,
                data_id=t.data_id,
                top_k=self.replan_top_k,
            ),
        )
        if out is None:
            return True
        run.messages = list(out.messages)
        run.replan = out.replan
        run.replan_raw = _last_reply(run.messages, run.replan)
        return True


def _last_reply(messages: list[Mapping[str, Any]], default: str) -> str:
    if messages and messages[-1].get("role") == "assistant":
        return str(messages[-1].get("content") or "")
    return default


class NoPlanner:
    """No plan and no reflection: the Executor alone (``none``)."""

    name = "none"
    reflects = False

    async def plan(self, run: PlannerRun) -> bool:
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:  # never called
        return False

    async def replan(self, run: PlannerRun) -> bool:  # never called
        return False


class GuidePlanner(NoPlanner):
    """The retrieved memories themselves are the guide (``rag``): ``/memory``'s context text
    goes where a plan would; an empty memory gives no guide at all (the first question runs as
    ``none``). ``redact_leaked`` (``memory.drop_leaked_plans``, as a ``mia`` plan is dropped):
    the guide hands the Executor no remembered entity or expected answer the question lacks;
    each is replaced throughout the context by ``[entity]`` / ``[answer]``
    (:func:`redact_remembered`), so the memories still show how similar questions were
    researched but not about whom, nor what the answer was. ``run.memory_context`` keeps the
    context as retrieved."""

    name = "rag"

    def __init__(
        self, memory: MemoryClient, top_k: int | None = None, *, redact_leaked: bool = False
    ) -> None:
        self.memory = memory
        self.top_k = top_k
        self.redact_leaked = redact_leaked

    async def plan(self, run: PlannerRun) -> bool:
        context, ids = await retrieve(self.memory, run, self.top_k)
        run.memory_ids = ids
        run.memory_context = context if ids else ""
        run.plan = run.memory_context
        if self.redact_leaked and run.plan:
            run.plan = redact_remembered(run.plan, run.question)
        return True


def limits_from(cfg: Mapping[str, Any] | Any) -> TurnLimits:
    """The :class:`TurnLimits` fields of a larger config (mapping or dataclass)."""
    get = cfg.get if isinstance(cfg, Mapping) else lambda k, d=None: getattr(cfg, k, d)
    names = [f.name for f in fields(TurnLimits)]
    return TurnLimits(**{n: get(n) for n in names if get(n) is not None})
