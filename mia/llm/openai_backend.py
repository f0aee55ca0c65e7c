"""Chat over any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang, OpenAI).

We own the retry policy instead of the SDK's, so that every role sees the same behaviour and a
failure ends in one clear :class:`LLMError` naming the endpoint:

- retried (exponential backoff with jitter): timeouts, connection errors, HTTP 408/429/5xx, and
  garbage replies (non-JSON, no ``choices``, no ``message``);
- not retried: any other 4xx (a bad request will not get better by asking again).

The SDK's raw-response mode is used so we parse the body ourselves: vLLM's extra fields
(``token_ids``, ``reasoning_content``) survive and a malformed body becomes a clear error rather
than a half-validated object. A body nested deeper than Python's parser can follow, or a kept part
(``tool_calls``, reasoning) nested over :data:`MAX_REPLY_DEPTH`, is such a malformed body. Lone
UTF-16 surrogates (a ``"\\ud800"`` escape) in any text of the reply, error details included, become
U+FFFD, so no caller meets a string that cannot be encoded as UTF-8.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import weakref
from dataclasses import dataclass
from typing import Any

import openai
from openai import AsyncOpenAI

from mia.llm.base import ChatResult, LLMError, Message, SamplingParams
from mia.llm.think import strip_think as _strip_think

log = logging.getLogger("mia.llm.openai")

# vLLM with return_tokens_as_token_ids=True spells each logprob token as "token_id:123".
_TOKEN_ID_RE = re.compile(r"^token_id:(-?\d+)$")
# A str holds a surrogate code point only where the JSON escaped a lone one (pairs decode whole).
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Levels of nesting allowed in the reply parts we keep: a chat completion's tool_calls nest about
# four deep (their arguments are a JSON string); deeper is garbage that could exhaust recursion
# wherever callers walk it (JSON encoding, repr, validation).
MAX_REPLY_DEPTH = 32


class _GarbageReply(Exception):
    """The server answered 2xx with a body that is not a chat completion."""


class _Secret:
    """Holds the API key so that repr(), vars() and log lines never show it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "_Secret('***')"


@dataclass
class _LoopState:
    client: AsyncOpenAI
    sem: asyncio.Semaphore


class OpenAIChat:
    """An async chat backend for one ``(base_url, model)``.

    ``api_key``: the key itself, else read from the environment variable ``api_key_env``, else
    ``"EMPTY"`` (local vLLM needs none). The key is only sent as a bearer header, never logged.
    ``concurrency`` bounds in-flight requests from this instance. ``chat_template_kwargs`` (e.g.
    ``{"enable_thinking": False}`` for Qwen3) and ``extra_body`` go into the request body.
    ``strip_think`` keeps only the text after the last ``</think>`` (the raw reply is kept in
    ``ChatResult.extra["raw_text"]``; ``token_ids``/``logprobs`` always cover the raw reply).
    ``return_token_ids``: with ``params.logprobs`` also ask vLLM for token ids
    (``return_tokens_as_token_ids``); turn off for servers that reject unknown fields.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        api_key_env: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        concurrency: int = 16,
        chat_template_kwargs: dict[str, Any] | None = None,
        strip_think: bool = False,
        extra_body: dict[str, Any] | None = None,
        return_token_ids: bool = True,
        defaults: SamplingParams | None = None,
        name: str | None = None,
    ) -> None:
        if not base_url:
            raise LLMError("openai backend: base_url is empty")
        if concurrency < 1:
            raise LLMError(f"openai backend: concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise LLMError(f"openai backend: max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or f"openai:{model}@{self.base_url}"
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.concurrency = concurrency
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.strip_think = strip_think
        self.extra_body = dict(extra_body or {})
        self.return_token_ids = return_token_ids
        self.defaults = defaults or SamplingParams()
        key = api_key or (os.environ.get(api_key_env) if api_key_env else None)
        self._key = _Secret(key or "EMPTY")
        # One client + semaphore per event loop: both bind to the loop that first uses them, and
        # callers (reward functions, CLIs) may run several asyncio.run() over one shared backend.
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIChat(name={self.name!r}, base_url={self.base_url!r}, model={self.model!r})"

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions (model {self.model!r})"

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            client = AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._key.value,
                timeout=self.timeout,
                max_retries=0,  # our retry loop below is the only one
            )
            state = _LoopState(client=client, sem=asyncio.Semaphore(self.concurrency))
            self._states[loop] = state
        return state

    def _request(self, messages: list[Message], p: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        if p.stop:
            kwargs["stop"] = list(p.stop)
        if p.presence_penalty:
            kwargs["presence_penalty"] = p.presence_penalty
        if p.seed is not None:
            kwargs["seed"] = p.seed
        extra = dict(self.extra_body)
        if self.chat_template_kwargs:
            extra["chat_template_kwargs"] = {
                **extra.get("chat_template_kwargs", {}),
                **self.chat_template_kwargs,
            }
        if p.logprobs:
            kwargs["logprobs"] = True
            if self.return_token_ids:
                # vLLM: spell logprob tokens as ids so we get exact token ids back.
                extra.setdefault("return_tokens_as_token_ids", True)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    async def chat(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> ChatResult:
        p = params or self.defaults
        kwargs = self._request(messages, p)
        state = self._state()
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                async with state.sem:
                    raw = await state.client.chat.completions.with_raw_response.create(**kwargs)
                    body = raw.text
                return self._parse(body)
            except openai.APITimeoutError:
                last = f"timed out after {self.timeout:g}s"
            except openai.APIConnectionError as err:
                last = f"connection error: {err.__cause__ or err}"
            except openai.APIStatusError as err:
                status = err.status_code
                detail = _error_detail(err)
                if status not in (408, 429) and status < 500:
                    raise LLMError(
                        f"LLM endpoint {self.endpoint} rejected the request: HTTP {status}: {detail}"
                    ) from None
                last = f"HTTP {status}: {detail}"
                retry_after = _retry_after(err)
            except _GarbageReply as err:
                last = f"malformed reply: {err}"
            if attempt + 1 < attempts:
                delay = self._delay(attempt, retry_after)
                log.warning(
                    "LLM %s: attempt %d/%d failed (%s); retrying in %.2fs",
                    self.endpoint,
                    attempt + 1,
                    attempts,
                    last,
                    delay,
                )
                await asyncio.sleep(delay)
        raise LLMError(f"LLM endpoint {self.endpoint} failed after {attempts} attempt(s): {last}")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        base = min(self.max_backoff, self.backoff * (2**attempt))
        # Jitter spreads the retries of many concurrent callers hitting one overloaded server.
        delay = base * random.uniform(0.5, 1.5)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff))
        return delay

    def _parse(self, body: str) -> ChatResult:
        try:
            data = json.loads(body)
        except ValueError:
            raise _GarbageReply(f"body is not JSON: {body[:200]!r}") from None
        except RecursionError:
            raise _GarbageReply("body is JSON nested too deep to parse") from None
        if not isinstance(data, dict):
            raise _GarbageReply(f"body is not a JSON object: {body[:200]!r}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _GarbageReply(f"no choices in reply: {body[:200]!r}")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise _GarbageReply(f"no message in choices[0]: {body[:200]!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _GarbageReply(f"message content is not a string: {_brief(content)}")
        raw_text = scrub_surrogates(content or "")
        extra: dict[str, Any] = {}
        for key in ("reasoning_content", "reasoning", "tool_calls"):
            if message.get(key):
                extra[key] = _clean(message[key], key)
        text = raw_text
        if self.strip_think:
            text = _strip_think(raw_text)
            extra["raw_text"] = raw_text
        token_ids, logprobs = _token_info(choice)
        usage = _usage(data.get("usage"))
        completion_tokens = usage.get("completion_tokens") or (len(token_ids) if token_ids else 0)
        return ChatResult(
            text=text,
            finish_reason=_finish_reason(choice.get("finish_reason")),
            prompt_tokens=usage.get("prompt_tokens") or 0,
            completion_tokens=int(completion_tokens),
            token_ids=token_ids,
            logprobs=logprobs,
            extra=extra,
        )

    async def aclose(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        state = self._states.pop(loop, None)
        if state is not None:
            await state.client.close()


def scrub_surrogates(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate replaced by U+FFFD (valid Unicode throughout)."""
    return _SURROGATE.sub("\ufffd", text)


def _clean(value: Any, where: str, depth: int = 1) -> Any:
    """A copy of a reply part with its strings (keys too) scrubbed of lone surrogates; a part
    nested over :data:`MAX_REPLY_DEPTH` levels is a malformed reply."""
    if isinstance(value, str):
        return scrub_surrogates(value)
    if not isinstance(value, dict | list):
        return value
    if depth > MAX_REPLY_DEPTH:
        raise _GarbageReply(f"{where} is nested over {MAX_REPLY_DEPTH} levels deep")
    if isinstance(value, list):
        return [_clean(item, where, depth + 1) for item in value]
    return {
        scrub_surrogates(k) if isinstance(k, str) else k: _clean(v, where, depth + 1)
        for k, v in value.items()
    }


def _brief(value: Any) -> str:
    """A short rendering of a reply value for error messages: containers are named, not printed
    (printing a deeply nested one recurses); repr escapes lone surrogates."""
    if isinstance(value, dict | list):
        return "a JSON object" if isinstance(value, dict) else "a JSON array"
    return repr(value)[:200]


def _finish_reason(value: Any) -> str:
    if isinstance(value, dict | list):
        raise _GarbageReply(f"finish_reason is not a string: {_brief(value)}")
    return scrub_surrogates(str(value or "stop"))


def _usage(usage: Any) -> dict[str, int]:
    """Token counts of a reply's ``usage`` block (absent or null: none). Anything else that is
    not whole non-negative numbers is a broken reply, retried like any other garbage."""
    if usage is None:
        return {}
    if not isinstance(usage, dict):
        raise _GarbageReply(f"usage is not an object: {_brief(usage)}")
    out = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _GarbageReply(f"usage.{key} is not a number: {_brief(value)}")
        if not (math.isfinite(value) and value >= 0 and value == int(value)):
            raise _GarbageReply(f"usage.{key} is not a token count: {value!r:.100}")
        out[key] = int(value)
    return out


def _token_info(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Reply token ids and logprobs when the server sent them; ``None`` where it did not."""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    ids = choice.get("token_ids")  # vLLM >= 0.10 with return_token_ids
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        token_ids = list(ids)
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, list) and content:
        try:
            logprobs = [float(item["logprob"]) for item in content]
        except (KeyError, TypeError, ValueError):
            logprobs = None
        if token_ids is None:
            parsed = [
                _TOKEN_ID_RE.match(item["token"])
                if isinstance(item, dict) and isinstance(item.get("token"), str)
                else None
                for item in content
            ]
            if all(parsed):
                token_ids = [int(m.group(1)) for m in parsed if m]
    return token_ids, logprobs


def _error_detail(err: openai.APIStatusError) -> str:
    """The server's error message (its ``error.message``, else the start of the body)."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(message, str) and message:
            return scrub_surrogates(message[:300])
        try:
            return json.dumps(body)[:300]  # ASCII: surrogates stay escaped
        except RecursionError:
            pass
    try:
        return err.response.text[:300] or err.message
    except Exception:  # the body may be unreadable (streamed/closed)
        return err.message


def _retry_after(err: openai.APIStatusError) -> float | None:
    value = err.response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
