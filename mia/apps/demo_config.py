"""The ``mia demo`` config schema (``mia demo --help-config`` lists every key).

:class:`DemoConfig` holds the demo's own choices (the world, the warm start, the TTRL passes,
how local roles and memory_serve run) and composes ``mia eval``'s schema as its ``eval`` section.
Every default lives in a schema; ``configs/demo/default.yaml`` holds the demo's values where
they differ (:func:`load_demo_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mia import precision
from mia.config import load_config, load_dict, merge, option, resolve_path, section
from mia.errors import MiaError
from mia.eval.config import EvalConfig
from mia.paths import config_dir

CONFIG_DIR = config_dir("demo")
ROLES = ("executor", "planner", "manager")


@dataclass
class WorldChoice:
    """The synthetic world the demo evaluates on."""

    seed: int = option(
        20999,
        "world seed: 20999, a test-range world (configs/world/seeds.yaml) that no role trains "
        "or was chosen on and that no claim uses (docs/protocol.md); the shipped roles were "
        "trained on train-range worlds 100-115",
    )
    size: str = option("default", "small | default | large (configs/world/<size>.yaml)")


@dataclass
class StreamChoice:
    """Which test questions the demo asks, in which order (before ``eval.offset`` and
    ``eval.limit``)."""

    questions: str = option(
        "protocol",
        "protocol = the protocol's stream (docs/protocol.md): the test split's convention "
        "questions and its first `standard` standard text questions (single_hop, bridge, "
        "comparison), in file order | file = every test question of eval.modality, in file "
        "order (the development bench's stream on world 1)",
    )
    standard: int = option(24, "questions=protocol: how many standard questions it keeps")


@dataclass
class WarmStartChoice:
    """Warm-started local roles (:mod:`mia.apps.warm_start`), used when the role runs on the
    embedded model (not with ``--model`` or ``--<role>-url``)."""

    enabled: bool = option(
        True,
        "roles on the embedded model start from an SFT on gold transcripts of training worlds "
        "(configs/warm_start; a shipped adapter or built once, cached under $MIA_HOME/models, "
        "keyed by the recipe)",
    )
    roles: list[str] = option(["executor", "planner"], "the warm-started roles")
    overrides: dict[str, list[str]] = option(
        {},
        "role -> Hydra overrides of configs/warm_start/<role>.yaml (a changed recipe trains anew)",
    )
    sampling: dict[str, dict[str, Any]] = option(
        {
            "executor": {"max_tokens": 192, "presence_penalty": 0.0},
            "planner": {"max_tokens": 160},
        },
        "role -> sampling of the warm-started role, merged over local_roles.<role>.sampling "
        "(docs/demo.md, 'Sampling')",
    )


@dataclass
class TTRLChoice:
    """The TTRL passes after the policies (:func:`ttrl.run_ttrl_pass` over
    configs/ttrl/default.yaml); each pass plans where ``mia`` does (``eval.memory``)."""

    enabled: bool = option(True, "run the TTRL passes (--no-ttrl skips them)")
    modes: list[str] = option(
        ["supervised"],
        "one pass per mode, each on a fresh memory store: supervised (ground truth) | nogt",
    )
    nogt_method: str = option(
        "vote",
        "nogt judging: vote (majority over the n answers; no LLM) | panel (3 critics + an arbiter)",
    )
    batch_size: int = option(4, "questions per batch: one Planner GRPO step each")
    n: int = option(2, "plans per question (the GRPO group)")
    lr: float = option(
        1.0e-5,
        "the Planner's learning rate in every pass (trainer.policy.optim.lr); 0 = the same "
        "pass (answer rule, rollouts, memory writes) with the Planner's weights never changed: "
        "the protocol's ttrl_lr0 control",
    )
    nogt_alone_samples: int = option(
        3,
        "nogt with vote, when eval.memory.plan_without_failure is false: the Executor answers "
        "an unplanned question this many times (the first greedy, the others sampled) and the "
        "majority answers it; a question whose answers disagree is remembered as a failure "
        "(ttrl memory.alone_samples; docs/ttrl.md)",
    )
    overrides: list[str] = option(
        [
            "episode.plan_max_tokens=160",
            "episode.decision_max_tokens=32",
            "episode.replan_max_tokens=128",
            "trainer.save_freq=-1",
            "trainer.sampling.temperature=1.3",
            "trainer.policy.loss.temperature=1.3",
            "memory.evaluate=false",
            "reward.evidence_weight=0.1",
        ],
        "more configs/ttrl keys for every pass: reply caps, no checkpoint "
        "(save_freq -1: the adapted Planner is not kept), plans sampled and the loss computed "
        "at temperature 1.3, no /batch_evaluate selection-rule files, evidence credit for a "
        "wrong plan whose searches read the answer's passage (docs/demo.md, 'The TTRL pass')",
    )


@dataclass
class DemoConfig:
    """``mia demo``: the world, the evaluation it runs (``eval``: ``mia eval``'s schema), the
    warm start, the TTRL passes, and how the local roles and memory_serve run. The demo's
    values are in configs/demo/default.yaml; ``mia demo --cfg`` prints the composed config."""

    world: WorldChoice = section(WorldChoice, "the synthetic world")
    stream: StreamChoice = section(StreamChoice, "which test questions, in which order")
    eval: EvalConfig = section(
        EvalConfig,
        "the evaluation, mia eval's schema (mia.eval.config.EvalConfig): limit (questions per "
        "policy), modality, policies, order, workers, reflect, memory gates, judge, and the "
        "services the demo starts (services.*; the demo sets dataset and services.index). The "
        "demo's values are in configs/demo/default.yaml: mia demo --cfg prints them",
    )
    warm_start: WarmStartChoice = section(WarmStartChoice, "warm-started local roles")
    ttrl: TTRLChoice = section(TTRLChoice, "the TTRL passes over the same questions")
    local_roles: dict[str, Any] = option(
        {
            "executor": {"sampling": {"max_tokens": 128}, "batch_wait_ms": 200},
            "planner": {"sampling": {"max_tokens": 96}, "batch_wait_ms": 200},
            "manager": {"sampling": {"max_tokens": 96}, "batch_wait_ms": 200},
        },
        "role -> llm fields for a role on a LOCAL model (not --<role>-url endpoints), over the "
        "llm config's: reply caps, and a batching window in which concurrent questions' "
        "requests decode together",
    )
    local_dtype: str = option(
        "auto",
        "compute dtype of local roles (and of the warm-start SFT): auto = bfloat16 on CPUs "
        "with native bf16 (avx512_bf16/amx), else float32 | bfloat16 | float16 | float32 "
        "(mia.precision)",
    )
    agent: dict[str, Any] = option({"max_turns": 4}, "serve's agent section (configs/agent/ keys)")
    memory_compress: str = option(
        "auto",
        "how memory_serve compresses a trajectory (the rag store keeps raw traces): auto = "
        "rules when the Manager is a local model, llm when it is an endpoint (--manager-url) "
        "| llm | rules",
    )
    cold_start: str = option(
        "auto",
        "memory_serve planner.cold_start (with fewer than top_k positives or negatives the "
        "Manager writes the plan, as in the reference): auto = off when the Manager is a local "
        "model, on when it is an endpoint (--manager-url) | true | false",
    )
    memory_retrieval: dict[str, Any] = option(
        {"key": "template", "min_similarity": 0.9},
        "memory_serve store.retrieval keys of every store: memories retrieved by question "
        "template (named entities masked) and only above a cosine floor, so the Planner sees "
        "workflows of the same kind of question or none (docs/demo.md)",
    )

    def validate(self) -> DemoConfig:
        if self.world.seed < 0:
            raise MiaError("demo config: world.seed must be >= 0")
        if self.world.size not in ("small", "default", "large"):
            raise MiaError("demo config: world.size must be small, default or large")
        if self.stream.questions not in ("protocol", "file") or self.stream.standard < 0:
            raise MiaError(
                "demo config: stream.questions must be protocol or file, stream.standard >= 0"
            )
        if self.eval.dataset is not None or self.eval.services.index is not None:
            raise MiaError(
                "demo config: eval.dataset and eval.services.index are the world's (set world.*)"
            )
        try:
            self.eval.validate()
        except MiaError as err:
            raise MiaError(f"demo config: eval: {str(err).removeprefix('eval config: ')}") from None
        precision.normalise(self.local_dtype)  # raises on an unknown spelling
        if self.memory_compress not in ("auto", "llm", "rules"):
            raise MiaError("demo config: memory_compress must be auto, llm or rules")
        if str(self.cold_start).lower() not in ("auto", "true", "false"):
            raise MiaError("demo config: cold_start must be auto, true or false")
        unknown = sorted(set(self.local_roles) - set(ROLES))
        if unknown:
            raise MiaError(f"demo config: local_roles has unknown role(s) {unknown}")
        self._validate_warm_start()
        self._validate_ttrl()
        return self

    def _validate_warm_start(self) -> None:
        from mia.apps.warm_start import ROLES as WARM_ROLES

        w = self.warm_start
        bad = sorted(set(w.roles) | set(w.overrides) | set(w.sampling))
        bad = [r for r in bad if r not in WARM_ROLES]
        if bad:
            raise MiaError(f"demo config: warm_start has unknown role(s) {bad}")

    def _validate_ttrl(self) -> None:
        t = self.ttrl
        if not t.modes or set(t.modes) - {"supervised", "nogt"}:
            raise MiaError("demo config: ttrl.modes must be a non-empty list of supervised|nogt")
        if t.nogt_method not in ("vote", "panel"):
            raise MiaError("demo config: ttrl.nogt_method must be vote or panel")
        if t.batch_size < 1 or t.n < 1:
            raise MiaError("demo config: ttrl.batch_size and ttrl.n must be >= 1")
        if t.lr < 0:
            raise MiaError("demo config: ttrl.lr must be >= 0")
        if not t.enabled:
            return
        # Composed now, so a bad ttrl.overrides entry fails before the policies run.
        from ttrl.config import load_config as load_ttrl

        for mode in t.modes:
            over = [f"mode={mode}", f"nogt.method={t.nogt_method}"]
            try:
                load_ttrl("default", [*over, *ttrl_overrides(self, mode)])
            except MiaError as err:
                raise MiaError(f"demo config: ttrl ({mode}): {err}") from err


def load_demo_config(path: str | None, overrides: list[str]) -> DemoConfig:
    """The schema's defaults <- configs/demo/default.yaml (the demo's values) <- a demo YAML
    ``path`` (a file or a name in configs/demo/) <- ``key=value`` overrides. A YAML with a Hydra
    defaults list composes what it names (efficacy.yaml names default); one without builds on
    default.yaml."""
    from omegaconf import OmegaConf

    default = CONFIG_DIR / "default.yaml"
    source: Any = resolve_path(path or "default", "demo")
    if source.resolve() != default.resolve() and "defaults" not in OmegaConf.load(source):
        source = merge(load_dict(default), load_dict(source))
    return load_config(DemoConfig, source, overrides, group="demo", where="demo config")


def ttrl_overrides(cfg: DemoConfig, mode: str) -> list[str]:
    """The configs/ttrl keys of the demo's pass in ``mode`` (``run_ttrl_pass`` adds the data,
    services, batch and group sizes): the judge, reflection and memory gates of ``eval``."""
    judge_mode = cfg.eval.judge.mode
    memory = cfg.eval.memory
    gated = not memory.plan_without_failure
    return [
        *([f"judge.mode={judge_mode}"] if judge_mode else []),
        # The pass follows the policies' flow: without reflection a rollout is the plan
        # prompt and the plan (no decision or replan).
        f"episode.reflect={str(cfg.eval.reflect).lower()}",
        *(
            ["memory.remember_expected=true"]
            if memory.remember_expected and mode == "supervised"
            else []
        ),
        # TTRL plans where mia does. Without ground truth the vote needs several answers of
        # the unplanned Executor; a question whose answers disagree is the failure it reads.
        *(["memory.plan_without_failure=false"] if gated else []),
        *(
            [f"memory.alone_samples={cfg.ttrl.nogt_alone_samples}"]
            if gated and mode == "nogt" and cfg.ttrl.nogt_method == "vote"
            else []
        ),
        f"trainer.policy.optim.lr={cfg.ttrl.lr}",
        *cfg.ttrl.overrides,
    ]
