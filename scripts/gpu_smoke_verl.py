"""The ``verl`` check of scripts/gpu_smoke.py: one training step of each recipes/verl recipe
(executor_grpo, planner_grpo, ttrl) with veRL, and the same step with ``mia.rl`` (the role's
CLI on vLLM), on a random-initialised small Qwen2.5-VL-shaped model; prints step time and
tokens/s side by side.

Prepared for a one-GPU machine with veRL 0.9 (and its vLLM) installed in ``VERL_PYTHON`` and
MIA's GPU extra in the smoke's own Python; it has NOT run on a GPU yet (docs/benchmarks.md).
Everything is local and offline: the model is built from a config (random weights, the
offline tokenizer), the services (local_search BM25, memory_serve, serve with a scripted
frozen Executor) run in this process on loopback ports, the judge is the rule judge.

Per recipe, a line ``PASS verl/<recipe>: veRL step S s, T tokens/s | mia.rl step S s, T
tokens/s``; SKIP when there is no GPU or no veRL, FAIL with the last line of a failed run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"executor_grpo": "executor_train", "planner_grpo": "planner_train", "ttrl": "ttrl"}
# A small Qwen2.5-VL shape (~0.25 B parameters with the offline tokenizer's vocabulary).
SMALL_TEXT = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
              "num_attention_heads": 16, "num_key_value_heads": 2}  # fmt: skip
SMALL_VISION = {"depth": 4, "hidden_size": 512, "intermediate_size": 1024, "num_heads": 8,
                "out_hidden_size": 1024, "fullatt_block_indexes": [3]}  # fmt: skip
QUESTIONS = [
    ("Who founded Vorlanic Institute?", "Kaleth Morvaine"),
    ("Where was Ilsa Drovan born?", "Velmora"),
    ("When was Vorlanic Institute founded?", "1871"),
    ("Which river flows through Velmora?", "Vohund"),
]
PASSAGES = [
    "Vorlanic Institute\nVorlanic Institute was founded by Kaleth Morvaine in 1871.",
    "Ilsa Drovan\nIlsa Drovan was born in Velmora in 1952.",
    "Velmora\nVelmora is a city on the Vohund River.",
]


def small_model(out: Path) -> Path:
    from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen25vl

    tok = build_tokenizer()
    return save_tiny(
        tiny_qwen25vl(
            tok,
            vision_config=SMALL_VISION,
            **SMALL_TEXT,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [8, 12, 12],
            },
        ),  # fmt: skip
        tok,
        out,
    )


def data(work: Path) -> Path:
    from mia.data.formats import QAItem, write_jsonl_qa

    items = [
        QAItem(id=f"q{i}", question=q, answers=[a], extra={"plan": "1. Search.\n2. Answer."})
        for i, (q, a) in enumerate(QUESTIONS)
    ]
    path = work / "questions.jsonl"
    write_jsonl_qa(items, path)
    return path


def services(stack: ExitStack, work: Path) -> dict[str, str]:
    """local_search, memory_serve (scripted Planner) and serve (scripted frozen Executor)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from role_fixtures import executor_service, memory_service  # the tests' real services

    from local_search import ServeConfig, build_index, open_index
    from local_search.server import create_search_app
    from mia.http import ServerThread
    from mia.llm.scripted import ScriptedChat

    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n"
                              for i, p in enumerate(PASSAGES)))  # fmt: skip
    build_index(corpus, work / "idx", method="bm25")
    index = stack.enter_context(open_index(work / "idx"))
    search = stack.enter_context(ServerThread(create_search_app(index, ServeConfig())))
    planner = ScriptedChat(lambda m: "<think>x</think>\n1. Search the question again.")
    memory, _ = stack.enter_context(
        memory_service(
            work / "mem.sqlite", planner=planner, overrides=("planner.cold_start=false",)
        )
    )
    executor, _ = stack.enter_context(executor_service(lambda m: "<answer>Velmora</answer>"))
    return {"search": search, "memory": memory, "executor": executor}


def verl_step(recipe: str, model: Path, parquet: Path, urls: dict[str, str], work: Path,
              timeout_s: float) -> dict[str, float]:  # fmt: skip
    """One veRL step of ``recipe`` on one GPU; its console metrics."""
    py = os.environ.get("VERL_PYTHON") or str(ROOT / ".venv-verl" / "bin" / "python")
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={parquet}",
        f"data.val_files={parquet}", "data.train_batch_size=4", "data.max_prompt_length=4096",
        "data.max_response_length=2048", "data.filter_overlong_prompts=false",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.max_model_len=8192",
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.logger=[console]", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={work / 'ckpt' / recipe}",
        "reward.custom_reward_function.reward_kwargs.judge={type: rules}",
        "reward.custom_reward_function.reward_kwargs.llm=embedded",
        f"mia.services.memory_url={urls['memory']}",
    ]  # fmt: skip
    if recipe == "executor_grpo":
        overrides += [f"mia.agent.tools.search.params.url={urls['search']}",
                      "mia.judge={type: rules}", "mia.llm=embedded",
                      "mia.agent.sampling={max_tokens: 256}"]  # fmt: skip
    else:
        overrides += [f"mia.services.executor_url={urls['executor']}", "data.apply_chat_template_kwargs={}",
                      "mia.episode.plan_max_tokens=256", "mia.episode.decision_max_tokens=32",
                      "mia.episode.replan_max_tokens=128"]  # fmt: skip
    if recipe == "ttrl":
        overrides += [
            f"mia.ttrl.eval_dir={work / 'ttrl-eval'}",
            f"mia.ttrl.save_path={work / 'ttrl-mem'}",
        ]
    cmd = [py, "-m", "verl.trainer.main_ppo", f"--config-path={ROOT / 'recipes/verl/config'}",
           f"--config-name={recipe}", *overrides]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    (work / f"verl-{recipe}.log").write_text(log)
    if proc.returncode != 0:
        raise RuntimeError(
            f"veRL {recipe} exited {proc.returncode}: {log.strip().splitlines()[-1]}"
        )
    step = re.findall(r"timing_s/step:([0-9.eE+-]+)", log)
    tps = re.findall(r"perf/throughput:([0-9.eE+-]+)", log)
    if not step:
        raise RuntimeError(f"veRL {recipe}: no timing_s/step in its log ({work}/verl-{recipe}.log)")
    return {"step_s": float(step[-1]), "tokens_per_s": float(tps[-1]) if tps else float("nan")}


def mia_step(recipe: str, model: Path, questions: Path, urls: dict[str, str], work: Path,
             timeout_s: float) -> dict[str, float]:  # fmt: skip
    """The same step with mia.rl (the role's CLI, vLLM colocated: asleep while the policy
    trains, the policy offloaded while vLLM runs); its metrics.jsonl."""
    role = RECIPES[recipe]
    run_dir = work / f"mia-{recipe}"
    common = [
        f"model_path={model}", "judge=rules", "trainer.batch_size=4", "trainer.n=2",
        "trainer.workers.mode=single_process", "trainer.generator.backend=vllm",
        "trainer.generator.placement=driver", "trainer.generator.sleep_mode=on",
        "trainer.generator.gpu_memory_utilization=0.4", "trainer.generator.max_model_len=8192",
        "trainer.policy.offload=true", "trainer.save_freq=-1", f"trainer.run_dir={run_dir}",
        "trainer.logging.console=false", "trainer.total_steps=1", "trainer.rollout_errors=raise",
    ]  # fmt: skip
    if role == "executor_train":
        args = [f"data.train={questions}", "data.text_only=false", f"services.memory_url={urls['memory']}",
                f"agent.tools.search.params.url={urls['search']}", "agent.sampling.max_tokens=256",
                "agent.context_budget=6144"]  # fmt: skip
    elif role == "planner_train":
        args = [f"data.train={questions}", f"services.executor_url={urls['executor']}",
                f"services.memory_url={urls['memory']}", "episode.plan_max_tokens=256",
                "episode.decision_max_tokens=32", "episode.replan_max_tokens=128"]  # fmt: skip
    else:
        args = [f"data.test={questions}", f"run_dir={work / 'mia-ttrl-run'}",
                f"services.executor_url={urls['executor']}", f"services.memory_url={urls['memory']}",
                "episode.plan_max_tokens=256", "episode.decision_max_tokens=32",
                "episode.replan_max_tokens=128"]  # fmt: skip
        common = [c for c in common if not c.startswith(("trainer.total_steps", "trainer.run_dir"))]
        run_dir = work / "mia-ttrl-run"
    cmd = [sys.executable, "-m", role, *common, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(
            f"mia.rl {role} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip().splitlines()[-1]}"
        )
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    m = rows[0]
    return {"step_s": float(m["time/step"]), "tokens_per_s": float(m["perf/tokens_per_s"])}


def check_verl(work: Path, timeout_s: float = 1200.0) -> list[tuple[str, str, str]]:
    """``[(name, status, detail)]``: one line per recipe."""
    import torch

    if not torch.cuda.is_available():
        return [("verl", "SKIP", "no GPU: veRL trains on GPUs only")]
    py = os.environ.get("VERL_PYTHON") or str(ROOT / ".venv-verl" / "bin" / "python")
    probe = subprocess.run([py, "-c", "import verl, vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [("verl", "SKIP", f"{py} cannot import verl and vllm (set VERL_PYTHON)")]
    from mia.verl.data import prepare

    out = []
    model = small_model(work / "small-vl")
    questions = data(work)
    with ExitStack() as stack:
        urls = services(stack, work)
        for recipe in RECIPES:
            kind = {"executor_grpo": "executor", "planner_grpo": "planner", "ttrl": "ttrl"}[recipe]
            parquet = prepare(kind, questions, work / f"{recipe}.parquet")
            t0 = time.perf_counter()
            try:
                v = verl_step(recipe, model, parquet, urls, work, timeout_s)
                m = mia_step(recipe, model, questions, urls, work, timeout_s)
            except Exception as err:  # one recipe's failure must not hide the others
                out.append((f"verl/{recipe}", "FAIL", f"{type(err).__name__}: {err}"))
                continue
            out.append((f"verl/{recipe}", "PASS",
                        f"veRL step {v['step_s']:.1f} s, {v['tokens_per_s']:,.0f} tokens/s/GPU | "
                        f"mia.rl step {m['step_s']:.1f} s, {m['tokens_per_s']:,.0f} tokens/s "
                        f"[{time.perf_counter() - t0:.0f} s]"))  # fmt: skip
    return out
