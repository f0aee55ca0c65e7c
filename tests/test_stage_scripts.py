"""scripts/*.sh for every stage: syntax (bash -n), --help (exit 0, usage), and the exact command
each one runs (DRY_RUN=1 prints it instead of running it)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
STAGES = [
    "serve_llm",
    "local_search",
    "web_tools",
    "memory_serve",
    "serve",
    "train_executor",
    "train_planner",
    "ttrl",
    "streaming_server",
    "streaming_client",
    "reward_server",
    "merge",
]


def bash(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "PORT", "HOST")}
    full_env.update({"PYTHON": "py", **env})
    return subprocess.run(
        ["bash", str(SCRIPTS / f"{script}.sh"), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=30,
    )


def dry(script: str, *args: str, **env: str) -> list[list[str]]:
    proc = bash(script, *args, DRY_RUN="1", **env)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("name", [*STAGES, "_common"])
def test_syntax(name: str) -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPTS / f"{name}.sh")], capture_output=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", STAGES)
def test_help(name: str) -> None:
    for flag in ("--help", "-h"):
        proc = bash(name, flag)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: scripts/{name}.sh"), proc.stdout
        assert "DRY_RUN=1" in proc.stdout


def test_serve_llm_commands() -> None:
    cpu = dry("serve_llm", "executor", "--seed", "1", DEVICE="cpu", VLLM_PYTHON="vpy")
    assert cpu == [
        [
            "vpy", "-m", "vllm.entrypoints.openai.api_server",
            "--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--served-model-name", "qwen",
            "--host", "127.0.0.1", "--port", "8000",
            "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.2",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--enforce-eager", "--seed", "1",
        ]
    ]  # fmt: skip
    gpu = dry(
        "serve_llm", "manager", DEVICE="gpu", VLLM_PYTHON="vpy", TP="4", MAX_MODEL_LEN="32768"
    )
    assert gpu == [
        [
            "vpy", "-m", "vllm.entrypoints.openai.api_server",
            "--model", "Qwen/Qwen3-32B", "--served-model-name", "qwen",
            "--host", "127.0.0.1", "--port", "8002",
            "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.8",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--max-model-len", "32768",
        ]
    ]  # fmt: skip
    assert dry("serve_llm", "judge", DEVICE="gpu", MODEL="m", PORT="9")[0][3:11] == [
        "--model", "m", "--served-model-name", "qwen", "--host", "127.0.0.1", "--port", "9",
    ]  # fmt: skip


def test_service_commands(tmp_path: Path) -> None:
    idx = tmp_path / "idx"
    assert dry("local_search", CORPUS="c.jsonl", INDEX=str(idx)) == [
        ["py", "-m", "local_search", "build", "--corpus", "c.jsonl", "--out", str(idx),
         "--method", "bm25"],
        ["py", "-m", "local_search", "serve", "--index", str(idx), "--host", "127.0.0.1",
         "--port", "8001"],
    ]  # fmt: skip
    idx.mkdir()  # an existing index is served, not rebuilt
    assert [c[3] for c in dry("local_search", INDEX=str(idx))] == ["serve"]
    assert dry("memory_serve", "store.retrieval.top_k=3", LLM_CONFIG="vllm", DB="m.db") == [
        ["py", "-m", "memory_serve", "--config", "default", "--host", "127.0.0.1",
         "--port", "5000", "--db", "m.db", "llm.config=vllm", "store.retrieval.top_k=3"],
    ]  # fmt: skip
    assert dry("serve", CONFIG="s.yaml") == [
        ["py", "-m", "serve", "--config", "s.yaml", "--host", "127.0.0.1", "--port", "5001"]
    ]
    assert dry("web_tools", PORT="9003")[0][-2:] == ["--port", "9003"]
    assert dry("reward_server", REWARD_FN="my.mod:fn", REWARD_CONFIG="nogt", JUDGE="panel") == [
        ["py", "-m", "ttrl_streaming.reward_server", "--host", "127.0.0.1", "--port", "6000",
         "--reward-fn", "my.mod:fn", "--judge", "panel", "--llm", "embedded",
         "--reward-config", "nogt"],
    ]  # fmt: skip


def test_training_commands() -> None:
    assert dry("train_executor", "trainer.epochs=1") == [
        ["py", "-m", "executor_train", "trainer.epochs=1"]
    ]
    assert dry("train_planner", CONFIG_NAME="small") == [
        ["py", "-m", "planner_train", "--config-name", "small"]
    ]
    assert dry("ttrl", "nogt", "x=1") == [["py", "-m", "ttrl", "mode=nogt", "x=1"]]
    assert dry("ttrl") == [["py", "-m", "ttrl", "mode=supervised"]]
    assert dry("streaming_server", "a=1") == [["py", "-m", "ttrl_streaming.server", "a=1"]]
    assert dry("streaming_client", "--data", "d") == [
        ["py", "-m", "ttrl_streaming.client", "--data", "d"]
    ]


def test_merge_command_and_missing_arguments() -> None:
    assert dry("merge", "ckpt/global_step_5/actor", "out/hf", "--dtype", "bfloat16") == [
        ["py", "-m", "mia.rl.model_merger", "merge", "--backend", "fsdp",
         "--local_dir", "ckpt/global_step_5/actor", "--target_dir", "out/hf",
         "--dtype", "bfloat16"],
    ]  # fmt: skip
    proc = bash("merge")
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("merge.sh: error: LOCAL_DIR and TARGET_DIR are required")
