"""TTRL-streaming: the codec (JSON tensors, safetensors; never pickle), the rollout buffer, and
the training server + client + reward server end to end with a real tiny Planner, real
memory_serve and serve (scripted Executor LLM)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from role_fixtures import (
    build_tiny_model,
    executor_service,
    memory_service,
    plan_of,
    question_of,
    reward_service,
)

from mia.errors import MiaError
from mia.http import ServerThread
from ttrl_streaming import client as C
from ttrl_streaming.buffer import RolloutBuffer
from ttrl_streaming.codec import (
    CodecError,
    as_list,
    decode,
    encode,
    rollouts_from_safetensors,
    rollouts_to_safetensors,
)
from ttrl_streaming.config import load_config
from ttrl_streaming.server import StreamingServer, create_streaming_app

QUESTIONS = {f"Who founded company number {i}?": f"Founder {i}" for i in range(4)}


def executor_reply(messages) -> str:
    right = len(plan_of(messages)) % 2 == 0
    return f"<answer>{QUESTIONS[question_of(messages)] if right else 'Nobody'}</answer>"


# ----------------------------------------------------------------------------- codec / buffer


def test_codec_json_tensors_roundtrip_exactly() -> None:
    obj = {
        "ids": torch.tensor([[1, 2, 3], [4, 5, 6]]),
        "lp": torch.tensor([-0.5, -1.25], dtype=torch.float32),
        "nested": [torch.tensor([True, False]), "text", 3],
    }
    wire = encode(obj)
    assert wire["ids"] == {
        "__tensor__": True, "dtype": "int64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]
    }  # fmt: skip
    back = decode(json.loads(json.dumps(wire)))
    assert torch.equal(back["ids"], obj["ids"]) and torch.equal(back["lp"], obj["lp"])
    assert torch.equal(back["nested"][0], obj["nested"][0]) and back["nested"][1:] == ["text", 3]
    bad = [
        ({"__tensor__": True, "dtype": "object", "shape": [1], "data": [1]}, "dtype"),
        ({"__tensor__": True, "dtype": "int64", "shape": [2, 2], "data": [1, 2, 3]}, "4 numbers"),
        ({"__tensor__": True, "dtype": "int64", "shape": [-1], "data": []}, "non-negative"),
        ({"__tensor__": True, "dtype": "int64", "shape": [1], "data": ["x"]}, "numbers only"),
    ]
    for payload, message in bad:
        with pytest.raises(CodecError, match=message):
            decode(payload)
    assert as_list(encode(torch.tensor([3, 4])), int, "ids") == [3, 4]
    with pytest.raises(CodecError, match="integers"):
        as_list([1.5], int, "ids")


def test_codec_safetensors_rollouts_roundtrip_and_rejects_garbage() -> None:
    rows = [
        {"group": "g1", "prompt_ids": [5, 6], "response_ids": [7, 8, 9], "response_mask": [1, 0, 1],
         "rollout_logprobs": [-0.25, 0.0, -1.5], "reward": 1.0, "extras": {"j": "correct"}},
        {"group": "g1", "prompt_ids": [5], "response_ids": [10], "response_mask": [1],
         "rollout_logprobs": [-2.0], "reward": 0.0},
    ]  # fmt: skip
    data = rollouts_to_safetensors(rows, finish=True)
    assert b"pickle" not in data and data[8:9] == b"{"
    back, meta = rollouts_from_safetensors(data)
    assert meta == {"finish": True}
    assert back[0] == rows[0]
    assert back[1] == {**rows[1], "extras": {}}
    with pytest.raises(CodecError, match="too short"):
        rollouts_from_safetensors(b"\x01")
    with pytest.raises(CodecError, match="not a safetensors payload|longer than"):
        rollouts_from_safetensors(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")


def test_buffer_takes_whole_groups_in_arrival_order() -> None:
    buf = RolloutBuffer()
    rows = [SimpleNamespace(group=g, i=i) for i, g in enumerate("aabbbc")]
    assert buf.add(rows) == 6 and buf.groups == 3
    assert buf.take(7) is None and buf.rows == 6
    taken = buf.take(3)
    assert [(r.group, r.i) for r in taken] == [("a", 0), ("a", 1), ("b", 2), ("b", 3), ("b", 4)]
    assert buf.rows == 1 and [r.group for r in buf.take_all()] == ["c"] and buf.rows == 0


def test_client_never_sends_ground_truth() -> None:
    sample = {"data_id": 3, "question": "Q?", "golds": ["A"], "image_caption": "", "images": []}
    assert C.wire_sample(sample) == {"data_id": "3", "question": "Q?"}


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("streaming")
    model = build_tiny_model(root / "model")
    with (
        reward_service(root / "gts.sqlite") as reward_url,
        memory_service(root / "mem.sqlite") as (memory_url, memory),
        executor_service(executor_reply) as (serve_url, _),
    ):
        cfg = load_config(
            "server",
            [
                f"model_path={model}",
                f"run_dir={root / 'run'}",
                f"services.executor_url={serve_url}",
                f"services.memory_url={memory_url}",
                f"services.reward_url={reward_url}",
                "trainer.batch_size=2",
                "trainer.n=2",
                "trainer.logging.console=false",
                "trainer.policy.optim.lr=1e-3",
                "episode.plan_max_tokens=12",
                "episode.decision_max_tokens=6",
                "episode.replan_max_tokens=8",
                "memory.evaluate=false",
            ],
        )
        server = StreamingServer(cfg).start()
        try:
            with ServerThread(create_streaming_app(server)) as url:
                yield SimpleNamespace(
                    url=url, reward_url=reward_url, server=server, memory=memory, root=root
                )
        finally:
            server.close()


def _error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]["message"]


def test_malformed_submissions_are_4xx(stack) -> None:
    url = f"{stack.url}/submit_sample"
    assert "no update yet" in _error(httpx.post(f"{stack.url}/save_checkpoint"), 400)
    assert "question" in _error(httpx.post(url, json={"samples": [{"data_id": "x"}]}), 422)
    msg = _error(httpx.post(url, json={"samples": [{"data_id": "x", "question": "  "}]}), 422)
    assert msg == "samples.0.question: Value error, must not be empty"
    assert _error(httpx.post(url, json={}), 422) == (
        "send samples or rollouts (or finish / flush_partial)"
    )
    assert "malformed JSON" in _error(
        httpx.post(url, content=b"{", headers={"content-type": "application/json"}), 400
    )
    assert "must be application/json or application/x-safetensors" in _error(
        httpx.post(url, content=b"hi", headers={"content-type": "text/plain"}), 415
    )
    row = {"group": "g", "prompt_ids": [1, 2], "response_ids": [3, 4], "reward": 1.0}
    assert "response_mask has 1 entries for 2 tokens" in _error(
        httpx.post(url, json={"rollouts": [{**row, "response_mask": [1]}]}), 422
    )
    assert "token ids must be in [0, " in _error(
        httpx.post(
            url, json={"rollouts": [{**row, "response_ids": [3, 10**6], "response_mask": [1, 1]}]}
        ),
        422,  # fmt: skip
    )
    both = {
        "samples": [{"data_id": "a", "question": "Q?"}],
        "rollouts": [{**row, "response_mask": [1, 1]}],
    }
    assert "not both" in _error(httpx.post(url, json=both), 422)
    assert "safetensors" in _error(
        httpx.post(url, content=b"garbage!", headers={"content-type": "application/x-safetensors"}),
        400,
    )
    assert stack.server.buffer.rows == 0 and stack.server.trainer.step == 0


def test_client_streams_a_dataset_and_the_server_updates(stack, tmp_path: Path) -> None:
    data = tmp_path / "stream.jsonl"
    rows = [
        {"id": f"s{i}", "question": q, "answer": a} for i, (q, a) in enumerate(QUESTIONS.items())
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    before = stack.server.trainer.step
    C.main(
        ["--data", str(data), "--server", stack.url, "--reward-url", stack.reward_url,
         "--batch-size", "2", "--save-every", "1"],
        out=out,
    )  # fmt: skip
    lines = out.getvalue().splitlines()
    # 4 questions x n=2 = 8 rollouts; an update every 2 questions x 2 rollouts.
    assert stack.server.trainer.step == before + 2
    assert lines[0].startswith("[2/4] step | step 1 | buffer 0 | reward ")
    assert lines[1].startswith("checkpoint: step 1 -> ")
    assert lines[2].startswith("[4/4] step | step 2 | buffer 0 | reward ")
    assert [x.split(" -> ")[0] for x in lines if x.startswith("checkpoint")] == [
        "checkpoint: step 1", "checkpoint: step 2"
    ]  # fmt: skip
    assert lines[-1] == "done: 4 questions streamed, 2 updates"
    assert httpx.get(f"{stack.reward_url}/health").json()["registered_gts"] >= 4
    health = httpx.get(f"{stack.url}/health").json()
    assert (health["global_steps"], health["rollout_buffer_len"], health["done"]) == (
        before + 2, 0, True
    )  # fmt: skip
    ckpt = stack.root / "run" / "checkpoints" / f"global_step_{before + 2}" / "COMPLETE"
    assert ckpt.is_file()
    # The memory hooks ran: every question was consolidated into memory.
    assert {r.question for r in stack.memory.store.records()} >= set(QUESTIONS)
    assert stack.memory.store.stats()["buffered_rollouts"] == 0


def test_client_rollouts_concurrently_and_as_safetensors(stack) -> None:
    url = f"{stack.url}/submit_sample"
    tok = stack.server.trainer.generator.tokenizer
    ids = tok.encode("plan: search the founder", add_special_tokens=False)

    def group(name: str, rewards: list[float]) -> list[dict]:
        return [
            {"group": name, "prompt_ids": ids[:3], "response_ids": ids[3:], "reward": r,
             "response_mask": [1] * len(ids[3:]),
             "rollout_logprobs": encode(torch.full((len(ids[3:]),), -1.0))}
            for r in rewards
        ]  # fmt: skip

    before = stack.server.trainer.step
    answers: list[dict] = []
    threads = [
        threading.Thread(
            target=lambda g=g: answers.append(httpx.post(url, json={"rollouts": group(g, [1.0, 0.0])}, timeout=300).json())
        )
        for g in ("x", "y")
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 2 groups x 2 rows = train_batch_size x n: exactly one update, whoever completed it.
    assert sorted(a["status"] for a in answers) == ["rollout", "step"]
    assert stack.server.trainer.step == before + 1 and stack.server.buffer.rows == 0
    rows = [{**r, "rollout_logprobs": [-1.0] * len(ids[3:])} for r in group("z", [0.0, 1.0])]
    body = rollouts_to_safetensors(rows)
    resp = httpx.post(
        f"{url}?flush_partial=true", content=body,
        headers={"content-type": "application/x-safetensors"}, timeout=300,
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert (got["status"], got["global_steps"], got["rollout_buffer_len"]) == (
        "step",
        before + 2,
        0,
    )
    assert got["metrics"]["rollout/n"] == 2.0


def test_stdin_mode_prints_answers_and_rewards(stack) -> None:
    out = io.StringIO()
    stdin = io.StringIO(
        "Who founded company number 1?\tFounder 1\n"
        '{"question": "Who founded company number 2?", "answer": "Founder 2"}\n'
        "A question without feedback\n"
    )
    C.main(
        ["--stdin", "--server", stack.url, "--reward-url", stack.reward_url, "--save-every", "0"],
        stdin=stdin,
        out=out,
    )
    lines = out.getvalue().splitlines()
    rollouts = [x for x in lines if x.startswith("  rollout ")]
    assert len(rollouts) == 4
    assert all(" | reward " in x and ("| correct" in x or "| incorrect" in x) for x in rollouts)
    assert "skipped: no feedback answer for this question" in lines
    assert lines[-1].startswith("done: 2 questions streamed, ")


def test_client_argument_errors() -> None:
    with pytest.raises(MiaError, match="--batch-size"):
        C.main(["--data", "x.jsonl", "--batch-size", "0"])
    with pytest.raises(MiaError, match="data file not found"):
        C.main(["--data", "/nonexistent.jsonl", "--server", "http://127.0.0.1:9"])
