"""The streaming TTRL server's config schema (``python -m ttrl_streaming.server --help-config``
lists every key).

Every default lives here, sized for a laptop CPU with the embedded model;
``configs/ttrl_streaming/server.yaml`` composes the shared groups (the reward, the judge).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mia.config import option, section
from mia.judge import JudgeConfig
from mia.planner.episode import PlannerEpisodeConfig
from mia.rewards.config import PlannerRewardConfig
from mia.rl.trainer import TrainerConfig
from mia.roles.common import load_role
from mia.roles.config import PlannerServices, cpu_episode, cpu_planner_trainer


@dataclass
class StreamingServices(PlannerServices):
    """serve, memory_serve and the reward server."""

    reward_url: str | None = option(
        "${oc.env:GT_REWARD_URL,http://127.0.0.1:6000}",
        "the reward server (python -m ttrl_streaming.reward_server; env GT_REWARD_URL, else "
        "http://127.0.0.1:6000); null = the local judge and reward",
    )
    reward_token: str | None = option(None, "the reward server's own token; null = token")


@dataclass
class StreamingMemory:
    """Memories and the memory writes after every rollout phase."""

    enabled: bool = option(
        True, "memories + the TTRL memory hooks after every rollout phase (memory_serve)"
    )
    evaluate: bool = option(True, "/batch_evaluate into run_dir/eval")
    save: bool = option(True, "/save_memory into run_dir/memory")


@dataclass
class StreamingServerConfig:
    """The streaming TTRL server (``python -m ttrl_streaming.server``): holds the Planner;
    POST /submit_sample buffers rollouts and runs a GRPO step whenever trainer.batch_size x
    trainer.n rollouts are buffered."""

    model_path: str = option("embedded", 'the Planner; "embedded" = SmolLM2-135M-Instruct')
    llm: str = option("embedded", "LLM roles for LLM judges: configs/llm/<name>.yaml or a file")
    chat_template_kwargs: dict[str, Any] = option(
        {}, "passed to the chat template, e.g. {enable_thinking: true} for Qwen3 planners"
    )
    run_dir: str = option("", '"" = $MIA_HOME/runs/streaming-<time>: metrics, checkpoints, memory')
    resume: bool = option(True, "start from the latest checkpoint in run_dir")
    max_samples_per_request: int = option(64, "samples in one /submit_sample (more: HTTP 413)")
    services: StreamingServices = section(StreamingServices, "serve, memory_serve, rewards")
    memory: StreamingMemory = section(StreamingMemory, "memories and memory writes")
    episode: PlannerEpisodeConfig = section(
        cpu_episode,
        "the Planner episode (mia.planner.episode.PlannerEpisodeConfig), CPU-sized",
    )
    reward: PlannerRewardConfig = section(
        PlannerRewardConfig, "used only without services.reward_url (the local judge)"
    )
    judge: JudgeConfig = section(
        JudgeConfig, "used only without services.reward_url (judge=llm: an LLM judge)"
    )
    trainer: TrainerConfig = section(
        lambda: cpu_planner_trainer(keep_last=2),
        "the GRPO trainer: batch_size questions per update (train_batch_size; the reference: "
        "32), n rollouts per question; keep_last 2 checkpoints (a 135M Planner: ~1.7 GB each)",
    )

    def validate(self) -> StreamingServerConfig:
        PlannerEpisodeConfig.from_dict(asdict(self.episode))  # its limits are consistent
        return self


def load_config(name: str = "server", overrides: Sequence[str] = ()) -> StreamingServerConfig:
    """``configs/ttrl_streaming/<name>.yaml`` (or a file) composed over the schema's defaults,
    with Hydra overrides (``trainer.n=8``, ``services.reward_url=null``)."""
    return load_role(StreamingServerConfig, "ttrl_streaming", name, overrides)
