"""The Executor service: exact payloads over a real uvicorn server with a real local_search
backend, 4xx cases, outages, and ``python -m serve`` as a subprocess."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from role_fixtures import search_service

from mia.agent import AgentConfig, build_tools
from mia.agent.images import to_data_url
from mia.http import ServerThread, bind_socket, wait_for_port_file
from mia.llm.scripted import ScriptedChat
from mia.prompts import executor as prompts
from mia.prompts.planner import judge_prompt
from mia.trace import content_text, format_trace
from serve import ExecutorService, create_serve_app, load_serve_config

ROOT = Path(__file__).resolve().parents[1]
PASSAGES = [
    (
        "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
    ),
    ("Tokyo", "Tokyo is the capital of Japan and its most populous city."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
]
QUESTION = "When was the Eiffel Tower completed?"
CALL = (
    "<think>search</think>\n<tool_call>\n"
    '{"name": "search", "arguments": {"query_list": ["Eiffel Tower completed"]}}\n</tool_call>'
)
ANSWER = "<think>found</think>\n<answer>1889</answer>"
REANSWER = "<think>checked</think>\n<answer>1889 (Paris)</answer>"


def executor_reply(messages: list[dict[str, Any]]) -> str:
    """A deterministic Executor: search first, answer after a result, re-answer after a replan."""
    last = content_text(messages[-1]["content"])
    if "I have a revised plan" in last:
        return REANSWER
    if last.startswith("<tool_response>"):
        return ANSWER
    return CALL


@pytest.fixture(scope="module")
def search_url(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    rows = [{"id": i, "contents": f"{t}\n{x}"} for i, (t, x) in enumerate(PASSAGES)]
    with search_service(tmp_path_factory.mktemp("search"), rows) as url:
        yield url


@pytest.fixture(scope="module")
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    (root / "img7").mkdir()
    (root / "img7" / "meta.json").write_text(json.dumps({"title_list": ["Blue box"]}))
    Image.new("RGB", (8, 8), (0, 0, 255)).save(root / "img7" / "img_000.png")
    return root


def _service(search_url: str, cache: Path | None = None, replies: Any = executor_reply, **cfg: Any):  # type: ignore[no-untyped-def]
    tools = build_tools(
        {
            "search": {"type": "search", "params": {"url": search_url, "topk": 1}},
            "web_image_to_image_search": {
                "type": "web_image_to_image_search",
                "params": {"cache_roots": [str(cache)] if cache else [], "image_size": 8},
            },
        }
    )
    return ExecutorService(ScriptedChat(replies), tools, AgentConfig(image_size=16, **cfg))


@pytest.fixture(scope="module")
def server(search_url: str, image_cache: Path):  # type: ignore[no-untyped-def]
    with ServerThread(create_serve_app(_service(search_url, image_cache))) as url:
        yield url


def post(url: str, path: str, payload: Any, **kw: Any) -> httpx.Response:
    return httpx.post(url + path, json=payload, timeout=30, **kw)


def expected_execute(search_schema: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": prompts.system_prompt([search_schema])},
        {
            "role": "user",
            "content": prompts.USER_PROMPT_TEXT.format(question=QUESTION)
            + "\nHere is a guide for your reference:\n1. search the tower\nBegin your answer:\n",
        },
        {"role": "assistant", "content": CALL},
        {
            "role": "user",
            "content": "<tool_response>\nDoc 1(Title: Eiffel Tower) "
            + PASSAGES[0][1]
            + "\n</tool_response>",
        },
        {"role": "assistant", "content": ANSWER},
    ]
    return {
        "answer": "1889",
        "trace": format_trace(QUESTION, messages[2:]),
        "messages": messages,
        "tool_calls": [
            {
                "turn": 1,
                "attempt": 0,
                "name": "search",
                "arguments": {"query_list": ["Eiffel Tower completed"]},
                "ok": True,
                "error_kind": None,
                "error": None,
            }
        ],
        "turns": 2,
        "usage": {"prompt_tokens": 0, "completion_tokens": len(CALL.split()) + len(ANSWER.split())},
        "tool_errors": [],
        "tool_error": False,
        "stop_reason": "answer",
        "forced_answer": False,
        "replanned": False,
        "data_id": "7",
    }


def test_execute_exact_payload_and_alias(server: str) -> None:
    from mia.agent import SearchTool

    body = {"question": QUESTION, "plan": "1. search the tower", "data_id": 7, "mem": "ignored"}
    resp = post(server, "/execute", body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == expected_execute(SearchTool().schema())
    # The reference's /plan: the same run, plus its reflection prompt and history.
    ref = post(server, "/plan", body)
    assert ref.status_code == 200, ref.text
    want = resp.json()
    assert ref.json() == {
        "prompt": judge_prompt(want["trace"]),
        "history_messages": want["messages"][2:],
        **want,
    }


def test_execute_samples_when_asked(search_url: str) -> None:
    """A request's temperature and seed sample that run (every turn of it); without them the
    run takes the service's sampling (greedy here)."""
    service = _service(search_url)
    with ServerThread(create_serve_app(service)) as url:
        body = {"question": QUESTION, "plan": ""}
        assert post(url, "/execute", body).status_code == 200
        plain = len(service.backend.calls)
        resp = post(url, "/execute", {**body, "temperature": 0.8, "seed": 7})
        assert resp.status_code == 200, resp.text
    calls = service.backend.calls
    assert plain == 2 and len(calls) == 4  # a search turn, then the answer
    assert [(c["params"].temperature, c["params"].seed) for c in calls] == [
        (0.0, None),
        (0.0, None),
        (0.8, 7),
        (0.8, 7),
    ]


def test_continue_and_replan_limit(server: str) -> None:
    first = post(server, "/execute", {"question": QUESTION, "plan": ""}).json()
    body = {"question": QUESTION, "messages": first["messages"], "replan": "1. verify the year"}
    resp = post(server, "/continue", body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    msgs = out["messages"]
    assert msgs[:4] == first["messages"][:4]
    assert msgs[4] == {"role": "assistant", "content": "<think>found</think>\n"}
    assert msgs[5] == {
        "role": "user",
        "content": "\nI have a revised plan for you to follow:\n1. verify the year\n"
        "Please continue with this updated guidance:\n",
    }
    assert msgs[6] == {"role": "assistant", "content": REANSWER}
    assert len(msgs) == 7
    assert (out["answer"], out["turns"], out["replanned"], out["tool_calls"]) == (
        "1889 (Paris)",
        1,
        True,
        [],
    )
    assert out["trace"] == (
        f"### Question: {QUESTION}\n\n#### Revised Plan:\n"
        "I have a revised plan for you to follow:\n1. verify the year\n"
        "Please continue with this updated guidance:\n\n"
        f"### Round 3:\n#### Agent Reasoning and Tool Call:\n{REANSWER}"
    )
    assert out["usage"] == {"prompt_tokens": 0, "completion_tokens": len(REANSWER.split())}
    # The reference's /replan with the whole conversation: the same run, its shape.
    ref = post(server, "/replan", body)
    assert ref.status_code == 200, ref.text
    assert ref.json() == {"prompt": judge_prompt(out["trace"]), "history_messages": msgs[2:], **out}
    again = post(server, "/replan", {**body, "messages": msgs})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "replan_limit"
    assert "already replanned 1 time" in again.json()["error"]["message"]


def _png_b64(color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), color).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_image_question_and_continue_with_placeholders(search_url: str, image_cache: Path) -> None:
    def reply(messages: list[dict[str, Any]]) -> str:
        last = content_text(messages[-1]["content"])
        if "revised plan" in last:
            return "<answer>blue</answer>"
        if last.startswith("<tool_response>"):
            return "<answer>a box</answer>"
        return '<tool_call>{"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}</tool_call>'

    with ServerThread(create_serve_app(_service(search_url, image_cache, reply))) as url:
        b64 = _png_b64((255, 0, 0))
        resp = post(
            url,
            "/execute",
            {"question": "What is it?", "images": b64, "plan": "", "data_id": "img7"},
        )
        assert resp.status_code == 200, resp.text
        out = resp.json()
        user = out["messages"][1]["content"]
        assert [p["type"] for p in user] == ["text", "image_url", "text"]
        obs = out["messages"][3]["content"]
        assert obs[0] == {"type": "text", "text": "<tool_response>\n1. title: Blue box "}
        assert obs[1]["image_url"]["url"] == to_data_url(Image.new("RGB", (8, 8), (0, 0, 255)))
        assert (
            out["answer"] == "a box"
            and "web_image_to_image_search" in out["messages"][0]["content"]
        )
        # clients may strip images and send them back separately
        stripped = [
            {
                **m,
                "content": [
                    {"type": "image"} if p["type"] == "image_url" else p for p in m["content"]
                ],
            }
            if isinstance(m["content"], list)
            else m
            for m in out["messages"]
        ]
        blue = base64.b64encode(base64.b64decode(obs[1]["image_url"]["url"].split(",")[1])).decode()
        body = {
            "question": "What is it?",
            "messages": stripped,
            "replan": "look again",
            "images": [b64, blue],
        }
        cont = post(url, "/continue", body)
        assert cont.status_code == 200, cont.text
        assert cont.json()["answer"] == "blue"
        assert cont.json()["messages"][1]["content"][1] == user[1]
        short = post(url, "/continue", {**body, "images": [b64]})
        assert short.status_code == 422
        assert "more image placeholders than the 1 image(s)" in short.json()["error"]["message"]


@pytest.mark.parametrize(
    "path, payload, status, code, message",
    [
        ("/execute", {"plan": "p"}, 422, "invalid_request", "question: Field required"),
        ("/execute", {"question": "q"}, 422, "invalid_request", "plan: Field required"),
        ("/execute", {"question": "  ", "plan": ""}, 422, "invalid_request", "question: Value error, must not be empty"),
        ("/execute", {"question": "q", "plan": "", "images": ["not an image!"]}, 422, "bad_image", "images[0]: not base64 or a data URL"),
        ("/execute", {"question": "q", "plan": "", "images": ["/etc/hostname"]}, 422, "bad_image", "images[0]: not base64 or a data URL"),
        ("/execute", {"question": "q", "plan": "", "images": [base64.b64encode(b"nope").decode()]}, 422, "bad_image", "images[0]: cannot decode image bytes as an image (4 bytes)"),
        ("/execute", {"question": "q", "plan": "", "temperature": 2.5}, 422, "invalid_request", "temperature: Input should be less than or equal to 2"),
        ("/execute", {"question": "q", "plan": "", "seed": -1}, 422, "invalid_request", "seed: Input should be greater than or equal to 0"),
        ("/continue", {"question": "q", "messages": [{"role": "user", "content": "x"}], "replan": "r"}, 422, "invalid_request", "messages: List should have at least 2 items"),
        ("/continue", {"question": "q", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}], "replan": "r"}, 422, "invalid_request", "messages must end with the Executor's (assistant) turn"),
        ("/continue", {"question": "q", "messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], "replan": "r"}, 422, "invalid_request", "messages[1]: needs a role in ('system', 'user', 'assistant', 'tool')"),
        ("/continue", {"question": "q", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "replan": " "}, 422, "invalid_request", "replan: Value error, must not be empty"),
    ],
)  # fmt: skip
def test_bad_input_is_4xx(
    server: str, path: str, payload: Any, status: int, code: str, message: str
) -> None:
    resp = post(server, path, payload)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    assert error["message"].startswith(message), error["message"]


def _bomb_png(side: int = 20000) -> bytes:
    """A valid PNG header declaring side x side pixels (a few dozen bytes on the wire)."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_oversized_images_are_422_not_500(server: str) -> None:
    bomb = base64.b64encode(_bomb_png()).decode()
    big = base64.b64encode(_bomb_png(10000)).decode()  # over PIL's limit, under twice it
    first = post(server, "/execute", {"question": QUESTION, "plan": ""}).json()
    cases = [
        ("/execute", {"question": "q", "plan": "", "images": [bomb]}, "images[0]: image bytes is too large to decode"),
        ("/execute", {"question": "q", "plan": "", "images": f"data:image/png;base64,{big}"}, "images[0]: data URL declares 10000x10000 pixels"),
        ("/continue", {"question": "q", "messages": first["messages"], "replan": "r", "images": [bomb]}, "images[0]: image bytes is too large"),
    ]  # fmt: skip
    # An image part of the conversation itself holding the bomb.
    messages = [dict(m) for m in first["messages"]]
    messages[1] = {
        "role": "user",
        "content": [
            {"type": "text", "text": messages[1]["content"]},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{bomb}"}},
        ],
    }
    cases.append(
        (
            "/continue",
            {"question": "q", "messages": messages, "replan": "r"},
            "messages[1].content[1]: data URL is too large",
        )
    )
    for path, payload, message in cases:
        resp = post(server, path, payload)
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["code"] == "bad_image"
        assert resp.json()["error"]["message"].startswith(message), resp.json()
    assert httpx.get(server + "/health").json()["status"] == "ok"


def test_continue_never_opens_local_files_or_urls(server: str, tmp_path: Path) -> None:
    picture = tmp_path / "secret.png"
    Image.new("RGB", (4, 4), (1, 2, 3)).save(picture)
    first = post(server, "/execute", {"question": QUESTION, "plan": ""}).json()
    for ref in (str(picture), f"file://{picture}", "http://127.0.0.1:9/x.png", _png_b64((1, 2, 3))):
        messages = [dict(m) for m in first["messages"]]
        messages[1] = {
            "role": "user",
            "content": [
                {"type": "text", "text": messages[1]["content"]},
                {"type": "image_url", "image_url": {"url": ref}},
            ],
        }
        body = {"question": QUESTION, "messages": messages, "replan": "look again"}
        resp = post(server, "/continue", body)
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"] == {
            "code": "bad_image",
            "message": "messages[1].content[1]: an image part must hold a base64 data: URL (or be "
            "a bare placeholder filled from 'images'); the service never reads paths or fetches "
            "URLs",
        }
    # The `images` field takes data only, too: a path (even to a real image) is refused.
    resp = post(server, "/execute", {"question": "q", "plan": "", "images": [str(picture)]})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "bad_image"
    resp = post(
        server, "/execute", {"question": "q", "plan": "", "images": ["data:" + str(picture)]}
    )
    assert resp.status_code == 422 and "not a base64 data URL" in resp.json()["error"]["message"]


def test_lone_surrogates_are_422(server: str) -> None:
    hdr = {"content-type": "application/json"}
    for path, body, where in (
        ("/execute", b'{"question": "When\\ud800?", "plan": ""}', "question"),
        ("/execute", b'{"question": "q", "plan": "\xed\xb0\x80"}', "plan"),
        ("/continue", b'{"question": "q", "replan": "r", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "\\udbff"}]}', "messages.1.content"),
    ):  # fmt: skip
        resp = httpx.post(server + path, content=body, headers=hdr, timeout=30)
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"] == {
            "code": "invalid_request",
            "message": f"{where}: text holds a lone UTF-16 surrogate (not valid Unicode)",
        }


def test_malformed_json_body_is_400(server: str) -> None:
    resp = httpx.post(
        server + "/execute", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_json"


def test_tool_service_down_is_flagged_and_llm_failure_is_502(image_cache: Path) -> None:
    sock = bind_socket("127.0.0.1", 0)
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    with ServerThread(create_serve_app(_service(dead, image_cache), token="s3cret")) as url:
        auth = {"Authorization": "Bearer s3cret"}
        assert post(url, "/execute", {"question": QUESTION, "plan": ""}).status_code == 401
        resp = post(url, "/execute", {"question": QUESTION, "plan": ""}, headers=auth)
        assert resp.status_code == 200, resp.text
        out = resp.json()
        assert out["tool_error"] is True and out["answer"] == "1889"
        assert len(out["tool_errors"]) == 1
        assert out["tool_errors"][0].startswith(f"search: search service unavailable: {dead}")
        assert out["tool_calls"][0]["error_kind"] == "service"
        assert out["messages"][3]["content"].startswith(
            f"<tool_response>\nError: search service unavailable: {dead}"
        )
        health = httpx.get(url + "/health").json()
        assert health["tools"] == ["search", "web_image_to_image_search"]
        assert health["status"] == "ok" and health["max_turns"] == 20
    with ServerThread(create_serve_app(_service(dead, replies=[CALL]))) as url:
        resp = post(url, "/execute", {"question": QUESTION, "plan": ""})
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "llm_error"
        assert "script exhausted" in resp.json()["error"]["message"]


def test_serve_config_yaml_mirrors_the_defaults() -> None:
    from serve.config import ServeConfig

    assert load_serve_config(ROOT / "configs/serve/default.yaml") == ServeConfig()
    vllm = load_serve_config(ROOT / "configs/serve/vllm.yaml", ["agent.max_turns=5"])
    assert (vllm.llm.backend, vllm.llm.base_url, vllm.agent.max_turns) == (
        "openai",
        "http://127.0.0.1:8000/v1",
        5,
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_python_m_serve(tmp_path: Path, search_url: str) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "llm:\n  backend: scripted\n  replies:\n"
        f"    - {json.dumps(CALL)}\n    - {json.dumps(ANSWER)}\n"
        f"agent:\n  tools:\n    search:\n      params: {{url: {json.dumps(search_url)}}}\n"
    )
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve", "--port", "0", "--port-file", str(port_file),
         "--config", str(cfg), "agent.max_turns=4"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = wait_for_port_file(port_file, timeout=60, proc=proc)
        url = f"http://127.0.0.1:{port}"
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["max_turns"] == 4 and health["llm"] == "executor"
        out = post(url, "/execute", {"question": QUESTION, "plan": ""}).json()
        assert out["answer"] == "1889" and out["tool_error"] is False
        assert PASSAGES[0][1] in out["messages"][3]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_python_m_serve_bad_config_exits_2(tmp_path: Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "serve", "--port", "0", "agent.max_turns=0"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == "serve: error: agent config: max_turns must be >= 1"
    from mia.errors import MiaError
    from serve.cli import main

    with pytest.raises(MiaError, match="unknown type 'bing'"):
        main(["agent.tools.search.type=bing"])
    with pytest.raises(MiaError, match="overrides must look like key=value"):
        main(["agent.max_turns"])
