"""Safe by default, across the services: bearer tokens from a file or the environment (never an
empty one), and an LLM reply whose ``usage`` block is not numbers is an upstream fault."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mia.errors import MiaError
from mia.http import add_server_args, create_app, wait_for_port_file

ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="svc")
    add_server_args(p, default_port=1, env_prefix="SAFE_TEST")
    return p


def test_token_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SAFE_TEST_TOKEN", raising=False)
    assert _parser().parse_args([]).token is None
    monkeypatch.setenv("SAFE_TEST_TOKEN", "from-env")
    assert _parser().parse_args([]).token == "from-env"
    assert capsys.readouterr().err == ""  # the environment is the quiet way
    f = tmp_path / "token"
    f.write_text("  from-file  \nignored second line\n")
    assert _parser().parse_args(["--token-file", str(f)]).token == "from-file"
    assert capsys.readouterr().err == ""
    assert _parser().parse_args(["--token", "on-the-line"]).token == "on-the-line"
    assert capsys.readouterr().err == (
        "svc: warning: --token is visible to other users in `ps`; prefer --token-file PATH or "
        "the environment variable\n"
    )
    # Empty, from any source, is refused: it would silently turn auth off.
    monkeypatch.setenv("SAFE_TEST_TOKEN", "")
    with pytest.raises(MiaError, match=r"empty bearer token \(--token or SAFE_TEST_TOKEN\)"):
        _parser().parse_args([])
    monkeypatch.delenv("SAFE_TEST_TOKEN")
    with pytest.raises(MiaError, match="empty bearer token"):
        _parser().parse_args(["--token", ""])
    f.write_text("\n  \n")
    with pytest.raises(MiaError, match=f"--token-file {f} is empty"):
        _parser().parse_args(["--token-file", str(f)])
    with pytest.raises(MiaError, match="cannot read --token-file nope: No such file or directory"):
        _parser().parse_args(["--token-file", "nope"])
    f.write_text("t")
    with pytest.raises(SystemExit):  # both: argparse says they exclude each other
        _parser().parse_args(["--token", "a", "--token-file", str(f)])
    # And the app factory refuses an empty token too (in-process callers).
    with pytest.raises(MiaError, match="the bearer token is empty"):
        create_app("svc", token="")


SERVICES = {
    "memory_serve": (["-m", "memory_serve"], "MEMORY_SERVE_TOKEN"),
    "serve": (["-m", "serve"], "SERVE_TOKEN"),
    "local_search": (["-m", "local_search", "serve", "--index", "idx"], "LOCAL_SEARCH_TOKEN"),
    "web_tools": (["-m", "web_tools", "serve"], "WEB_TOOLS_TOKEN"),
    "reward_server": (["-m", "ttrl_streaming.reward_server"], "REWARD_SERVER_TOKEN"),
    "ttrl_streaming.server": (["-m", "ttrl_streaming.server"], "STREAMING_TOKEN"),
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_TOKEN")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


@pytest.mark.parametrize("name", list(SERVICES))
def test_empty_token_refuses_to_start(name: str, tmp_path: Path) -> None:
    args, env_name = SERVICES[name]
    runs = [([*args, "--token", ""], _env())]
    if name in ("memory_serve", "serve"):  # the environment variable path, for two of them
        runs.append((args, _env(**{env_name: ""})))
    for argv, env in runs:
        proc = subprocess.run(
            [sys.executable, *argv, "--port", "0"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "error: empty bearer token (--token or " in lines[0], lines
        assert "Traceback" not in proc.stderr


def test_token_file_service_keeps_the_token_out_of_ps(tmp_path: Path) -> None:
    from local_search import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": i, "contents": f"passage about {w}"}) + "\n"
            for i, w in enumerate(["apples", "rivers", "castles", "volcanoes"])
        )
    )
    build_index(corpus, tmp_path / "idx", "bm25")
    secret = "s3cret-from-a-file"
    (tmp_path / "token").write_text(secret + "\n")
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_search", "serve", "--index", str(tmp_path / "idx"),
         "--port", "0", "--port-file", str(port_file), "--token-file", str(tmp_path / "token")],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = wait_for_port_file(port_file, timeout=60, proc=proc)
        url = f"http://127.0.0.1:{port}/retrieve"
        body = {"queries": ["volcanoes"], "topk": 1}
        assert httpx.post(url, json=body, timeout=30).status_code == 401
        wrong = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, json=body, headers=wrong, timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {secret}"}
        r = httpx.post(url, json=body, headers=auth, timeout=30)
        assert r.status_code == 200 and r.json()["result"][0][0]["id"] == 3
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert secret.encode() not in cmdline  # what `ps` shows
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert secret not in err and "warning" not in err


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"prompt_tokens": "lots"}, "usage.prompt_tokens is not a number: 'lots'"),
        ({"completion_tokens": True}, "usage.completion_tokens is not a number: True"),
        ({"prompt_tokens": -3}, "usage.prompt_tokens is not a token count: -3"),
        ({"prompt_tokens": 2.5}, "usage.prompt_tokens is not a token count: 2.5"),
        ("many", "usage is not an object: 'many'"),
    ],
)
def test_non_numeric_usage_is_a_malformed_reply(usage: object, why: str) -> None:
    from mia.llm.openai_backend import OpenAIChat, _GarbageReply

    chat = OpenAIChat(base_url="http://127.0.0.1:9/v1", model="m")
    reply = {"choices": [{"message": {"content": "hi"}}], "usage": usage}
    with pytest.raises(_GarbageReply, match=f"^{why}"):
        chat._parse(json.dumps(reply))
    reply["usage"] = {"prompt_tokens": 4.0, "completion_tokens": None}
    result = chat._parse(json.dumps(reply))
    assert (result.prompt_tokens, result.completion_tokens) == (4, 0)
