"""The Executor loop: exact transcripts with scripted replies and a real local_search server;
token-in/token-out consistency with a tiny Qwen2 on the in-process engine."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from role_fixtures import search_service

from mia.agent import (
    AgentConfig,
    ChatPolicy,
    ExecutorLoop,
    ReplanLimitError,
    SearchTool,
    TokenPolicy,
    Tool,
    ToolContext,
    ToolOutput,
    ToolSet,
    build_tools,
    protocol,
)
from mia.agent.images import to_data_url
from mia.errors import MiaError
from mia.http import ServerThread, bind_socket
from mia.llm.base import ChatResult, SamplingParams
from mia.llm.scripted import ScriptedChat
from mia.prompts import executor as prompts
from mia.vision import ImageError

PASSAGES = [
    (
        "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
    ),
    ("Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("Marie Curie", "Marie Curie was a physicist who won two Nobel Prizes."),
    ("Tokyo", "Tokyo is the capital of Japan and its most populous city."),
    ("Amazon River", "The Amazon River in South America carries more water than any other."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
]


def call(name: str, args: dict[str, Any], think: str = "search") -> str:
    body = json.dumps({"name": name, "arguments": args})
    return f"<think>{think}</think>\n<tool_call>\n{body}\n</tool_call>"


def search_call(*queries: str) -> str:
    return call("search", {"query_list": list(queries)})


@pytest.fixture(scope="module")
def search_url(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    rows = [{"id": f"d{i}", "contents": f"{t}\n{x}"} for i, (t, x) in enumerate(PASSAGES)]
    with search_service(tmp_path_factory.mktemp("search"), rows) as url:
        yield url


@pytest.fixture
def dead_url() -> str:
    sock = bind_socket("127.0.0.1", 0)  # bound, never listening: connections are refused
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


class Fixed(Tool):
    """A tool with a fixed reply (exact observation texts)."""

    description = "Returns a fixed text."

    def __init__(self, name: str, text: str = "", delay: float = 0.0, fail: bool = False) -> None:
        self.name, self.text, self.delay, self.fail = name, text, delay, fail

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("boom")
        return ToolOutput(self.text)


def make_loop(replies: list[str], tools: Any = (), **cfg: Any) -> tuple[ExecutorLoop, ScriptedChat]:
    chat = ScriptedChat(replies)
    return ExecutorLoop(ChatPolicy(chat), tools, AgentConfig(**cfg)), chat


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---------------------------------------------------------------------------- chat policy


def test_search_then_answer_against_real_local_search(search_url: str) -> None:
    tools = build_tools({"search": {"type": "search", "params": {"url": search_url, "topk": 2}}})
    loop, chat = make_loop(
        [
            search_call("Eiffel Tower completed", "capital of Japan") + " extra text",
            "<answer>1889</answer>",
        ],
        tools,
    )
    traj = run(loop.run({"question": "When was the Eiffel Tower completed?", "plan": "1. search"}))
    system, user, a1, obs, a2 = traj.messages
    assert system == {
        "role": "system",
        "content": prompts.system_prompt([tools.get("search").schema()]),
    }
    assert user == {
        "role": "user",
        "content": prompts.USER_PROMPT_TEXT.format(question="When was the Eiffel Tower completed?")
        + "\nHere is a guide for your reference:\n1. search\nBegin your answer:\n",
    }
    assert a1 == {
        "role": "assistant",
        "content": search_call("Eiffel Tower completed", "capital of Japan"),
    }
    assert obs["content"] == (
        "<tool_response>\nDoc 1(Title: Eiffel Tower) " + PASSAGES[0][1] + "\n=======\n"
        "Doc 1(Title: Tokyo) " + PASSAGES[3][1] + "\n</tool_response>"
    )  # BM25 returns matching passages only: one each here
    assert obs["role"] == "user" and a2 == {"role": "assistant", "content": "<answer>1889</answer>"}
    assert (traj.answer, traj.stop_reason, traj.turns, traj.forced_answer) == (
        "1889",
        "answer",
        2,
        False,
    )
    assert [(s.kind, s.mask) for s in traj.segments] == [
        ("assistant", 1),
        ("observation", 0),
        ("assistant", 1),
    ]
    assert traj.response_ids is None  # text backend: no token view
    # The LLM saw exactly the conversation so far, with the configured stop strings.
    assert chat.calls[1]["messages"] == traj.messages[:4]
    assert chat.calls[0]["params"].stop == ["</tool_call>", "<tool_response>"]
    record = traj.tool_calls[0]
    assert (record.name, record.ok, record.arguments, record.strict_json) == (
        "search",
        True,
        {"query_list": ["Eiffel Tower completed", "capital of Japan"]},
        True,
    )
    assert traj.tool_errors == [] and not traj.tool_error
    assert traj.trace.startswith(
        "### Question: When was the Eiffel Tower completed?\n\n### Round 1:\n"
    )


def test_web_search_backend_through_the_gateway(tmp_path: Path) -> None:
    from fake_serper import FakeSerper

    from web_tools.config import WebToolsConfig
    from web_tools.server import build_app

    fake = FakeSerper()
    with ServerThread(fake.app) as serper:
        settings = WebToolsConfig(
            serper_url=f"{serper}/search", cache_path="none", rate_limit_qps=0.0
        )
        with ServerThread(build_app(settings, serper_key="k")) as gateway:
            tools = build_tools(
                {
                    "search": {
                        "type": "search",
                        "params": {"backend": "web", "url": gateway, "topk": 2},
                    }
                }
            )
            loop, _ = make_loop([search_call("red bridge"), "<answer>x</answer>"], tools)
            traj = run(loop.run({"question": "q"}))
    assert traj.messages[3]["content"] == (
        "<tool_response>\n"
        "Doc 1(Title: red bridge - result 1) Snippet 1 about red bridge. "
        "(source: https://example.com/red-bridge/1)\n"
        "Doc 2(Title: red bridge - result 2) Snippet 2 about red bridge. "
        "(source: https://example.com/red-bridge/2)\n"
        "</tool_response>"
    )
    assert traj.tool_errors == [] and len(fake.calls) == 1


def test_tool_output_is_truncated_in_the_middle() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    loop, _ = make_loop(
        [call("fixed", {}), "<answer>x</answer>"], [Fixed("fixed", text)], tool_output_max_chars=40
    )
    traj = run(loop.run({"question": "q"}))
    assert traj.messages[3]["content"] == (
        "<tool_response>\n" + text[:20] + "...(truncated)..." + text[-20:] + "\n</tool_response>"
    )
    assert traj.tool_calls[0].result_chars == 40 + len("...(truncated)...")


def test_replan_drops_the_answer_and_continues(search_url: str) -> None:
    tools = build_tools({"search": {"type": "search", "params": {"url": search_url, "topk": 1}}})
    loop, chat = make_loop(
        [
            "<think>I guess</think>\n<answer>Lyon</answer>",
            search_call("Eiffel Tower"),
            "<think>found it</think><answer>Paris</answer>",
        ],
        tools,
    )
    traj = run(loop.run({"question": "Where is the Eiffel Tower?", "plan": "answer"}))
    assert (traj.answer, traj.replanned) == ("Lyon", False)
    out = run(loop.continue_with_plan(traj, "1. search for the tower\n2. answer"))
    assert out is traj
    msgs = traj.messages
    assert msgs[2] == {"role": "assistant", "content": "<think>I guess</think>\n"}
    assert msgs[3] == {
        "role": "user",
        "content": "\nI have a revised plan for you to follow:\n1. search for the tower\n2. answer\n"
        "Please continue with this updated guidance:\n",
    }
    assert chat.calls[1]["messages"] == msgs[:4]
    assert msgs[5]["content"] == (
        "<tool_response>\nDoc 1(Title: Eiffel Tower) " + PASSAGES[0][1] + "\n</tool_response>"
    )
    assert (traj.answer, traj.first_answer, traj.replanned, traj.turns) == (
        "Paris",
        "Lyon",
        True,
        3,
    )
    assert [a.answer for a in traj.attempts] == ["Lyon", "Paris"]
    assert [a.start_message for a in traj.attempts] == [1, 3]
    assert traj.tool_calls[0].attempt == 1 and traj.replan.startswith("1. search")
    assert [s.kind for s in traj.segments] == [
        "assistant",
        "replan",
        "assistant",
        "observation",
        "assistant",
    ]
    assert traj.attempt_trace(-1).startswith(
        "### Question: Where is the Eiffel Tower?\n\n#### Revised Plan:\n"
        "I have a revised plan for you to follow:"
    )
    assert "### Round 2:" in traj.attempt_trace(-1) and "### Round 1:" not in traj.attempt_trace(-1)
    with pytest.raises(ReplanLimitError, match="already replanned 1 time"):
        run(loop.continue_with_plan(traj, "again"))


def test_context_budget_forces_an_answer_turn() -> None:
    loop, chat = make_loop(
        [call("fixed", {}), "<answer>best guess</answer>"],
        [Fixed("fixed", "x" * 6000)],
        context_budget=1500,
        answer_reserve_tokens=0,
    )
    traj = run(loop.run({"question": "q"}))
    assert traj.messages[3] == {"role": "user", "content": prompts.ANSWER_NOW_PROMPT}
    assert (traj.answer, traj.stop_reason, traj.forced_answer) == ("best guess", "answer", True)
    assert [s.kind for s in traj.segments] == ["assistant", "answer_now", "assistant"]
    assert len(traj.tool_calls) == 1  # the tool ran; its result did not fit
    # max_tokens of each call is clipped to the context left
    assert chat.calls[0]["params"].max_tokens <= 1500


def test_replan_that_does_not_fit_is_skipped() -> None:
    loop, _ = make_loop(["<answer>a</answer>"], context_budget=800, answer_reserve_tokens=0)
    traj = run(loop.run({"question": "q"}))
    before = [dict(m) for m in traj.messages]
    out = run(loop.continue_with_plan(traj, "x" * 3000))
    assert out.messages == before and out.answer == "a" and not out.replanned
    assert out.state["replan_skipped"] == "context_budget"


def test_max_tool_calls_then_answer_now() -> None:
    loop, _ = make_loop(
        [call("fixed", {}), call("fixed", {}), "<answer>y</answer>"],
        [Fixed("fixed", "r")],
        max_tool_calls=1,
    )
    traj = run(loop.run({"question": "q"}))
    roles = [(m["role"], m["content"]) for m in traj.messages[2:]]
    assert roles == [
        ("assistant", call("fixed", {})),
        ("user", "<tool_response>\nr\n</tool_response>"),
        ("assistant", call("fixed", {})),
        ("user", prompts.ANSWER_NOW_PROMPT),
        ("assistant", "<answer>y</answer>"),
    ]
    assert len(traj.tool_calls) == 1 and traj.forced_answer and traj.answer == "y"


def test_tool_call_after_answer_now_ends_without_answer() -> None:
    loop, _ = make_loop(
        [call("fixed", {}), call("fixed", {})], [Fixed("fixed", "r")], max_tool_calls=0
    )
    traj = run(loop.run({"question": "q"}))
    assert (traj.stop_reason, traj.answer, traj.turns) == ("tool_call_after_answer_now", "", 2)


def test_max_turns_limit() -> None:
    loop, _ = make_loop([call("fixed", {})] * 5, [Fixed("fixed", "r")], max_turns=2)
    traj = run(loop.run({"question": "q"}))
    assert (traj.stop_reason, traj.answer, traj.turns, len(traj.tool_calls)) == (
        "max_turns",
        "",
        2,
        1,
    )
    assert traj.messages[-1]["role"] == "assistant"


def test_invalid_calls_become_exact_error_observations() -> None:
    loop, _ = make_loop(
        [
            call("calculator", {"x": 1}),
            "<tool_call>search for it</tool_call>",
            call("search", {"query_list": []}),
            call("web_image_to_image_search", {"img_idx": "0"}),  # text question: not offered
            "<answer>z</answer>",
        ],
        [SearchTool(url="http://127.0.0.1:1"), Fixed("web_image_to_image_search", "")],
    )
    loop.tools.get("web_image_to_image_search").needs_image = True
    traj = run(loop.run({"question": "q"}))
    obs = [m["content"] for m in traj.messages[3::2]]
    assert obs == [
        protocol.format_tool_response('Error: unknown tool "calculator". Available tools: search.'),
        protocol.format_tool_response(
            protocol.malformed_json_error("Expecting value at line 1 column 1")
        ),
        protocol.format_tool_response(
            'Error: invalid arguments for search: "query_list" must be a non-empty list of strings'
        ),
        protocol.format_tool_response(
            'Error: unknown tool "web_image_to_image_search". Available tools: search.'
        ),
    ]
    assert [c.error_kind for c in traj.tool_calls] == [
        "unknown_tool",
        "malformed_json",
        "bad_arguments",
        "unknown_tool",
    ]
    assert [c.name for c in traj.tool_calls] == [
        "calculator",
        None,
        "search",
        "web_image_to_image_search",
    ]
    assert traj.tool_errors == [] and not traj.tool_error  # the model's mistakes, not outages
    assert traj.answer == "z"


def test_tool_server_down_timeout_and_crash_are_observations(dead_url: str) -> None:
    loop, _ = make_loop(
        [search_call("x"), call("slow", {}), call("crash", {}), "<answer>n/a</answer>"],
        [SearchTool(url=dead_url), Fixed("slow", delay=5), Fixed("crash", fail=True)],
        tool_timeout_s=0.2,
    )
    traj = run(loop.run({"question": "q"}))
    down, slow, crash = (m["content"] for m in traj.messages[3:8:2])
    assert down.startswith(
        f"<tool_response>\nError: search service unavailable: {dead_url}: Connect"
    )
    assert slow == "<tool_response>\nError: tool slow timed out after 0.2 s.\n</tool_response>"
    assert (
        crash == "<tool_response>\nError: tool crash failed: RuntimeError: boom\n</tool_response>"
    )
    assert [c.error_kind for c in traj.tool_calls] == ["service", "timeout", "internal"]
    assert traj.tool_error and len(traj.tool_errors) == 3
    assert traj.tool_errors[0].startswith(f"search: search service unavailable: {dead_url}")
    assert traj.tool_errors[1] == "slow: tool slow timed out after 0.2 s."
    assert traj.answer == "n/a"


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), color).save(buf, format="PNG")
    return buf.getvalue()


def test_image_question_and_image_search_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "q7"
    cache.mkdir(parents=True)
    (cache / "meta.json").write_text(
        json.dumps({"search_results": [{"title": "Red square"}, {"title": "Lost picture"}]})
    )
    Image.new("RGB", (10, 10), (255, 0, 0)).save(cache / "img_000.png")  # img_001 is missing
    tools = build_tools(
        {
            "web_image_to_image_search": {
                "type": "web_image_to_image_search",
                "params": {"cache_roots": [str(tmp_path / "cache")], "image_size": 16},
            }
        }
    )
    image_call = call("web_image_to_image_search", {"img_idx": "0"}, think="look")
    loop, chat = make_loop([image_call, image_call, "<answer>red</answer>"], tools, image_size=32)
    traj = run(
        loop.run({"question": "What colour?", "images": [_png((0, 0, 255))], "data_id": "q7"})
    )
    user = traj.messages[1]["content"]
    assert [p["type"] for p in user] == ["text", "image_url", "text"]
    assert user[0]["text"].endswith("\nQuestion: ") and user[2]["text"].startswith(
        "\nWhat colour?\n"
    )
    assert user[1]["image_url"]["url"] == to_data_url(traj.images[0])
    assert traj.images[0].size == (32, 32) and traj.images[0].getpixel((0, 0)) == (0, 0, 255)
    obs = traj.messages[3]["content"]
    assert [p.get("text") for p in obs if p["type"] == "text"] == [
        "<tool_response>\n1. title: Red square ",
        "\n2. title: Lost picture (image unavailable)\n</tool_response>",
    ]
    assert traj.images[1].size == (16, 16) and len(traj.images) == 2
    assert traj.messages[5]["content"] == protocol.format_tool_response(
        "Error: web_image_to_image_search can be called only once per question."
    )
    assert [c.error_kind for c in traj.tool_calls] == [None, "limit"]
    assert traj.tool_errors == [] and traj.answer == "red"
    assert "web_image_to_image_search" in traj.messages[0]["content"]
    # the backend received the image parts as data URLs
    assert chat.calls[0]["messages"][1]["content"][1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )


def test_missing_question_image_is_a_clear_error(tmp_path: Path) -> None:
    loop, _ = make_loop(["<answer>x</answer>"])
    with pytest.raises(ImageError, match="image file not found"):
        run(loop.run({"question": "q", "images": [str(tmp_path / "nope.png")]}))
    with pytest.raises(MiaError, match="question is empty"):
        run(loop.run({"question": "  "}))


class Pictures(Tool):
    """A user tool that returns images without placing <image> placeholders."""

    name = "pictures"

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(
            "two pictures", images=[Image.new("RGB", (4, 4)), Image.new("RGB", (4, 4))]
        )


def test_tool_images_without_placeholders_are_appended() -> None:
    loop, _ = make_loop([call("pictures", {}), "<answer>ok</answer>"], [Pictures()])
    traj = run(loop.run({"question": "q"}))
    parts = traj.messages[3]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert [p["text"] for p in parts if p["type"] == "text"] == [
        "<tool_response>\ntwo pictures\n",
        "\n",
        "\n</tool_response>",
    ]
    assert len(traj.images) == 2 and traj.answer == "ok"


def test_image_search_without_data_id_is_flagged() -> None:
    tools = build_tools(
        {"img": {"type": "web_image_to_image_search", "params": {"cache_roots": []}}}
    )
    loop, _ = make_loop([call("img", {"img_idx": "0"}), "<answer>a</answer>"], tools)
    traj = run(loop.run({"question": "q", "images": [_png((1, 2, 3))]}))
    assert traj.tool_errors == ["img: image search unavailable: the question has no data_id"]


# ---------------------------------------------------------------------------- token policy


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    from mia.llm.local_backend import LocalChat
    from mia.models.tiny import build_tokenizer, tiny_qwen2

    tok = build_tokenizer()
    model = tiny_qwen2(tok, seed=1)
    chat = LocalChat(model=model, tokenizer=tok, max_batch_size=4, batch_wait_ms=1)
    yield tok, model, chat
    chat._engine.close()


def _forward_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 by one full forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [0.0] + [float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]


def _check_tokens(traj: Any, tok: Any, model: Any, generated: list[list[int]]) -> None:
    ids = traj.input_ids
    mask = traj.response_mask
    resp = traj.response_ids
    assert len(mask) == len(resp) == len(traj.rollout_logprobs)
    # decode(prompt + response) is the rendered conversation (the final "\n" follows the eot)
    rendered = tok.apply_chat_template(traj.messages, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False) + "\n" == rendered
    assert tok.decode(traj.prompt_ids, skip_special_tokens=False) == traj.prompt_text
    # mask-1 runs are exactly the tokens the engine generated (cut runs are their prefixes)
    runs, cur = [], []
    for t, m in zip(resp, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs, cur = [*runs, cur], []
    if cur:
        runs.append(cur)
    assert len(runs) == len(generated)
    for run_ids, gen in zip(runs, generated, strict=True):
        assert gen[: len(run_ids)] == run_ids
    # rollout logprobs match a fresh forward pass on mask-1 tokens
    ref = _forward_logprobs(model, ids)[len(traj.prompt_ids) :]
    diffs = [abs(a - b) for a, b, m in zip(ref, traj.rollout_logprobs, mask, strict=True) if m]
    assert diffs and max(diffs) < 1e-4
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, mask, strict=True) if not m)


class Recording:
    """Wraps the engine to record what each generate_ids call produced."""

    def __init__(self, chat: Any) -> None:
        self.chat = chat
        self.tokenizer = chat.tokenizer
        self.tokenizer_lock = chat.tokenizer_lock
        self.records: list[tuple[list[int], list[int]]] = []

    async def generate_ids(self, prompt_ids: list[int], params: SamplingParams) -> ChatResult:
        res = await self.chat.generate_ids(prompt_ids, params)
        self.records.append((list(prompt_ids), list(res.token_ids)))
        return res

    def generated_for(self, traj: Any) -> list[list[int]]:
        n = len(traj.prompt_ids)
        return [gen for prompt, gen in self.records if prompt[:n] == traj.prompt_ids]


def test_token_policy_with_the_local_engine(tiny: Any) -> None:
    tok, model, chat = tiny
    engine = Recording(chat)
    cfg = AgentConfig(sampling={"temperature": 1.0, "seed": 7, "max_tokens": 12, "logprobs": True})
    loop = ExecutorLoop(TokenPolicy(engine), [], cfg)
    traj = run(loop.run({"question": "Who wrote The Old Bridge?", "plan": "1. search"}))
    assert traj.token_mode and traj.turns == 1 and traj.stop_reason == "length"
    traj = run(loop.continue_with_plan(traj, "search again"))
    assert traj.turns == 2 and traj.replanned
    # max_tokens reached both times: the end-of-turn token is injected (mask 0)
    assert [(s.kind, s.mask, len(s.token_ids)) for s in traj.segments] == [
        ("assistant", 1, 12),
        ("eot", 0, 1),
        ("replan", 0, len(traj.segments[2].token_ids)),
        ("assistant", 1, 12),
        ("eot", 0, 1),
    ]
    assert traj.segments[1].text == "<|im_end|>"
    _check_tokens(traj, tok, model, engine.generated_for(traj))


def test_concurrent_token_rollouts_are_independent(tiny: Any) -> None:
    tok, model, chat = tiny
    engine = Recording(chat)
    cfg = AgentConfig(sampling={"temperature": 1.0, "seed": 3, "max_tokens": 10})
    loop = ExecutorLoop(TokenPolicy(engine), [], cfg)

    async def rollouts() -> list[Any]:
        trajs = await asyncio.gather(*(loop.run({"question": f"Question {i}?"}) for i in range(3)))
        return list(
            await asyncio.gather(
                *(loop.continue_with_plan(t, f"plan {i}") for i, t in enumerate(trajs))
            )
        )

    for traj in run(rollouts()):
        # >= 2: random weights may sample a (failing) tool call, which costs one more turn
        assert traj.turns >= 2 and traj.replanned
        _check_tokens(traj, tok, model, engine.generated_for(traj))
    assert chat.stats["max_batch"] >= 2  # the engine batched concurrent rollouts


class Forced:
    """An id-level engine that emits scripted texts (+ eos) with the tiny model's logprobs."""

    def __init__(self, chat: Any, model: Any, texts: list[str]) -> None:
        self.tokenizer = chat.tokenizer
        self.tokenizer_lock = chat.tokenizer_lock
        self.model = model
        self.texts = list(texts)
        self.generated: list[list[int]] = []
        self.prompts: list[list[int]] = []

    async def generate_ids(self, prompt_ids: list[int], params: SamplingParams) -> ChatResult:
        text = self.texts.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        lps = _forward_logprobs(self.model, list(prompt_ids) + ids)[len(prompt_ids) :]
        self.generated.append(ids)
        self.prompts.append(list(prompt_ids))
        return ChatResult(text=text, token_ids=ids, logprobs=lps, finish_reason="stop")


@pytest.mark.parametrize("role", ["user", "tool"])
def test_token_policy_observations_replan_and_cuts(tiny: Any, role: str) -> None:
    tok, model, chat = tiny
    engine = Forced(
        chat,
        model,
        [
            search_call("tower") + "\nignored tail",  # cut after </tool_call>
            "<think>hmm</think> <tool_response>fake",  # cut before the stop string
            "<think>so</think>\n<answer>Lyon</answer>",
            "<answer>Paris</answer>",
        ],
    )
    tools = ToolSet([Fixed("search", "Doc 1(Title: Tower) The tower is in Paris.")])
    loop = ExecutorLoop(TokenPolicy(engine), tools, AgentConfig(observation_role=role))
    traj = run(loop.run({"question": "Where is the tower?"}))
    assert traj.messages[2]["content"] == search_call("tower")
    assert traj.messages[4]["content"] == "<think>hmm</think> "
    assert traj.answer == "<think>hmm</think>"
    # the fake tool response was cut: that turn is final, its answer is extracted from text
    assert traj.stop_reason == "answer" and traj.turns == 2
    traj = run(loop.continue_with_plan(traj, "check"))
    assert traj.stop_reason == "answer" and traj.answer == "Lyon"
    kinds = [s.kind for s in traj.segments]
    assert kinds == [
        "assistant", "eot", "observation", "assistant", "eot", "replan", "assistant",
    ]  # fmt: skip
    _check_tokens(traj, tok, model, engine.generated[:3])
    # each generation continued exactly the running ids
    assert engine.prompts[1] == traj.input_ids[: len(engine.prompts[1])]
    obs_text = traj.segments[2].text
    assert obs_text.startswith("\n<|im_start|>user\n<tool_response>\nDoc 1(Title: Tower)")
    assert obs_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_token_policy_replan_trims_tokens_at_answer(tiny: Any) -> None:
    tok, model, chat = tiny
    engine = Forced(
        chat, model, ["<think>guess</think>\n<answer>Lyon</answer>", "<answer>Paris</answer>"]
    )
    loop = ExecutorLoop(TokenPolicy(engine), [], AgentConfig())
    traj = run(loop.run({"question": "Where is the tower?"}))
    first = traj.segments[0]
    assert first.token_ids == engine.generated[0] and first.mask == 1  # eos generated: no eot
    assert [s.kind for s in traj.segments] == ["assistant"]
    traj = run(loop.continue_with_plan(traj, "check"))
    assert traj.messages[2]["content"] == "<think>guess</think>\n"
    assert [s.kind for s in traj.segments] == ["assistant", "eot", "replan", "assistant"]
    assert traj.segments[0].token_ids == engine.generated[0][: len(traj.segments[0].token_ids)]
    assert traj.answer == "Paris" and traj.first_answer == "Lyon"
    _check_tokens(traj, tok, model, engine.generated)


def test_token_policy_refuses_images(tiny: Any) -> None:
    _, _, chat = tiny
    loop = ExecutorLoop(TokenPolicy(chat), [], AgentConfig())
    with pytest.raises(MiaError, match="this engine.s model takes no images"):
        run(loop.run({"question": "q", "images": [_png((0, 0, 0))]}))


def test_a_task_samples_only_when_it_says_so() -> None:
    """An ExecutorTask's temperature and seed sample its run (serve's /execute passes them); a
    plain mapping never does, so a dataset row with a "seed" column cannot pin the n rollouts
    of a GRPO group to one sample."""
    from mia.agent.loop import ExecutorTask

    loop, chat = make_loop(["<answer>a</answer>"] * 3)
    run(loop.run({"question": "q?", "seed": 3, "temperature": 1.0}))
    run(loop.run(ExecutorTask(question="q?", temperature=0.7, seed=11)))
    run(loop.run(ExecutorTask(question="q?")))
    assert [(c["params"].temperature, c["params"].seed) for c in chat.calls] == [
        (0.0, None),
        (0.7, 11),
        (0.0, None),
    ]
