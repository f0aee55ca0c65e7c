"""MIA's agent loops under veRL 0.9's own classes, against a fake LLM server.

veRL's ``AgentLoopWorker`` runs a batch that veRL's ``RLHFDataset`` built from a parquet written
by ``python -m mia.verl.data``; the worker instantiates ``mia_executor`` / ``mia_planner`` from
the recipe's agent loop file, pads their outputs, computes the multimodal inputs and sends each
rollout to veRL's ``RewardLoopWorker`` (the reward manager of the recipe, calling
``mia.verl.rewards.compute_score``; the data crosses a pickle round trip, as over Ray). The
LLM server is scripted over the real tokenizer; the services are real (local_search BM25,
memory_serve for ``/plan`` and ``/replan_train``, serve for the frozen Executor).

Each rollout is compared with the same sample run through MIA's own engine (``mia.rl``'s
episode on the same scripted generator): the same prompt ids, response ids and mask
(observations, injected turns and image pads 0), the same images and pixel values, and a
reward from veRL's reward manager equal to ``mia.rewards``' on that trajectory.

Runs in .venv-peers; in the main .venv, which has no veRL, the module skips."""

from __future__ import annotations

import asyncio
import io
import json
import pickle
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

try:
    import numpy as np
    import verl  # noqa: F401
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.replica import TokenOutput
except Exception as exc:  # ImportError, or veRL's own imports failing beside our stack
    pytest.skip(
        f"veRL not importable here ({type(exc).__name__}: {exc}); the veRL tests run in "
        ".venv-peers: bash scripts/install_peers.sh",
        allow_module_level=True,
    )

from PIL import Image
from role_fixtures import (
    EXECUTOR_GOLD,
    EXECUTOR_PASSAGES,
    PLAN_COLUMN,
    PLAN_FROM_SERVICE,
    ScriptedGenerator,
    executor_service,
    memory_service,
    search_service,
)
from verl_recipes import CONFIG_DIR, compose

from mia.data.formats import QAItem, write_jsonl_qa
from mia.llm.base import SamplingParams
from mia.llm.scripted import ScriptedChat
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2, tiny_qwen25vl
from mia.rl.episode import Rollout
from mia.roles.samples import load_samples
from mia.verl.data import prepare

GOLD = {**EXECUTOR_GOLD, "What colour is this emblem?": "red"}
REPLAN = "1. Search the birthplace again."
IMAGE_SIZE = 56  # one 4x4 patch grid: 4 image pads per image after the 2x2 merge
N = 2


def _call(name: str, args: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def executor_reply(prompt: str) -> str:
    """Per question, deterministic (the n rollouts of a prompt are alike): e1 searches and
    answers right; e2 searches, answers wrong, gets /replan_train's plan and answers right;
    the image question calls the image search once and answers."""
    question = next(q for q in GOLD if q in prompt)
    turns = prompt.split("<|im_start|>assistant\n")[1:]
    if len(turns) == 1:
        if "emblem" in question:
            return "<think>look it up</think>\n" + _call(
                "web_image_to_image_search", {"img_idx": "0"}
            )
        return "<think>search first</think>\n" + _call("search", {"query_list": [question]})
    if "I have a revised plan for you to follow" in turns[-2]:
        return f"<think>follow the revised plan</think>\n<answer>{GOLD[question]}</answer>"
    answer = "Nobody" if "Ilsa" in question else GOLD[question]
    return f"<think>read the result</think>\n<answer>{answer}</answer>"


def planner_service_reply(messages: list[dict]) -> str:
    if "You decided to reflect and replan" in messages[-1]["content"]:
        return f"<think>the answer was wrong</think>\n{REPLAN}"
    return f"<think>memories</think>\n{PLAN_FROM_SERVICE}"


class FakeServer:
    """veRL's LLM server client (``generate(request_id, *, prompt_ids, sampling_params,
    image_data)`` -> ``TokenOutput``) with scripted replies over the real tokenizer."""

    def __init__(self, tokenizer: Any, reply: Any) -> None:
        self.gen = ScriptedGenerator(tokenizer, reply)
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any
    ) -> TokenOutput:
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "sampling": dict(sampling_params),
                **kwargs,
            }
        )
        res = await self.gen.generate(prompt_ids)
        lps = res.logprobs if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=res.token_ids, log_probs=lps, stop_reason="completed")


class _Remote:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:  # Ray copies the arguments: so does this
        return self.fn(*[pickle.loads(pickle.dumps(a)) for a in args])


class RewardHandle:
    """A reward loop worker handle: veRL's own RewardLoopWorker, called as over Ray."""

    def __init__(self, config: Any) -> None:
        self.worker = RewardLoopWorker(config)
        self.compute_score = _Remote(self.worker.compute_score)


def no_video_processor(tokenizer: Any) -> Any:
    """Qwen2.5-VL's processor without its video processor (torchvision is not usable here)."""
    from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mia.vision import image_processor_config

    class Processor(Qwen2_5_VLProcessor):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return [a for a in super().get_attributes() if a != "video_processor"]

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, **kw: Any) -> None:
            super().__init__(
                image_processor=image_processor, tokenizer=tokenizer, video_processor=None, **kw
            )

    settings = {
        k: v
        for k, v in image_processor_config().items()
        if k not in ("image_processor_type", "processor_class")
    }
    return Processor(
        image_processor=Qwen2VLImageProcessorPil(**settings),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "vl": save_tiny(tiny_qwen25vl(tok), tok, root / "vl"),
        "text": save_tiny(tiny_qwen2(tok), tok, root / "text"),
    }


@pytest.fixture(scope="module")
def search_url(tmp_path_factory: pytest.TempPathFactory):
    with search_service(tmp_path_factory.mktemp("search"), EXECUTOR_PASSAGES) as url:
        yield url


def _png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _image_cache(root: Path) -> Path:
    cache = root / "cache" / "v1"
    cache.mkdir(parents=True)
    (cache / "meta.json").write_text(json.dumps({"search_results": [{"title": "A red emblem"}]}))
    Image.new("RGB", (20, 20), (200, 0, 0)).save(cache / "img_000.png")
    return root / "cache"


def _items() -> list[QAItem]:
    return [
        QAItem(
            id="e1",
            question="Who founded Vorlanic Institute?",
            answers=["Kaleth Morvaine"],
            extra={"plan": PLAN_COLUMN, "memories_context": "MEMORY CONTEXT OF e1"},
        ),  # fmt: skip
        QAItem(id="e2", question="Where was Ilsa Drovan born?", answers=["Velmora"]),
        QAItem(
            id="v1",
            question="What colour is this emblem?",
            answers=["red"],
            modality="text-image",
            images=[_png((0, 0, 255))],
            image_caption="an emblem",
        ),  # fmt: skip
    ]


def _batch(parquet: Path, cfg: Any, tok: Any, processor: Any, n: int) -> DataProto:
    dataset = RLHFDataset([str(parquet)], tok, cfg.data, processor=processor)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch))], dtype=object
    )
    return batch.repeat(repeat_times=n, interleave=True)


async def generate(
    cfg: Any, server: FakeServer, batch: DataProto, processor: Any = None
) -> DataProto:
    """veRL's AgentLoopWorker over ``batch`` (workers are built in the running loop, as in
    their Ray actors); ``processor``: a VL model's, in place of the one veRL could not load."""
    worker = AgentLoopWorker(cfg, server, reward_loop_worker_handles=[RewardHandle(cfg)])
    if processor is not None:
        worker.processor = processor
    return await worker.generate_sequences(batch)


async def scored_rollouts(
    episode: Any, reward: Any, gen: Any, samples: Path, max_tokens: int
) -> list[tuple[Any, float, dict]]:
    """mia.rl's side: each sample of the ``samples`` file through ``episode`` on ``gen``, with
    its ``reward`` (then the episode is closed)."""
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, logprobs=True)
    res = []
    for sample in load_samples(samples):
        out = await episode.run(sample, Rollout(generator=gen, sampling=sampling))
        res.append((out, *await reward(sample, out)))
    await episode.aclose()
    return res


def _rows(out: DataProto) -> list[dict[str, Any]]:
    """Each output row unpadded: prompt ids, response ids, mask, logprobs, score."""
    rows = []
    for i in range(len(out)):
        b = out.batch
        width = b["prompts"].shape[1]
        attn = b["attention_mask"][i]
        prompt = b["prompts"][i][attn[:width].bool()].tolist()
        r_len = int(attn[width:].sum())
        rows.append(
            {
                "prompt": prompt,
                "response": b["responses"][i][:r_len].tolist(),
                "mask": b["response_mask"][i][:r_len].tolist(),
                "logprobs": b["rollout_log_probs"][i][:r_len].tolist(),
                "score": float(b["rm_scores"][i].sum()),
                "score_at_end": float(b["rm_scores"][i][r_len - 1]),
            }
        )
    return rows


# ----------------------------------------------------------------------------- executor


def test_verl_executor_agent_loop_matches_mia_rl(
    tmp_path: Path, tok: Any, models: dict, search_url: str
) -> None:
    from executor_train.episode import ExecutorEpisode, ExecutorReward
    from mia.agent import build_tools
    from mia.judge.rules import RuleJudge
    from mia.services import MemoryClient
    from mia.verl.config import load_mia_config

    cache = _image_cache(tmp_path)
    write_jsonl_qa(_items(), tmp_path / "train.jsonl")
    parquet = prepare("executor", tmp_path / "train.jsonl", tmp_path / "train.parquet")
    processor = no_video_processor(tok)
    planner = ScriptedChat(planner_service_reply, name="planner")
    with memory_service(
        tmp_path / "mem.sqlite", planner=planner, overrides=("planner.cold_start=false",)
    ) as (
        memory_url,
        _,
    ):
        cfg = compose(
            "executor_grpo",
            [
                f"actor_rollout_ref.model.path={models['vl']}",
                f"data.train_files={parquet}",
                f"data.val_files={parquet}",
                "data.max_prompt_length=2048",
                "data.max_response_length=1536",
                "data.filter_overlong_prompts=false",
                f"actor_rollout_ref.rollout.n={N}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'agent_loops.yaml'}",
                "reward.custom_reward_function.reward_kwargs.judge={type: rules}",
                "reward.custom_reward_function.reward_kwargs.llm=embedded",
                f"mia.services.memory_url={memory_url}",
                f"mia.agent.tools.search.params.url={search_url}",
                f"mia.agent.tools.web_image_to_image_search.params.cache_roots=[{cache}]",
                f"+mia.agent.tools.web_image_to_image_search.params.image_size={IMAGE_SIZE}",
                f"mia.agent.image_size={IMAGE_SIZE}",
                "mia.judge={type: rules}",
                "mia.llm=embedded",
            ],
        )
        server = FakeServer(tok, executor_reply)
        batch = _batch(parquet, cfg, tok, processor, N)
        out = asyncio.run(generate(cfg, server, batch, processor))

        # The same samples through mia.rl's episode, on the same scripted generator.
        from transformers import AutoConfig

        mia_cfg = load_mia_config(cfg.mia)
        gen = ScriptedGenerator(tok, executor_reply)
        gen.hf_config = AutoConfig.from_pretrained(models["vl"])

        async def expected() -> list[tuple[Any, float, dict]]:
            memory = MemoryClient(memory_url)
            episode = ExecutorEpisode(
                build_tools(mia_cfg.agent.tools), mia_cfg.agent, judge=RuleJudge(), memory=memory
            )
            reward = ExecutorReward(RuleJudge())
            return await scored_rollouts(episode, reward, gen, tmp_path / "train.jsonl", 1536)

        want = asyncio.run(expected())

    rows = _rows(out)
    assert len(rows) == 3 * N
    for k, (traj, score, _extras) in enumerate(want):
        for row in rows[k * N : (k + 1) * N]:  # interleaved: the n rollouts of a row are adjacent
            assert row["prompt"] == traj.prompt_ids
            assert row["response"] == traj.response_ids
            assert row["mask"] == traj.response_mask
            assert row["logprobs"] == pytest.approx(traj.rollout_logprobs)
            assert row["score"] == pytest.approx(score) and row["score_at_end"] == pytest.approx(
                score
            )
    assert [round(s, 4) for _, s, _ in want] == [1.14, 0.9, 1.14]  # reference §7.1, as mia.rl

    # Masks: policy tokens decode to the scripted replies; observations and injected turns are 0.
    for row in rows:
        sampled = tok.decode([t for t, m in zip(row["response"], row["mask"], strict=True) if m])
        injected = tok.decode(
            [t for t, m in zip(row["response"], row["mask"], strict=True) if not m]
        )
        assert "<tool_response>" in injected and "<tool_response>" not in sampled
        assert "<think>" in sampled and "<answer>" in sampled
    e2 = tok.decode(rows[2]["response"])
    assert "I have a revised plan for you to follow:\n" + REPLAN in e2  # /replan_train mid-rollout
    assert "born in Velmora" in e2  # the real local_search answered

    # veRL's reward extras and metrics came back through its reward manager.
    nt = out.non_tensor_batch
    assert [float(x) for x in nt["acc"]] == [1.2, 1.2, 1.0, 1.0, 1.2, 1.2]
    assert list(nt["pred"]) == ["Kaleth Morvaine"] * 2 + ["Velmora"] * 2 + ["red"] * 2
    assert all(r["kind"] == "executor" for r in nt["mia"])

    # The image question: question image + tool image, pads masked, veRL's processor agrees.
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    traj = want[2][0]
    mm = traj.multimodal
    for i in (4, 5):
        row, inputs = rows[i], nt["multi_modal_inputs"][i]
        assert row["prompt"].count(pad) == 4 and row["response"].count(pad) == 4
        assert all(m == 0 for t, m in zip(row["response"], row["mask"], strict=True) if t == pad)
        assert inputs["image_grid_thw"].tolist() == mm["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
        assert (inputs["pixel_values"] - mm["pixel_values"]).abs().max() < 1e-5
    image_calls = [c for c in server.calls if c.get("image_data")]
    assert {len(c["image_data"]) for c in image_calls} == {
        1,
        2,
    }  # the question's, then + the tool's
    # veRL owns temperature / top-p; the loop sends its stop strings and per-turn budget.
    first = server.calls[0]["sampling"]
    assert first["temperature"] == 1.0 and first["stop"] == ["</tool_call>", "<tool_response>"]
    assert first["max_tokens"] <= 1536 and first["logprobs"] is True


# ----------------------------------------------------------------------------- planner


def planner_reply(prompt: str) -> str:
    """The trainable Planner: a plan, then "yes" for Ilsa (whose first answer is wrong), then a
    supplementary plan; "no" for the others."""
    turns = prompt.split("<|im_start|>assistant\n")[1:]
    if len(turns) == 1:
        return "<think>plan it</think>\n1. Search the question.\n2. Answer."
    if len(turns) == 2:
        return "<think>check</think>\n" + ("yes" if "Ilsa" in prompt else "no")
    return "<think>again</think>\n1. Search the birthplace again."


def serve_reply(messages: list[dict]) -> str:
    """The frozen Executor behind serve: wrong for Ilsa until a revised plan arrives."""
    text = " ".join(str(m.get("content")) for m in messages)
    question = next(q for q in GOLD if q in text)
    if "Ilsa" in question and "I have a revised plan" not in text:
        return "<answer>Nobody</answer>"
    return f"<answer>{GOLD[question]}</answer>"


@pytest.mark.parametrize("ttrl", [False, True], ids=["planner", "ttrl"])
def test_verl_planner_agent_loop_matches_mia_rl(
    tmp_path: Path, tok: Any, models: dict, ttrl: bool
) -> None:
    from mia.judge.rules import RuleJudge
    from mia.planner.episode import PlannerEpisode
    from mia.rewards.planner import PlannerReward
    from mia.services import ExecutorClient, MemoryClient
    from mia.verl.config import load_mia_config

    items = [i for i in _items() if not i.images]
    write_jsonl_qa(items, tmp_path / "train.jsonl")
    parquet = prepare(
        "ttrl" if ttrl else "planner", tmp_path / "train.jsonl", tmp_path / "train.parquet"
    )
    with (
        executor_service(serve_reply) as (executor_url, _),
        memory_service(tmp_path / "mem.sqlite") as (memory_url, _),
    ):
        overrides = [
            f"actor_rollout_ref.model.path={models['text']}",
            f"data.train_files={parquet}",
            f"data.val_files={parquet}",
            "data.max_prompt_length=3072",
            "data.max_response_length=2048",
            "data.filter_overlong_prompts=false",
            "data.apply_chat_template_kwargs={}",
            f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'agent_loops.yaml'}",
            "reward.custom_reward_function.reward_kwargs.judge={type: rules}",
            "reward.custom_reward_function.reward_kwargs.llm=embedded",
            f"mia.services.executor_url={executor_url}",
            f"mia.services.memory_url={memory_url}",
            "mia.episode.plan_max_tokens=256",
            "mia.episode.decision_max_tokens=64",
            "mia.episode.replan_max_tokens=192",
        ]
        if ttrl:
            overrides += [
                f"mia.ttrl.eval_dir={tmp_path / 'eval'}",
                f"mia.ttrl.save_path={tmp_path / 'memory'}",
            ]
        cfg = compose("ttrl" if ttrl else "planner_grpo", overrides)
        server = FakeServer(tok, planner_reply)
        batch = _batch(parquet, cfg, tok, None, N)
        out = asyncio.run(generate(cfg, server, batch))

        mia_cfg = load_mia_config(cfg.mia)
        gen = ScriptedGenerator(tok, planner_reply)

        async def expected() -> list[tuple[Any, float, dict]]:
            episode = PlannerEpisode(
                ExecutorClient(executor_url), MemoryClient(memory_url), mia_cfg.episode
            )
            reward = PlannerReward(RuleJudge())
            return await scored_rollouts(episode, reward, gen, tmp_path / "train.jsonl", 256)

        want = asyncio.run(expected())  # before the hooks write memories
        if ttrl:  # every rollout was buffered by the reward; the step's hooks consolidate them
            from mia.verl.ttrl import commit_step, memory_client

            client = memory_client(mia_cfg)
            assert client.sync.stats().buffered_rollouts == len(items) * N
            info = commit_step(client, 1, mia_cfg.ttrl)
            # every final answer is right (Ilsa after the replan): one positive per question
            assert info["ttrl/saved_positives"] == 2 and info["ttrl/saved_negatives"] == 0
            assert client.sync.stats().buffered_rollouts == 0
            assert (tmp_path / "eval").is_dir()
            client.close()

    rows = _rows(out)
    assert len(rows) == len(items) * N
    for k, (run, score, _extras) in enumerate(want):
        conv = run.conversation
        for row in rows[k * N : (k + 1) * N]:
            assert row["prompt"] == conv.prompt_ids
            assert row["response"] == conv.response_ids and row["mask"] == conv.response_mask
            assert row["score"] == pytest.approx(score)
    # e1: right, no replan (0.7 + 0.2 + 0.05 + 0.05); e2: wrong, yes, replanned, right (0.7 + 0.1).
    assert [round(s, 4) for _, s, _ in want] == [1.0, 0.8]
    e2 = rows[2]
    injected = tok.decode([t for t, m in zip(e2["response"], e2["mask"], strict=True) if not m])
    sampled = tok.decode([t for t, m in zip(e2["response"], e2["mask"], strict=True) if m])
    assert "1. Search the birthplace again." in sampled and "yes" in sampled
    assert (
        "Nobody" in injected
    )  # the frozen Executor's first trace, in the reflection turn (mask 0)
    assert list(out.non_tensor_batch["pred"]) == ["Kaleth Morvaine"] * 2 + ["Velmora"] * 2


def test_verl_agent_loops_are_registered_with_verl() -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry

    from mia.verl import agent_loops

    assert issubclass(agent_loops.MiaExecutorAgentLoop, AgentLoopBase)
    assert _agent_loop_registry["mia_executor"]["_target_"].endswith("MiaExecutorAgentLoop")
    assert _agent_loop_registry["mia_planner"]["_target_"].endswith("MiaPlannerAgentLoop")


def test_verl_reward_manager_scores_reference_planner_rows(tok: Any, models: dict) -> None:
    """Rows in the reference's format (extra_info.messages: plan, trace1, decision[, replan
    prompt, replan, trace2]) through veRL's reward manager = mia.rewards.planner_reward."""
    from mia.judge.rules import RuleJudge
    from mia.rewards import PlannerEpisodeRecord, planner_reward

    cfg = compose(
        "planner_grpo",
        [
            f"actor_rollout_ref.model.path={models['text']}",
            "reward.custom_reward_function.reward_kwargs.judge={type: rules}",
        ],
    )
    messages = [
        "<think>p</think>1. Search.",
        "### Round 1:\n<answer>Nobody</answer>",
        "<think>c</think>yes",
        "replan prompt",
        "<think>r</think>1. Again.",
        "### Round 2:\n<answer>Velmora</answer>",
    ]
    ids = tok.encode("anything", add_special_tokens=False)
    data = DataProto.from_single_dict(
        {
            "prompts": __import__("torch").tensor([ids]),
            "responses": __import__("torch").tensor([ids]),
            "attention_mask": __import__("torch").ones(
                1, 2 * len(ids), dtype=__import__("torch").long
            ),
            "data_source": np.array(["mia"], dtype=object),
            "reward_model": np.array([{"ground_truth": ["Velmora"]}], dtype=object),
            "extra_info": np.array(
                [{"messages": messages, "question": "Where was Ilsa Drovan born?"}], dtype=object
            ),
        }
    )

    async def score() -> dict:  # veRL's workers take the running loop when built
        return await RewardLoopWorker(cfg).compute_score(data)

    got = asyncio.run(score())
    record = PlannerEpisodeRecord.from_reference_messages(messages, "Where was Ilsa Drovan born?")
    score, _ = asyncio.run(planner_reward(record, ["Velmora"], RuleJudge()))
    assert got["reward_score"] == pytest.approx(score) == pytest.approx(0.7 + 0.05 + 0.05)
    assert re.sub(r"\s", "", got["reward_extra_info"]["pred"]) == "Velmora"
