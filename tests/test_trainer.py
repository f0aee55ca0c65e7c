"""The GRPO trainer end to end on a tiny Qwen2: rollouts through the real agent loop and the
transformers generator, updates in one process and on two Ray/FSDP2 ranks, weight sync,
metrics JSONL, checkpoint + resume of the data position; plus its small parts exactly."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from toy_tool_task import (
    ScriptedTokens,
    answer_text,
    call_text,
    gold_transcripts,
    make_episode,
    make_samples,
    sft_batch,
)

from mia.errors import MiaError
from mia.llm.base import ChatResult, SamplingParams
from mia.models.tiny import build_tokenizer, save_tiny, tiny_qwen2
from mia.rl.episode import Rollout, SeededGenerator, collate, mix_seed
from mia.rl.metrics import format_line, read_metrics
from mia.rl.policy import PolicyModel
from mia.rl.trainer import DataCursor, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Two torch threads on two busy cores spin against each other (measured 5-8x slower).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory) -> Path:
    return save_tiny(tiny_qwen2(tok, seed=3), tok, tmp_path_factory.mktemp("tiny"))


def text_reward(sample: dict, traj: Any) -> tuple[float, dict]:
    """A reward with spread on a random model's gibberish: how many 'e' it wrote (capped)."""
    text = traj.final_text or ""
    return min(text.count("e"), 4) / 4.0, {"chars": float(len(text))}


def base_cfg(model_dir: Path, run_dir: Path, **over: Any) -> dict:
    cfg = {
        "model_path": str(model_dir),
        "run_dir": str(run_dir),
        "seed": 7,
        "batch_size": 2,
        "n": 4,
        "total_steps": 2,
        "sampling": {"temperature": 1.0, "max_tokens": 6},
        "policy": {"micro_batch_size": 8, "optim": {"lr": 1e-2}},
        "workers": {"mode": "single_process"},
        "generator": {"max_batch_size": 16},
        "logging": {"console": False},
        "log_rollouts": 8,
        "skip_tied_steps": False,  # every step updates and syncs, whatever the rewards
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def episode_for(samples: list[dict]) -> Any:
    ep = make_episode(samples)
    ep.cfg.max_turns = 1  # one generated turn per rollout keeps this fast
    return ep


def rollout_ids(run_dir: Path, step: int) -> list[str]:
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return sorted(
        {r["group"] + ":" + r["trajectory"]["question"] for r in recs if r["step"] == step}
    )


# ----------------------------------------------------------------------------- end to end


def test_old_logprobs_from_the_rollout_give_the_recomputed_update(model_dir, tok, tmp_path) -> None:
    """old_logprobs=rollout (the in-process generator's exact log-probs; no extra forward pass)
    and auto (one update per batch: the update's own log-probs, detached) give the same
    single-update step as recomputing them, up to float rounding; auto still reports the
    entropy and the generator/trainer gap, and recomputes when mini-batches reuse a batch."""
    data = [{"question": "the answer is"}, {"question": "a tool call"}]
    runs = {}
    for mode in ("recompute", "rollout", "auto"):
        cfg = base_cfg(
            model_dir, tmp_path / mode, shuffle=False, save_freq=-1, log_rollouts=0,
            old_logprobs=mode, total_steps=1,
        )  # fmt: skip
        with Trainer(cfg, OneTurn(tok), text_reward, data) as trainer:
            metrics = trainer.train_on(data)
            after = [r.trajectory.final_text for r in trainer.collect(data, n=2)]
        runs[mode] = (metrics, after)
    rec, rol = runs["recompute"][0], runs["rollout"][0]
    assert rec["reward/mean"] == rol["reward/mean"]  # the same rollouts
    assert rec["rollout/logprob_diff_max"] < 1e-4  # what makes the shortcut sound
    assert "actor/entropy" not in rol  # the recompute pass is what measured it
    assert rol["actor/grad_norm"] == pytest.approx(rec["actor/grad_norm"], rel=1e-3)
    assert rol["actor/loss"] == pytest.approx(rec["actor/loss"], abs=1e-4)
    assert runs["recompute"][1] == runs["rollout"][1]  # the same updated policy samples
    auto = runs["auto"][0]
    assert auto["reward/mean"] == rec["reward/mean"]
    assert auto["actor/grad_norm"] == pytest.approx(rec["actor/grad_norm"], rel=1e-3)
    assert auto["actor/loss"] == pytest.approx(rec["actor/loss"], abs=1e-4)
    assert auto["actor/ratio_mean"] == 1.0 and auto["actor/pg_clipfrac"] == 0.0
    assert auto["actor/entropy"] == pytest.approx(rec["actor/entropy"], rel=1e-3)
    assert auto["rollout/logprob_diff_max"] == pytest.approx(
        rec["rollout/logprob_diff_max"], abs=1e-5
    )
    assert runs["auto"][1] == runs["recompute"][1]
    cfg = base_cfg(model_dir, tmp_path / "mb", mini_batch_size=4, save_freq=-1)
    with Trainer(cfg, OneTurn(tok), text_reward, data) as trainer:
        assert trainer._old_logprob_mode(8) == "recompute"  # two updates share the batch
        assert trainer._old_logprob_mode(4) == "update"


def test_tempered_rollouts_are_scored_at_their_temperature(model_dir, tok, tmp_path) -> None:
    """Plans sampled at 1.3 (the demo's TTRL) with the loss at 1.3: the recomputed old
    log-probs are of the tempered distribution, so the first update's ratio is 1; the
    generator-vs-trainer gap (raw log-probs against tempered ones) is not reported, it would
    look like a stale generator."""
    data = [{"question": "the answer is"}, {"question": "a tool call"}]
    cfg = base_cfg(
        model_dir, tmp_path, shuffle=False, save_freq=-1, log_rollouts=0, total_steps=1,
        sampling={"temperature": 1.3}, policy={"loss": {"temperature": 1.3}},
    )  # fmt: skip
    with Trainer(cfg, OneTurn(tok), text_reward, data) as trainer:
        metrics = trainer.train_on(data)
    assert "rollout/logprob_diff_mean" not in metrics and metrics["actor/updates"] == 1.0
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/approx_kl"] == pytest.approx(0.0, abs=1e-5)


def test_single_process_steps_checkpoint_and_resume(model_dir, tmp_path) -> None:
    data = make_samples(6, seed=11)
    run = tmp_path / "run"
    cfg = base_cfg(model_dir, run, save_freq=1)
    with Trainer(cfg, episode_for(data), text_reward, data) as trainer:
        history = trainer.fit()
        assert trainer.generator.weight_version == 2  # synced after each step
    assert [h["step"] for h in history] == [1, 2]

    recs = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2]
    for key in (
        "reward/mean",
        "reward/std",
        "reward/chars",
        "response/policy_tokens_mean",
        "actor/pg_clipfrac",
        "actor/approx_kl",
        "actor/entropy",
        "actor/grad_norm",
        "perf/tokens_per_s",
        "time/step",
        "time/rollout",
        "time/sync",
    ):
        assert isinstance(recs[-1][key], float), key
    # The process's resident memory (mia/heap.py trims it after each phase) and its peak.
    assert 0 < recs[-1]["perf/rss_gb"] <= recs[-1]["perf/max_rss_gb"]
    assert recs[0]["rollout/n"] == 8.0 and recs[0]["actor/updates"] == 1.0
    # Every rollout stops after its one turn of at most 6 tokens.
    assert recs[0]["response/policy_tokens_max"] <= 6
    # Rollouts of step 2 came from the weights after step 1: the generator's log-probs equal
    # the trainer's recomputation (a stale generator is off by ~1e-1 at this learning rate).
    assert recs[1]["rollout/logprob_diff_mean"] < 1e-4
    # The logged rewards are the reward function's values on the logged trajectories.
    rolls = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    step1 = [r for r in rolls if r["step"] == 1]
    assert len(step1) == 8
    for r in step1:
        text = r["trajectory"]["final_text"]
        assert r["reward"] == min(text.count("e"), 4) / 4.0
    assert recs[0]["reward/mean"] == pytest.approx(sum(r["reward"] for r in step1) / 8)

    ckpts = sorted(p.name for p in (run / "checkpoints").glob("global_step_*"))
    assert ckpts == ["global_step_1", "global_step_2"]
    state = json.loads((run / "checkpoints/global_step_2/trainer_state.json").read_text())
    assert state["data_state"] == {"epoch": 0, "cursor": 4, "seed": 7, "trainer_step": 2}

    # Resume: step 3 takes the batch an uninterrupted run would take next (a new epoch: 6
    # samples hold 3 batches of 2, the cursor is at 4 -> the last batch of epoch 0).
    expected = DataCursor(6, 2, True, 7)
    order = [expected.next() for _ in range(3)][2]
    resumed = Trainer(
        base_cfg(model_dir, run, save_freq=1, total_steps=3, resume=True),
        episode_for(data),
        text_reward,
        data,
    )
    history = resumed.fit()
    assert [h["step"] for h in history] == [3]
    recs = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3]
    # The generator was given the checkpoint's weights on resume, not the base model's.
    assert recs[2]["rollout/logprob_diff_mean"] < 1e-4
    questions = {data[i]["question"] for i in order}
    step3 = {q.split(":", 1)[1] for q in rollout_ids(run, 3)}
    assert step3 == questions
    state = json.loads((run / "checkpoints/global_step_3/trainer_state.json").read_text())
    assert state["data_state"]["cursor"] == 6 and state["policy_step"] == 3


class OneTurn:
    """A minimal non-agent episode: one generation from a fixed prompt (the trainer is generic:
    anything with a token view works). Samples with ``fail`` raise."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    async def run(self, sample: dict, rollout: Rollout) -> Any:
        if sample.get("fail"):
            raise RuntimeError("tool server down")
        ids = self.tok.encode(sample["question"])
        res = await rollout.generator.generate(ids, rollout.sampling)

        class Traj:
            prompt_ids = ids
            response_ids = res.token_ids
            response_mask = [1] * len(res.token_ids)
            rollout_logprobs = res.logprobs
            final_text = res.text

        return Traj()


def test_generic_episode_folder_sync_and_dropped_groups(
    model_dir, tok, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    data = [{"question": "the answer is"}, {"question": "a tool call", "fail": True}]
    cfg = base_cfg(
        model_dir,
        tmp_path,
        batch_size=2,
        n=3,
        shuffle=False,
        weight_sync="folder",
        rollout_errors="drop",
        save_freq=-1,
        mini_batch_size=2,
        log_rollouts=0,
    )
    with Trainer(cfg, OneTurn(tok), text_reward, data) as trainer:
        with caplog.at_level(logging.WARNING, logger="mia.rl.trainer"):
            first = trainer.train_on(data)
        # Each failed rollout is logged once, with its cause (by collect, before learn drops it).
        failed = [m for m in caplog.messages if "failed: RuntimeError: tool server down" in m]
        assert failed == [
            f"rollout train-1-1/{j} failed: RuntimeError: tool server down" for j in range(3)
        ]
        # A collection that is never trained on (TTRL's Executor-alone answers) logs them too.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mia.rl.trainer"):
            alone = trainer.collect(data[1:], n=1, tag="alone")
        assert alone[0].error == "RuntimeError: tool server down"
        assert caplog.messages == ["rollout alone-2-0/0 failed: RuntimeError: tool server down"]
        # ... and so does an evaluation, which counts them next to its means.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mia.rl.trainer"):
            val = trainer.evaluate(data, n=2)
        assert caplog.messages == [
            f"rollout val-1-1/{j} failed: RuntimeError: tool server down" for j in range(2)
        ]
        assert (val["val/n"], val["val/failed"]) == (2.0, 2.0)
        second = trainer.train_on(data)
        assert trainer.generator.weight_version == 2
        weights = sorted(p.name for p in (tmp_path / "weights").iterdir())
        assert weights == ["step_000002"]  # the previous export is removed after the reload
    assert first["rollout/dropped"] == 3.0 and first["rollout/n"] == 3.0
    # 3 sequences in mini-batches of 2 -> two optimizer steps per train step
    assert first["actor/updates"] == 2.0
    assert second["rollout/logprob_diff_mean"] < 1e-4
    assert not (tmp_path / "checkpoints").exists()  # save_freq=-1: never

    # All groups tied (a constant reward): no advantage, so no optimizer step and no sync.
    tied = base_cfg(model_dir, tmp_path / "t", batch_size=2, n=2, skip_tied_steps=True)
    with Trainer(tied, OneTurn(tok), lambda s, t: 0.5, data[:1] * 2) as trainer:
        metrics = trainer.train_on(data[:1] * 2)
        assert trainer.generator.weight_version == 0 and trainer.policy.step == 0
    assert metrics["actor/updates"] == 0.0 and metrics["reward/groups_all_equal"] == 1.0

    raising = base_cfg(model_dir, tmp_path / "r", batch_size=2, n=2, shuffle=False)
    with (
        Trainer(raising, OneTurn(tok), text_reward, data) as trainer,
        pytest.raises(RuntimeError, match="tool server down"),
    ):
        trainer.train_on(data)


def test_collect_then_learn_is_the_step(model_dir, tok, tmp_path) -> None:
    """collect() + learn() on a fresh trainer equals train_on() with the same seed, exactly:
    same rollouts, rewards, loss and update; learn() logs its row, train_on() leaves it to the
    caller."""
    data = [{"question": "the answer is"}, {"question": "a tool call"}]
    exact = ("reward/mean", "reward/std", "actor/loss", "actor/pg_loss", "actor/grad_norm")
    exact += ("actor/entropy", "actor/approx_kl", "rollout/n", "response/length_mean")
    runs = {}
    for name in ("step", "split"):
        cfg = base_cfg(model_dir, tmp_path / name, shuffle=False, save_freq=-1, log_rollouts=0)
        with Trainer(cfg, OneTurn(tok), text_reward, data) as trainer:
            if name == "step":
                metrics = trainer.train_on(data)
            else:
                results = trainer.collect(data, tag="train")
                assert [r.group for r in results] == ["train-1-0"] * 4 + ["train-1-1"] * 4
                assert trainer.step == 0 and trainer.generator.weight_version == 0
                metrics = trainer.learn(results)
            assert trainer.step == 1 and trainer.generator.weight_version == 1
            runs[name] = (metrics, [r.trajectory.final_text for r in trainer.collect(data, n=2)])
    step, split = runs["step"][0], runs["split"][0]
    assert {k: step[k] for k in exact} == {k: split[k] for k in exact}
    assert step["actor/grad_norm"] > 0
    # Same updated weights: the next collection samples the same texts.
    assert runs["step"][1] == runs["split"][1]
    assert read_metrics(tmp_path / "step" / "metrics.jsonl") == []
    logged = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in logged] == [1] and logged[0]["actor/loss"] == split["actor/loss"]
    unset = Trainer(base_cfg(model_dir, tmp_path / "e"), OneTurn(tok), text_reward, data)
    with pytest.raises(MiaError, match="no rollout results"):
        unset.learn([])
    with pytest.raises(MiaError, match=r"unknown sampling key\(s\) \['temp'\]"):
        unset.collect(data, sampling={"temp": 1.0})


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    from mia.rl.ray_utils import init_ray

    with init_ray(tmp_path_factory.mktemp("ray"), num_cpus=2):
        yield


@pytest.mark.slow  # ~30-40 s: Ray start-up and two actors importing torch/transformers
def test_ray_world_size_two_step(ray_cluster, model_dir, tmp_path) -> None:
    data = make_samples(2, seed=5)
    cfg = base_cfg(
        model_dir,
        tmp_path,
        total_steps=1,
        n=2,
        workers={"mode": "ray", "world_size": 2},
        log_rollouts=0,
    )

    # A reward that ties only identical replies: every group has a signal, whatever is sampled.
    def distinct(sample: dict, traj: Any) -> float:
        return float(sum(traj.response_ids) % 997)

    with Trainer(cfg, episode_for(data), distinct, data) as trainer:
        history = trainer.fit()
        assert trainer.generator.weight_version == 1
    assert history[0]["rollout/n"] == 4.0
    assert history[0]["advantage/abs_mean"] > 0 and history[0]["actor/grad_norm"] > 0
    shards = sorted(p.name for p in (tmp_path / "checkpoints/global_step_1/dcp").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["step"] == 1


# ----------------------------------------------------------------------------- parts


class Recorder:
    name = "rec"
    weight_version = 0
    tokenizer = "tok"

    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def generate(self, ids, params, multimodal=None) -> ChatResult:
        self.seeds.append(params.seed)
        return ChatResult(text="x", token_ids=[1], logprobs=[0.0])


def test_seeded_generator_gives_each_call_its_own_seed() -> None:
    inner = Recorder()
    a, b = SeededGenerator(inner, 1), SeededGenerator(inner, 2)

    async def go() -> None:
        await a.generate([5], SamplingParams(temperature=1.0))
        await a.generate([5], SamplingParams(temperature=1.0))
        await b.generate([5], SamplingParams(temperature=1.0))
        await a.generate([5], SamplingParams(temperature=1.0, seed=42))  # explicit wins

    asyncio.run(go())
    assert inner.seeds == [mix_seed(1, 0), mix_seed(1, 1), mix_seed(2, 0), 42]
    assert len(set(inner.seeds)) == 4
    assert a.tokenizer == "tok" and a.name == "rec"  # everything else is the inner's
    assert mix_seed(1, 0) == mix_seed(1, 0) < 2**63


def test_agent_episode_routes_each_concurrent_rollout_to_its_own_engine(tok) -> None:
    samples = make_samples(3, seed=4)
    episode = make_episode(samples)
    words = ["river", "book", "year"]

    def engine(word: str) -> ScriptedTokens:
        return ScriptedTokens(tok, [call_text(), answer_text(word)])

    async def go() -> list:
        # Through run(), and through make_loop() + loop.run() as subclasses do.
        runs = [
            episode.run(samples[0], Rollout(generator=engine(words[0]), sampling=SamplingParams())),
            episode.make_loop(engine(words[1]), SamplingParams()).run(samples[1]),
            episode.run(samples[2], Rollout(generator=engine(words[2]), sampling=SamplingParams())),
        ]
        return list(await asyncio.gather(*runs))

    trajs = asyncio.run(go())
    assert [t.answer for t in trajs] == words
    # The tool answered each rollout for its own question (8 lines of its secret).
    for t, s in zip(trajs, samples, strict=True):
        assert t.tool_calls[0].ok and t.messages[-2]["content"].count(s["secret"]) == 8
    assert len(episode._loops) <= 8  # one cached loop per engine, bounded


class T:
    def __init__(self, prompt, resp, mask, lps) -> None:
        self.prompt_ids, self.response_ids = prompt, resp
        self.response_mask, self.rollout_logprobs = mask, lps


def test_collate_left_pads_prompts_and_right_pads_responses() -> None:
    batch = collate(
        [T([5, 6], [7, 8, 9], [1, 0, 1], [-0.5, 0.0, -1.5]), T([4, 5, 6], [10], [1], [-2.0])],
        pad_id=0,
    )
    assert batch["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9], [4, 5, 6, 10, 0, 0]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert batch["response_mask"].tolist() == [[0, 0, 0, 1, 0, 1], [0, 0, 0, 1, 0, 0]]
    assert batch["rollout_logprobs"].tolist() == [
        [0.0, 0.0, 0.0, -0.5, 0.0, -1.5],
        [0.0, 0.0, 0.0, -2.0, 0.0, 0.0],
    ]
    no_lps = collate([T([1], [2], [1], None)])
    assert "rollout_logprobs" not in no_lps
    with pytest.raises(MiaError, match="no token view"):
        collate([T(None, [2], [1], None)])
    with pytest.raises(MiaError, match="2 entries for 1"):
        collate([T([1], [2], [1, 1], None)])


def test_data_cursor_is_deterministic_and_resumable() -> None:
    a = DataCursor(5, 2, True, seed=3)
    seq = [a.next() for _ in range(5)]
    assert all(len(b) == 2 for b in seq)
    assert sorted(seq[0] + seq[1]) == sorted(set(seq[0] + seq[1]))  # no repeats in an epoch
    assert a.state() == {"epoch": 2, "cursor": 2}  # 2 batches per epoch (drop-last)
    b = DataCursor(5, 2, True, seed=3)
    [b.next() for _ in range(3)]
    c = DataCursor(5, 2, True, seed=3, **b.state())
    assert [c.next() for _ in range(2)] == seq[3:]
    assert DataCursor(4, 2, False, 0).next() == [0, 1]
    with pytest.raises(MiaError, match="fewer than batch_size=8"):
        DataCursor(3, 8, True, 0)


def test_trainer_config_rejects_bad_values(model_dir) -> None:
    ok = TrainerConfig.from_dict({"model_path": str(model_dir)})
    assert ok.policy.model_path == str(model_dir) and ok.n == 8
    cases = [
        ({"bogus": 1}, "unknown key"),
        ({"old_logprobs": "guess"}, "old_logprobs"),
        ({"weight_sync": "nccl"}, "weight_sync"),
        ({"sampling": {"temp": 1}}, "unknown sampling key"),
        ({"old_logprobs": "rollout", "policy": {"loss": {"temperature": 0.7}}}, "old_logprobs"),
        ({"sampling": {"temperature": 1.3}}, "policy.loss.temperature=1; set both"),
        ({"policy": {"loss": {"temperature": 1.3}}}, "sampling.temperature=1 but"),
        ({"workers": {"mode": "ray", "gpus": 2}}, "unknown key"),
        ({"model_path": ""}, "set model_path"),
    ]
    for over, message in cases:
        with pytest.raises(MiaError, match=message):
            TrainerConfig.from_dict({"model_path": str(model_dir), **over})
    hot = {"sampling": {"temperature": 1.3}, "policy": {"loss": {"temperature": 1.3}}}
    assert TrainerConfig.from_dict({"model_path": str(model_dir), **hot}).sampling["temperature"]
    greedy = TrainerConfig.from_dict(
        {"model_path": str(model_dir), "sampling": {"temperature": 0.0}}
    )
    assert greedy.policy.loss.temperature == 1.0


def test_console_line_format() -> None:
    line = format_line(3, 10, {"reward/mean": 0.25, "reward/std": 0.5, "time/step": 1.234})
    assert line == "step 3/10 | reward 0.250 ±0.50 | step_s 1.23"
    assert format_line(1, None, {"actor/entropy": float("nan")}) == "step 1"


def test_sft_step_is_cross_entropy_on_masked_tokens(model_dir, tok) -> None:
    trajs = gold_transcripts(tok, make_samples(4, seed=2))
    batch = sft_batch(tok, trajs)
    mask = batch["response_mask"].float()
    # The assistant turns only: tool responses and the chat template's tokens are masked out.
    assert mask.sum() == sum(sum(t.response_mask) for t in trajs) > 0
    policy = PolicyModel({"model_path": str(model_dir), "micro_batch_size": 3})
    nll = -(policy.compute_logprobs(batch) * mask).sum() / mask.sum()
    first = policy.sft_step(batch)
    assert first["loss"] == pytest.approx(float(nll), rel=1e-5)
    assert first["n_tokens"] == float(mask.sum()) and policy.step == 1
    for _ in range(3):
        last = policy.sft_step(batch)
    assert last["loss"] < first["loss"]


def test_cli_composes_the_config_and_fails_cleanly(model_dir) -> None:
    cmd = [sys.executable, "-m", "mia.rl"]
    out = subprocess.run(
        cmd + ["--cfg", f"model_path={model_dir}", "n=4", "policy.optim.lr=0.001"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    import yaml

    cfg = yaml.safe_load(out.stdout)
    assert cfg["n"] == 4 and cfg["policy"]["optim"]["lr"] == 0.001
    assert cfg["policy"]["loss"]["clip_ratio_c"] == 3.0  # from configs/rl/policy.yaml
    assert cfg["generator"]["max_batch_size"] == 64 and cfg["workers"]["mode"] == "ray"
    bad = subprocess.run(
        cmd + [f"model_path={model_dir}", "reward=x:y"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "mia.rl: error: set episode=MODULE:ATTR"


@pytest.mark.slow  # ~15-20 s: two spawned ranks importing torch/transformers
def test_gpu_smoke_script_runs_its_fsdp_check_on_cpu() -> None:
    """scripts/gpu_smoke.py's FSDP2 check (meta-device build, fully_shard, GRPO step), tiny and
    on gloo: the same code the GPU run uses with NCCL and a 7B-sized config."""
    out = subprocess.run(
        [sys.executable, "scripts/gpu_smoke.py", "--tiny", "--device", "cpu", "--checks", "fsdp"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith(("PASS", "FAIL", "SKIP"))]
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(lines) == 1 and lines[0].startswith("PASS fsdp: tiny Qwen2.5-VL"), lines
    bad = subprocess.run(
        [sys.executable, "scripts/gpu_smoke.py", "--checks", "nccl"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 2 and "unknown checks ['nccl']" in bad.stderr
