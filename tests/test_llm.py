"""mia.llm: OpenAIChat against a real local HTTP server speaking the chat-completions wire format,
LocalChat on a tiny random Qwen2, and building role backends from the Hydra configs."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from omegaconf import OmegaConf

from mia.errors import MiaError
from mia.http import ServerThread
from mia.llm import LLMError, SamplingParams, strip_think
from mia.llm.config import (
    LLMConfig,
    build_backend,
    clear_local_cache,
    role_configs,
    roles_from_config,
)
from mia.llm.openai_backend import OpenAIChat

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Capital of France?"},
]


# --------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server: each request pops the next action from ``script``.
# --------------------------------------------------------------------------------------------
class FakeOpenAI:
    def __init__(self) -> None:
        self.script: list[tuple[Any, ...]] = []
        self.default: tuple[Any, ...] = ("ok", "default reply")
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.generation = 0  # requests of an earlier test (a timed-out client's) are not counted
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._handle)

    def reset(self) -> None:
        self.script.clear()
        self.default = ("ok", "default reply")
        self.bodies.clear()
        self.headers.clear()
        self.in_flight = self.max_in_flight = 0
        self.generation += 1

    async def _handle(self, request: Request) -> Response:
        self.bodies.append(await request.json())
        self.headers.append(dict(request.headers))
        action = self.script.pop(0) if self.script else self.default
        generation = self.generation
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._act(action)
        finally:
            if generation == self.generation:
                self.in_flight -= 1

    async def _act(self, action: tuple[Any, ...]) -> Response:
        kind = action[0]
        if kind == "sleep":
            await asyncio.sleep(action[1])
            return await self._act(action[2:])
        if kind == "ok":
            text = action[1]
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
            extra = action[2] if len(action) > 2 else {}
            choice.update(extra)
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "qwen",
                    "choices": [choice],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
                }
            )
        if kind == "status":
            return JSONResponse(
                {"error": {"message": action[2], "type": "x", "code": action[1]}},
                status_code=action[1],
            )
        if kind == "garbage":
            return PlainTextResponse(action[1], status_code=200)
        if kind == "json":
            return JSONResponse(action[1])
        raise AssertionError(f"unknown action {action}")


@pytest.fixture(scope="module")
def server() -> Any:
    fake = FakeOpenAI()
    with ServerThread(fake.app) as url:
        fake.url = f"{url}/v1"  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def fake(server: FakeOpenAI) -> FakeOpenAI:
    server.reset()
    return server


def client(fake: FakeOpenAI, **kw: Any) -> OpenAIChat:
    opts: dict[str, Any] = {"timeout": 5.0, "max_retries": 2, "backoff": 0.01}
    opts.update(kw)
    return OpenAIChat(fake.url, "qwen", **opts)  # type: ignore[attr-defined]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------
# OpenAIChat
# --------------------------------------------------------------------------------------------
def test_openai_exact_request_payload_and_reply(fake: FakeOpenAI, monkeypatch) -> None:
    monkeypatch.setenv("MIA_TEST_LLM_KEY", "sk-secret-123")
    fake.script = [("ok", "Paris")]
    chat = client(
        fake,
        api_key_env="MIA_TEST_LLM_KEY",
        chat_template_kwargs={"enable_thinking": False},
        extra_body={"top_k": 20},
    )
    params = SamplingParams(temperature=0.1, top_p=0.9, max_tokens=64, stop=["</answer>"], seed=7)
    res = run(chat.chat(MESSAGES, params))
    assert res.text == "Paris"
    assert res.finish_reason == "stop"
    assert (res.prompt_tokens, res.completion_tokens) == (11, 3)
    assert res.token_ids is None and res.logprobs is None
    assert fake.bodies == [
        {
            "model": "qwen",
            "messages": MESSAGES,
            "temperature": 0.1,
            "top_p": 0.9,
            "max_tokens": 64,
            "stop": ["</answer>"],
            "seed": 7,
            "top_k": 20,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    ]
    assert fake.headers[0]["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(chat) and "sk-secret" not in str(vars(chat))


def test_openai_defaults_when_no_params(fake: FakeOpenAI) -> None:
    chat = client(fake, defaults=SamplingParams(max_tokens=5, presence_penalty=1.1))
    run(chat.chat(MESSAGES))
    body = fake.bodies[0]
    assert (body["max_tokens"], body["presence_penalty"], body["temperature"]) == (5, 1.1, 0.0)
    assert "chat_template_kwargs" not in body and "logprobs" not in body
    assert fake.headers[0]["authorization"] == "Bearer EMPTY"


def test_openai_strips_think(fake: FakeOpenAI) -> None:
    raw = "<think>first</think>draft<think>more thoughts</think>\n\nFinal plan: 1. search"
    fake.script = [("ok", raw), ("ok", raw)]
    res = run(client(fake, strip_think=True).chat(MESSAGES))
    assert res.text == "Final plan: 1. search"
    assert res.extra["raw_text"] == raw
    # Without the option the reply is untouched.
    assert run(client(fake).chat(MESSAGES)).text == raw


def test_strip_think_cases() -> None:
    assert strip_think("no thinking here ") == "no thinking here"
    assert strip_think("<think>a</think> b <think>c</think> d") == "d"
    assert strip_think("<think>cut off while reason") == ""
    assert strip_think("answer</think>") == ""


def test_openai_logprobs_and_token_ids(fake: FakeOpenAI) -> None:
    content = [
        {"token": "token_id:15", "logprob": -0.5, "bytes": [80], "top_logprobs": []},
        {"token": "token_id:7", "logprob": -1.25, "bytes": [81], "top_logprobs": []},
    ]
    fake.script = [("ok", "PQ", {"logprobs": {"content": content}})]
    res = run(client(fake).chat(MESSAGES, SamplingParams(logprobs=True)))
    assert res.token_ids == [15, 7]
    assert res.logprobs == [-0.5, -1.25]
    assert fake.bodies[0]["logprobs"] is True
    assert fake.bodies[0]["return_tokens_as_token_ids"] is True
    # A server that ignores the request: no ids, no logprobs, no error.
    fake.script = [("ok", "PQ", {"logprobs": None})]
    res = run(client(fake).chat(MESSAGES, SamplingParams(logprobs=True)))
    assert (res.text, res.token_ids, res.logprobs) == ("PQ", None, None)
    # Newer vLLM returns token_ids on the choice itself; plain token strings carry no ids.
    plain = [{"token": "P", "logprob": -0.1}, {"token": "Q", "logprob": -0.2}]
    fake.script = [("ok", "PQ", {"token_ids": [3, 4], "logprobs": {"content": plain}})]
    res = run(client(fake).chat(MESSAGES, SamplingParams(logprobs=True)))
    assert (res.token_ids, res.logprobs) == ([3, 4], [-0.1, -0.2])
    # Servers that reject unknown fields: do not send the vLLM extension.
    run(client(fake, return_token_ids=False).chat(MESSAGES, SamplingParams(logprobs=True)))
    assert fake.bodies[-1]["logprobs"] is True
    assert "return_tokens_as_token_ids" not in fake.bodies[-1]


def test_openai_retries_500_then_succeeds(fake: FakeOpenAI) -> None:
    fake.script = [("status", 500, "boom"), ("status", 503, "busy"), ("ok", "Paris")]
    res = run(client(fake, max_retries=2).chat(MESSAGES))
    assert res.text == "Paris"
    assert len(fake.bodies) == 3
    assert fake.bodies[0] == fake.bodies[2]  # the same request is resent


def test_openai_retries_429(fake: FakeOpenAI) -> None:
    fake.script = [("status", 429, "slow down"), ("ok", "Paris")]
    assert run(client(fake).chat(MESSAGES)).text == "Paris"
    assert len(fake.bodies) == 2


def test_openai_retries_timeout_then_succeeds(fake: FakeOpenAI) -> None:
    fake.script = [("sleep", 1.5, "ok", "late"), ("ok", "Paris")]
    res = run(client(fake, timeout=0.3, max_retries=1).chat(MESSAGES))
    assert res.text == "Paris"  # the slow first reply was abandoned, not awaited
    assert len(fake.bodies) == 2


def test_openai_persistent_failure_is_clear(fake: FakeOpenAI, monkeypatch) -> None:
    monkeypatch.setenv("MIA_TEST_LLM_KEY", "sk-secret-123")
    fake.default = ("status", 500, "model crashed")
    chat = client(fake, max_retries=2, api_key_env="MIA_TEST_LLM_KEY")
    with pytest.raises(LLMError) as info:
        run(chat.chat(MESSAGES))
    msg = str(info.value)
    assert fake.url in msg and "'qwen'" in msg  # type: ignore[attr-defined]
    assert "3 attempt(s)" in msg and "HTTP 500" in msg and "model crashed" in msg
    assert "sk-secret" not in msg
    assert len(fake.bodies) == 3


def test_openai_timeout_exhausted(fake: FakeOpenAI) -> None:
    fake.default = ("sleep", 1.0, "ok", "late")
    with pytest.raises(LLMError, match=r"failed after 2 attempt\(s\): timed out after 0.2s"):
        run(client(fake, timeout=0.2, max_retries=1).chat(MESSAGES))


def test_openai_4xx_is_not_retried(fake: FakeOpenAI) -> None:
    fake.default = ("status", 400, "unknown model 'qwen'")
    with pytest.raises(LLMError, match=r"rejected the request: HTTP 400: unknown model 'qwen'"):
        run(client(fake, max_retries=3).chat(MESSAGES))
    assert len(fake.bodies) == 1


@pytest.mark.parametrize(
    "action, reason",
    [
        (("garbage", "<html>gateway</html>"), "body is not JSON"),
        (("json", {"id": "x", "choices": []}), "no choices"),
        (("json", {"choices": [{"index": 0}]}), "no message"),
        (("json", ["not", "an", "object"]), "not a JSON object"),
    ],
)
def test_openai_garbage_is_retried_then_reported(
    fake: FakeOpenAI, action: tuple[Any, ...], reason: str
) -> None:
    fake.default = action
    with pytest.raises(LLMError) as info:
        run(client(fake, max_retries=1).chat(MESSAGES))
    msg = str(info.value)
    assert "malformed reply" in msg and reason in msg and fake.url in msg  # type: ignore[attr-defined]
    assert len(fake.bodies) == 2


def test_openai_garbage_once_then_ok(fake: FakeOpenAI) -> None:
    fake.script = [("garbage", "oops"), ("ok", "Paris")]
    assert run(client(fake).chat(MESSAGES)).text == "Paris"


def test_openai_connection_refused() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    chat = OpenAIChat(f"http://127.0.0.1:{port}/v1", "qwen", max_retries=1, backoff=0.01)
    with pytest.raises(LLMError, match=rf"127.0.0.1:{port}.*2 attempt\(s\): connection error"):
        run(chat.chat(MESSAGES))


def test_openai_concurrency_bound(fake: FakeOpenAI) -> None:
    fake.default = ("sleep", 0.5, "ok", "x")  # long enough to overlap on a loaded machine
    chat = client(fake, concurrency=3)

    async def many() -> list[str]:
        results = await asyncio.gather(*(chat.chat(MESSAGES) for _ in range(10)))
        await chat.aclose()
        return [r.text for r in results]

    assert run(many()) == ["x"] * 10
    assert len(fake.bodies) == 10
    assert fake.max_in_flight == 3


def test_openai_one_backend_many_event_loops(fake: FakeOpenAI) -> None:
    chat = client(fake)
    assert run(chat.chat(MESSAGES)).text == "default reply"
    assert run(chat.chat(MESSAGES)).text == "default reply"  # a fresh loop still works


# --------------------------------------------------------------------------------------------
# Role configs
# --------------------------------------------------------------------------------------------
def test_vllm_yaml_roles_against_fake_server(fake: FakeOpenAI) -> None:
    cfg = OmegaConf.load(REPO / "configs/llm/vllm.yaml")
    for role in cfg.roles:
        cfg.roles[role].base_url = fake.url  # type: ignore[attr-defined]
    roles = roles_from_config(cfg)
    assert sorted(roles) == ["executor", "judge", "manager", "planner"]
    assert roles["judge"].name == "judge"
    fake.default = ("ok", "<think>hmm</think>B")
    texts = {role: run(b.chat(MESSAGES)).text for role, b in roles.items()}
    bodies = dict(zip(roles, fake.bodies, strict=True))
    assert texts["planner"] == "B"  # planner strips its reasoning
    assert texts["judge"] == "<think>hmm</think>B"
    assert bodies["judge"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert bodies["manager"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in bodies["planner"]
    assert bodies["executor"]["max_tokens"] == 10000
    assert bodies["executor"]["presence_penalty"] == 1.1
    assert bodies["judge"]["max_tokens"] == 256
    assert all(b["model"] == "qwen" for b in fake.bodies)


def test_config_defaults_mirror_embedded_yaml() -> None:
    yaml = role_configs(OmegaConf.load(REPO / "configs/llm/embedded.yaml"))
    default = LLMConfig()
    for role, c in yaml.items():
        assert (c.backend, c.model_path, c.device, c.dtype) == (
            default.backend,
            default.model_path,
            default.device,
            default.dtype,
        ), role
        assert (c.max_batch_size, c.batch_wait_ms) == (
            default.max_batch_size,
            default.batch_wait_ms,
        )
    assert yaml["executor"].sampling_params() == SamplingParams(
        temperature=0.0, top_p=1.0, max_tokens=512, presence_penalty=1.1
    )


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"roles": {"judge": {"backend": "gpt"}}}, "backend must be one of"),
        ({"roles": {"judge": {"backend": "openai"}}}, "needs base_url"),
        ({"roles": {"judge": {"backend": "local", "temprature": 0}}}, "unknown key"),
        ({"roles": {"judge": {"sampling": {"temp": 0}}}}, "unknown sampling key"),
        ({"roles": {"judge": {"prefix_cache_mb": -1}}}, "prefix_cache_mb must be >= 0"),
        ({"roles": {"judge": {"repeat_stop": 2}}}, "repeat_stop must be 0 or >= 4"),
        ({"common": {}}, "no roles defined"),
        ({"rolez": {}}, "unknown section"),
    ],
)
def test_bad_llm_config_is_clear(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(MiaError, match=message):
        role_configs(cfg)


def test_scripted_backend_from_config() -> None:
    chat = build_backend({"backend": "scripted", "replies": ["one", "two"]}, name="judge")
    assert chat.name == "judge"
    assert [run(chat.chat(MESSAGES)).text for _ in range(2)] == ["one", "two"]


# --------------------------------------------------------------------------------------------
# LocalChat on a tiny random Qwen2
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from mia.models.tiny import build_tokenizer, tiny_qwen2

    tok = build_tokenizer()
    # A wider init than the default makes greedy replies varied (not one repeated token).
    return tiny_qwen2(tok, initializer_range=0.1), tok


@pytest.fixture(scope="module")
def local(tiny: tuple[Any, Any]) -> Any:
    from mia.llm.local_backend import LocalChat

    model, tok = tiny
    return LocalChat(model=model, tokenizer=tok, max_batch_size=8, batch_wait_ms=20)


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"question {i}: where is the river?"}] for i in range(n)]


def test_local_greedy_is_deterministic_and_exact(local: Any, tiny: tuple[Any, Any]) -> None:
    import torch

    model, tok = tiny
    p = SamplingParams(max_tokens=12)
    a = run(local.chat(prompts(1)[0], p))
    b = run(local.chat(prompts(1)[0], p))
    assert a.text == b.text and a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.finish_reason in ("stop", "length")
    assert len(a.token_ids) == len(a.logprobs) == a.completion_tokens
    assert a.prompt_tokens == len(a.extra["prompt_token_ids"])
    # The prompt is the tokenizer's chat template with a generation prompt.
    templated = tok.apply_chat_template(prompts(1)[0], tokenize=False, add_generation_prompt=True)
    assert a.extra["prompt_token_ids"] == tok.encode(templated, add_special_tokens=False)
    # The reply matches transformers' own greedy generate, and its logprobs match a forward pass.
    ids = torch.tensor([a.extra["prompt_token_ids"]])
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
        full = torch.tensor([a.extra["prompt_token_ids"] + a.token_ids])
        logits = model(full).logits[0, ids.shape[1] - 1 : -1].float()
    assert a.token_ids == ref[: len(a.token_ids)]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(a.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(a.logprobs), want, atol=1e-4)
    assert a.text == tok.decode(
        [t for t in a.token_ids if t != tok.eos_token_id], skip_special_tokens=True
    )


def test_local_concurrent_calls_are_batched_and_equal_sequential(local: Any) -> None:
    p = SamplingParams(max_tokens=16)
    msgs = prompts(8)
    sequential = [run(local.chat(m, p)) for m in msgs]
    before = local.stats

    async def together() -> list[Any]:
        return await asyncio.gather(*(local.chat(m, p) for m in msgs))

    concurrent = run(together())
    after = local.stats
    batches = after["batches"] - before["batches"]
    assert after["requests"] - before["requests"] == 8
    assert batches < 8
    assert [r.token_ids for r in concurrent] == [r.token_ids for r in sequential]
    assert [r.text for r in concurrent] == [r.text for r in sequential]
    for c, s in zip(concurrent, sequential, strict=True):
        assert max(abs(x - y) for x, y in zip(c.logprobs, s.logprobs, strict=True)) < 1e-4
    assert len({r.text for r in sequential}) > 1  # the prompts really differ


def test_local_prefix_cache_reuses_turns_and_equals_a_full_prefill(
    tiny: tuple[Any, Any], tmp_path: Path
) -> None:
    """A shared system prompt and an agent's earlier turns are not computed again, and the replies
    equal those of the same model without the cache (greedy tokens, logprobs to float rounding),
    for rows of different cached lengths in one batch; loading weights in place empties it."""
    from mia.llm.local_backend import LocalChat
    from mia.models.tiny import save_tiny

    model, tok = tiny
    folder = save_tiny(model, tok, tmp_path / "tiny")
    plain = LocalChat(folder, dtype="float32", batch_wait_ms=50)
    cached = LocalChat(folder, dtype="float32", batch_wait_ms=50, prefix_cache_mb=64)
    system = {"role": "system", "content": "You answer questions by searching. " * 8}
    p = SamplingParams(max_tokens=10)

    def turn2(first: list[dict[str, str]], reply: str) -> list[dict[str, str]]:
        return first + [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Doc 1: the river flows through the capital."},
        ]

    async def conversation(chat: Any, i: int) -> list[Any]:
        first = [system, {"role": "user", "content": f"question {i}: where is the river?"}]
        a = await chat.chat(first, p)
        b = await chat.chat(turn2(first, a.text), p)
        return [a, b]

    async def all_of(chat: Any, staggered: bool) -> list[list[Any]]:
        if not staggered:
            return list(await asyncio.gather(*(conversation(chat, i) for i in range(4))))
        # Conversations 0-1 run first, so 2-3 meet a cache holding other rows' prefixes while
        # their own first turns are not cached yet: one batch mixes cached lengths.
        done = list(await asyncio.gather(*(conversation(chat, i) for i in range(2))))
        return done + list(await asyncio.gather(*(conversation(chat, i) for i in range(2, 4))))

    want = run(all_of(plain, staggered=False))
    got = run(all_of(cached, staggered=True))
    for w_conv, g_conv in zip(want, got, strict=True):
        for w, g in zip(w_conv, g_conv, strict=True):
            assert (g.text, g.token_ids, g.prompt_tokens) == (w.text, w.token_ids, w.prompt_tokens)
            assert max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs, strict=True)) < 1e-4
    stats = cached.stats
    total = sum(r.prompt_tokens for conv in got for r in conv)
    assert stats["prompt_tokens"] == total
    # Only the first batch (conversations 0-1, turn 1) finds nothing; turns 1 of 2-3 reuse the
    # system prompt and every second turn reuses its first turn (prompt and reply): 503 of the
    # 845 prompt tokens here.
    assert stats["prefix_hits"] == 6
    assert stats["prefix_tokens"] > 0.5 * total, (stats, total)
    assert "prefix_hits" not in plain.stats  # off by default
    with cached.exclusive():  # new weights in place: the cached KV is stale
        pass
    assert len(cached._engine.prefix) == 0
    # A model passed in may be trained under us: no cache even when asked for.
    assert LocalChat(model=model, tokenizer=tok, prefix_cache_mb=64)._engine.prefix is None


def test_local_reply_cache_answers_repeated_greedy_requests_only(
    tiny: tuple[Any, Any], tmp_path: Path
) -> None:
    """A greedy request repeated exactly (prompt ids, max_tokens, stops, penalty) gets the stored
    reply without a batch; the reply equals the one the model decodes without any cache. Other
    settings, sampled requests and new weights (exclusive) decode again."""
    from mia.llm.local_backend import LocalChat
    from mia.models.tiny import save_tiny

    model, tok = tiny
    folder = save_tiny(model, tok, tmp_path / "tiny")
    plain = LocalChat(folder, dtype="float32")
    cached = LocalChat(folder, dtype="float32", prefix_cache_mb=64)
    msgs = [{"role": "user", "content": "question 7: where is the river?"}]
    greedy = SamplingParams(max_tokens=12)
    want = run(plain.chat(msgs, greedy))

    first = run(cached.chat(msgs, greedy))
    batches = cached.stats["batches"]
    again = run(cached.chat(msgs, greedy))
    assert cached.stats["reply_hits"] == 1
    assert cached.stats["batches"] == batches  # answered without decoding
    for got in (first, again):
        assert (got.text, got.token_ids, got.finish_reason) == (
            want.text, want.token_ids, want.finish_reason,
        )  # fmt: skip
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4
    again.token_ids.append(-1)  # a caller changing its copy does not change the store
    assert run(cached.chat(msgs, greedy)).token_ids == want.token_ids
    assert cached.stats["reply_hits"] == 2

    # Another max_tokens, a sampled request (twice, same seed): decoded every time.
    run(cached.chat(msgs, SamplingParams(max_tokens=5)))
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    a, b = run(cached.chat(msgs, sampled)), run(cached.chat(msgs, sampled))
    assert a.token_ids == b.token_ids  # the seed makes the draw repeat, not the cache
    assert cached.stats["reply_hits"] == 2
    assert cached.stats["batches"] == batches + 3

    with cached.exclusive():  # new weights: stored replies belong to the old ones
        pass
    run(cached.chat(msgs, greedy))
    assert cached.stats["reply_hits"] == 2
    assert cached.stats["batches"] == batches + 4
    assert "reply_hits" not in plain.stats  # off with the prefix cache


def test_prefix_cache_lru_budget_and_subsumption() -> None:
    """The store keeps at most max_bytes (least recently used out first), drops a sequence that
    a newer one extends, and leaves at least one token of a prompt to compute."""
    import torch

    from mia.llm.local_backend import MIN_PREFIX, PrefixCache

    def seq(start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n)

    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:  # 2 layers, 1 head, dim 4
        return [(torch.full((1, n, 4), float(layer)), torch.zeros(1, n, 4)) for layer in (0, 1)]

    per_token = 2 * 2 * 4 * 4  # layers x (keys, values) x dim x float32 bytes
    cache = PrefixCache(max_bytes=100 * per_token)
    a, b, c = seq(0, 40), seq(1000, 40), seq(2000, 40)
    cache.store(a, kv(40))
    cache.store(b, kv(40))
    assert (len(cache), cache.bytes) == (2, 80 * per_token)
    n, hit = cache.lookup(torch.cat([a[:30], seq(5000, 5)]), torch)  # a is now the most recent
    assert n == 30 and hit is not None and hit[1][0].shape == (1, 30, 4)
    cache.store(c, kv(40))  # 120 tokens > 100: b, the least recently used, goes
    assert (len(cache), cache.bytes) == (2, 80 * per_token)
    assert cache.lookup(b, torch) == (0, None)
    assert cache.lookup(a, torch)[0] == 39  # the whole of a but its last token
    cache.store(torch.cat([a, seq(7000, 10)]), kv(50))  # extends a: a is dropped
    assert (len(cache), cache.bytes) == (2, 90 * per_token)
    assert cache.lookup(a[: MIN_PREFIX - 1], torch) == (0, None)  # too short to be worth it
    cache.store(seq(0, 200), kv(200))  # larger than the whole budget: not stored
    assert len(cache) == 2 and (cache.hits, cache.reused_tokens) == (2, 69)


def test_local_stop_string_cuts_text(local: Any) -> None:
    free = run(local.chat(prompts(1)[0], SamplingParams(max_tokens=16)))
    assert free.finish_reason == "length" and len(free.token_ids) == 16
    # Stop at a piece of text from the middle of the free reply.
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    assert stop.strip()
    cut = run(local.chat(prompts(1)[0], SamplingParams(max_tokens=16, stop=[stop])))
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.find(stop)]
    assert stop not in cut.text
    assert len(cut.token_ids) < 16 and len(cut.token_ids) == len(cut.logprobs)
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]


def test_repeats_detects_short_loops_only() -> None:
    from mia.llm.local_backend import repeats

    assert repeats([5] * 32, 32) and repeats([5, 7] * 16, 32)
    assert repeats(list(range(8)) * 4, 32)  # period 8 = a quarter of the window
    assert repeats([9, 1, 2] + [5] * 32, 32)  # only the tail counts
    assert not repeats(list(range(9)) * 4, 32)  # period 9 > 32 // 4
    assert not repeats([5] * 31, 32)  # shorter than the window
    assert not repeats(list(range(40)), 32)


def test_local_repeat_stop_cuts_a_loop_and_nothing_else(tiny: tuple[Any, Any]) -> None:
    """A reply ends where its tokens first loop for the window, with the same tokens as the
    uncut reply up to there; replies without such a loop are untouched, in the same batch."""
    from mia.llm.local_backend import LocalChat, repeats
    from mia.models.tiny import tiny_qwen2

    varied_model, tok = tiny
    looping_model = tiny_qwen2(tok)  # the default init: greedy replies repeat one token
    p = SamplingParams(max_tokens=40)
    msgs = prompts(3)
    untouched = 0
    for model in (looping_model, varied_model):
        free_chat = LocalChat(model=model, tokenizer=tok, batch_wait_ms=20)
        free = [run(free_chat.chat(m, p)) for m in msgs]
        cut_chat = LocalChat(model=model, tokenizer=tok, batch_wait_ms=50, repeat_stop=8)

        async def together(chat: Any = cut_chat) -> list[Any]:
            return await asyncio.gather(*(chat.chat(m, p) for m in msgs))

        cut = run(together())
        expected_stops = 0
        for f, c in zip(free, cut, strict=True):
            ends = [k for k in range(8, len(f.token_ids)) if repeats(f.token_ids[:k], 8)]
            if ends:  # the first loop, before the budget ends the reply anyway
                assert c.token_ids == f.token_ids[: ends[0]]
                assert c.finish_reason == "length"
                expected_stops += 1
            else:
                assert c.token_ids == f.token_ids and c.finish_reason == f.finish_reason
                untouched += 1
        if model is looping_model:
            assert expected_stops == len(msgs)  # every reply loops early
            assert all(len(c.token_ids) < 40 for c in cut)
        assert cut_chat.stats["repeat_stops"] == expected_stops
    assert untouched >= 1  # a varied reply went through whole
    with pytest.raises(LLMError, match="repeat_stop must be 0 or >= 4"):
        LocalChat(model=varied_model, tokenizer=tok, repeat_stop=3)


def test_decode_attention_equals_sdpa_and_leaves_other_passes_alone(tiny: tuple[Any, Any]) -> None:
    """One-token steps over a left-padded cache give sdpa's logits (grouped heads: 4 query, 2
    KV); a full forward pass (prefill, training) is bit-identical to sdpa's."""
    import copy

    import torch

    from mia.llm.decode_attention import NAME, use_for_decode

    model, _ = tiny
    ref = copy.deepcopy(model).eval()
    ref.set_attn_implementation("sdpa")  # the fixture's model was switched by a LocalChat
    fast = copy.deepcopy(ref)
    assert ref.config.num_key_value_heads < ref.config.num_attention_heads
    assert use_for_decode(fast, "cpu") and fast.config._attn_implementation == NAME
    assert not use_for_decode(copy.deepcopy(ref), "cuda")  # GPU kernels group heads themselves
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (3, 12))
    attn = torch.ones_like(ids)
    attn[0, :5] = 0  # a left-padded row
    attn[2, :2] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    outs = {}
    with torch.inference_mode():
        for name, m in (("ref", ref), ("fast", fast)):
            out = m(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            cache, a, p, nxt = out.past_key_values, attn, pos[:, -1:], out.logits[:, -1].argmax(-1)
            steps = [out.logits]
            for _ in range(6):
                a, p = torch.cat([a, a.new_ones((3, 1))], -1), p + 1
                o = m(input_ids=nxt[:, None], attention_mask=a, position_ids=p,
                      past_key_values=cache, use_cache=True)  # fmt: skip
                cache, nxt = o.past_key_values, o.logits[:, -1].argmax(-1)
                steps.append(o.logits)
            outs[name] = steps
    assert torch.equal(outs["ref"][0], outs["fast"][0])  # the prefill runs sdpa itself
    for r, f in zip(outs["ref"][1:], outs["fast"][1:], strict=True):
        assert torch.allclose(r, f, atol=1e-5)
    fast.train()
    ref.train()
    assert torch.equal(ref(input_ids=ids, attention_mask=attn).logits,
                       fast(input_ids=ids, attention_mask=attn).logits)  # fmt: skip


def test_grouped_attention_equals_sdpa_for_every_mask_kind() -> None:
    """The grouped matmuls (decode steps, short half-precision passes) compute sdpa's attention:
    boolean mask with left padding, no mask (causal), an additive mask, one query or many, and
    the gradients; float32 to 1e-5."""
    import types

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from mia.llm.decode_attention import grouped_attention

    torch.manual_seed(0)
    mod = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=True)
    b, heads, kv, q_len, dim = 3, 6, 2, 9, 16
    pad = torch.ones(b, q_len, dtype=torch.bool)
    pad[0, :4] = False  # left padding: the first rows of row 0 attend to nothing
    bool_mask = torch.ones(q_len, q_len, dtype=torch.bool).tril()[None, None] & pad[:, None, None]
    additive = torch.zeros(b, 1, q_len, q_len).masked_fill(~bool_mask, -1e9)
    for mask, queries in ((bool_mask, q_len), (None, q_len), (additive, q_len), (bool_mask, 1)):
        q = torch.randn(b, heads, queries, dim, requires_grad=True)
        k = torch.randn(b, kv, q_len, dim, requires_grad=True)
        v = torch.randn(b, kv, q_len, dim, requires_grad=True)
        m = mask[:, :, -queries:] if mask is not None else None
        want, _ = sdpa_attention_forward(mod, q, k, v, m, scaling=0.25)
        got = grouped_attention(mod, q, k, v, m, 0.25)
        rows = pad[:, -queries:, None, None].expand_as(want)  # fully masked rows: any value
        assert torch.allclose(got[rows], want[rows], atol=1e-5)
        g_want = torch.autograd.grad((want * rows).sum(), (q, k, v))
        g_got = torch.autograd.grad((got * rows).sum(), (q, k, v))
        for a, c in zip(g_want, g_got, strict=True):
            assert torch.allclose(a, c, atol=1e-5)


def test_cpu_attention_takes_short_bf16_passes_only(tiny: tuple[Any, Any]) -> None:
    """Under bf16 autocast a pass over <= SHORT_KEYS keys takes the grouped matmuls: logits and
    gradients as far from float32's as sdpa's bf16 ones are (bf16 rounding, ~1e-2 here); a
    longer pass is sdpa's, bit for bit."""
    import copy

    import torch

    from mia.llm.decode_attention import SHORT_KEYS, use_for_decode

    model, _ = tiny
    ref = copy.deepcopy(model).train()
    ref.set_attn_implementation("sdpa")
    fast = copy.deepcopy(ref)
    assert use_for_decode(fast, "cpu")
    torch.manual_seed(0)
    for length in (12, SHORT_KEYS + 8):
        ids = torch.randint(5, 200, (3, length))
        attn = torch.ones_like(ids)
        attn[0, :5] = 0
        sel = attn.bool()
        outs = []
        for m, bf16 in ((ref, False), (ref, True), (fast, True)):
            m.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = m(input_ids=ids, attention_mask=attn).logits.float()[sel]
            logits.logsumexp(-1).sum().backward()
            outs.append((logits.detach(), m.model.embed_tokens.weight.grad.clone()))
        (l32, g32), (la, ga), (lb, gb) = outs
        if length > SHORT_KEYS:
            assert torch.equal(la, lb) and torch.equal(ga, gb)
            continue
        assert not torch.equal(la, lb)  # another kernel ran
        err_a, err_b = (la - l32).abs(), (lb - l32).abs()
        assert err_b.mean() <= 1.5 * err_a.mean() and err_b.max() <= 2 * err_a.max()
        assert (gb - g32).norm() <= 2 * (ga - g32).norm() + 1e-3 * g32.norm()


def test_local_sampler_draws_the_tempered_top_p_distribution() -> None:
    """The batched inverse-CDF draw: token frequencies match softmax(z / T) (top-p: renormalised
    over the smallest top set reaching p), zero-probability tokens never come, greedy rows take
    the argmax, and a row's draws depend only on its own uniforms."""
    import torch

    from mia.llm.local_cache import Request
    from mia.llm.local_engine import _Picker

    z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -30.0])
    n = 20000
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_p=0.8),
        SamplingParams(temperature=0.0),
    ]
    reqs = [Request(prompt_ids=[1], params=p) for p in params]
    u = torch.rand((3, n), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picker = _Picker(reqs, [0, 1], u, torch)
    counts = torch.zeros(3, z.numel())
    for step in range(n):
        nxt = picker.pick(z.expand(3, -1).clone(), step)
        counts[torch.arange(3), nxt] += 1
    freq = counts / n
    full = torch.softmax(z, -1)
    assert torch.allclose(freq[0], full, atol=0.01)
    sharp = torch.softmax(z / 0.5, -1)  # top-p 0.8 keeps the top tokens until they reach 0.8
    keep = (sharp.cumsum(-1) - sharp) < 0.8
    assert torch.allclose(freq[1], sharp * keep / (sharp * keep).sum(), atol=0.01)
    assert freq[2, 0] == 1.0
    # Row 0 with other rows beside it, or alone: the same tokens from the same uniforms.
    alone = _Picker(reqs[:1], [0], u[:1], torch)
    for step in range(50):
        both = picker.pick(z.expand(3, -1).clone(), step)
        assert int(alone.pick(z[None].clone(), step)[0]) == int(both[0])


def test_local_sampling_is_seeded_per_request(local: Any) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=123)
    alone = run(local.chat(prompts(1)[0], p))

    async def mixed() -> list[Any]:
        greedy = SamplingParams(max_tokens=10)
        return await asyncio.gather(local.chat(prompts(2)[1], greedy), local.chat(prompts(1)[0], p))

    _, batched = run(mixed())
    assert batched.token_ids == alone.token_ids  # same seed, same reply, batch or not
    other = run(local.chat(prompts(1)[0], SamplingParams(temperature=1.0, max_tokens=10, seed=9)))
    assert other.token_ids != alone.token_ids


def test_local_max_tokens_per_request_in_one_batch(local: Any) -> None:
    async def both() -> list[Any]:
        return await asyncio.gather(
            local.chat(prompts(1)[0], SamplingParams(max_tokens=3)),
            local.chat(prompts(1)[0], SamplingParams(max_tokens=9)),
        )

    short, long = run(both())
    assert len(short.token_ids) == 3 and short.finish_reason == "length"
    assert short.token_ids == long.token_ids[:3]


def test_local_errors_are_clear(local: Any) -> None:
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(LLMError, match="only text content is supported"):
        run(local.chat(image))
    with pytest.raises(LLMError, match="max_tokens must be >= 1"):
        run(local.chat(prompts(1)[0], SamplingParams(max_tokens=0)))
    with pytest.raises(LLMError, match="is not a model folder"):
        from mia.llm.local_backend import LocalChat

        LocalChat("/nonexistent/model")


def test_local_roles_share_one_model(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    from mia.models.tiny import save_tiny

    model, tok = tiny
    folder = save_tiny(model, tok, tmp_path / "tiny")
    cfg = OmegaConf.load(REPO / "configs/llm/embedded.yaml")
    cfg.common.model_path = str(folder)
    try:
        roles = roles_from_config(cfg)
        engines = {id(b._engine) for b in roles.values()}  # type: ignore[attr-defined]
        assert len(engines) == 1
        assert roles["judge"].defaults.max_tokens == 16  # type: ignore[attr-defined]
        res = run(roles["judge"].chat(prompts(1)[0]))
        assert len(res.token_ids) <= 16
        view = roles["planner"].with_options(strip_think=True)  # type: ignore[attr-defined]
        assert view._engine is roles["planner"]._engine  # type: ignore[attr-defined]
    finally:
        clear_local_cache()


@pytest.mark.slow
def test_embedded_model_chat(shared_mia_home: Path, monkeypatch) -> None:
    """The real embedded default (SmolLM2) through configs/llm/embedded.yaml."""
    pytest.importorskip("gguf")
    monkeypatch.setenv("MIA_HOME", str(shared_mia_home))
    cfg = OmegaConf.load(REPO / "configs/llm/embedded.yaml")
    try:
        roles = roles_from_config(cfg)
        msgs = [{"role": "user", "content": "What is the capital of France? One word."}]
        res = run(roles["manager"].chat(msgs, SamplingParams(max_tokens=8)))
        assert "paris" in res.text.lower()
        assert len(res.token_ids) == len(res.logprobs) == res.completion_tokens <= 8
    finally:
        clear_local_cache()
