"""Math parity: ``mia.rl.grpo`` against the peers' own code, veRL's ``core_algos`` and TRL's GRPO.

Identical seeded inputs (several shapes, ragged masks with prompt offsets and tool-token holes) go
through our functions and through veRL's / TRL's; values (and gradients where a loss is involved)
must agree to 1e-6. Where MIA deliberately differs, a test asserts the difference explicitly
(docs/rl.md, "Parity with veRL and TRL", says why).

The peers live in their own venv (veRL pins transformers <5.11, ours needs >=5.16):
    bash scripts/install_peers.sh
    .venv-peers/bin/python -m pytest -q -k parity tests/test_parity.py
In the main .venv this module skips. ``MIA_PARITY_REPORT=path.md`` writes the table of the
largest differences seen (quantity, peer function, max abs diff).
"""

from __future__ import annotations

import inspect
import os
import textwrap
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mia.rl.grpo import LOSS_AGG_MODES, aggregate, group_advantages, kl_penalty, policy_loss

try:
    import numpy as np
    import trl
    import verl
    from trl.trainer import grpo_trainer as trl_grpo
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import ActorConfig
except Exception as exc:  # ImportError, or a peer whose own imports fail beside our stack
    pytest.skip(
        f"veRL / TRL not importable here ({type(exc).__name__}: {exc}); the parity tests run in "
        ".venv-peers: bash scripts/install_peers.sh",
        allow_module_level=True,
    )

# veRL's deprecated functional compute_policy_loss is compared too.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
TOL = 1e-6
SHAPES = [(1, 1), (3, 5), (8, 17), (16, 64), (32, 200)]
SEEDS = [0, 1, 2]
CLIPS = [(0.2, 0.2, 3.0), (0.2, 0.28, 3.0), (0.1, 0.3, 10.0), (0.2, 0.28, 1.5)]
_MAX_DIFF: dict[tuple[str, str], float] = defaultdict(float)


def _close(quantity: str, peer: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    ours = torch.as_tensor(ours).detach().double()
    theirs = torch.as_tensor(theirs).detach().double()
    assert ours.shape == theirs.shape, (quantity, ours.shape, theirs.shape)
    diff = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    _MAX_DIFF[(quantity, peer)] = max(_MAX_DIFF[(quantity, peer)], diff)
    assert diff <= TOL, f"{quantity} vs {peer}: max abs diff {diff:.3g}"


@pytest.fixture(scope="module", autouse=True)
def _parity_report():
    yield
    path = os.environ.get("MIA_PARITY_REPORT")
    if path:
        rows = [f"| {q} | `{p}` | {d:.2e} |" for (q, p), d in sorted(_MAX_DIFF.items())]
        head = [
            f"veRL {verl.__version__}, TRL {trl.__version__}, torch {torch.__version__}",
            "",
            "| quantity | peer function | max abs diff |",
            "|---|---|---|",
        ]
        Path(path).write_text("\n".join(head + rows) + "\n")


# ----------------------------------------------------------------------------- inputs


def _mask(b: int, t: int, g: torch.Generator) -> torch.Tensor:
    """Ragged response masks: a prompt offset, a random length, sometimes a hole (tool tokens)."""
    pos = torch.arange(t)
    rows = []
    for _ in range(b):
        start = int(torch.randint(0, max(t // 3, 1), (1,), generator=g))
        end = int(torch.randint(start + 1, t + 1, (1,), generator=g))
        row = (pos >= start) & (pos < end)
        if end - start > 4 and torch.rand(1, generator=g) < 0.5:  # a tool response inside
            h = int(torch.randint(start + 1, end - 2, (1,), generator=g))
            row[h : h + 2] = False
        rows.append(row)
    return torch.stack(rows).float()


def _tokens(b: int, t: int, seed: int, spread: float = 0.7):
    """old/new/ref log-probs [B, T] (float32), advantages [B], a ragged mask [B, T].

    ``spread`` is the std of log(new/old): 0.7 puts ~40% of tokens outside a 0.2 clip band and a
    few percent beyond a dual-clip bound of 3.
    """
    g = torch.Generator().manual_seed(seed)
    old = -4.0 * torch.rand(b, t, generator=g)
    new = old + spread * torch.randn(b, t, generator=g)
    ref = new + (0.6 * torch.randn(b, t, generator=g)).clamp(-2.0, 2.0)  # k3 clamp not reached
    adv = torch.randn(b, generator=g)
    adv[torch.rand(b, generator=g) < 0.1] = 0.0
    return old, new, ref, adv, _mask(b, t, g)


def _verl_actor_config(clip_low: float, clip_high: float, clip_c: float, **batch_info):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
        global_batch_info=batch_info,
    )


# ----------------------------------------------------------------------------- advantages


def _rewards(n_groups: int, group_size: int, seed: int, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    if kind == "binary":  # correct / wrong: many tied groups of exact 0s or 1s
        return (torch.rand(n, generator=g) < 0.5).float()
    if kind == "graded":  # a judge's scale
        return torch.randint(0, 5, (n,), generator=g).float() / 4
    return torch.randn(n, generator=g)


def _uids(n_groups: int, group_size: int, seed: int) -> list[str]:
    """Group labels in shuffled order (rollouts come back interleaved)."""
    labels = [f"uid-{i}" for i in range(n_groups) for _ in range(group_size)]
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed + 100))
    return [labels[i] for i in perm]


@pytest.mark.parametrize("kind", ["normal", "binary", "graded"])
@pytest.mark.parametrize("group_size", [2, 4, 8, 16])
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_grpo_advantages_with_verl(kind: str, group_size: int, seed: int) -> None:
    n_groups = 1 + seed * 2
    rewards = _rewards(n_groups, group_size, seed, kind)
    uids = _uids(n_groups, group_size, seed)
    n = rewards.shape[0]
    t = 9
    mask = _mask(n, t, torch.Generator().manual_seed(seed))
    # veRL reads an outcome reward as token-level scores: the reward on the last response token.
    last = (mask * torch.arange(1, t + 1)).argmax(-1)
    token_rewards = torch.zeros(n, t).scatter_(1, last[:, None], rewards[:, None])
    index = np.array(uids, dtype=object)
    for norm in (True, False):  # GRPO, and Dr. GRPO (no std scaling)
        ours = group_advantages(rewards, group_ids=uids, norm_by_std=norm)
        name = "GRPO advantage" if norm else "Dr. GRPO advantage (no std)"
        theirs, returns = core_algos.compute_grpo_outcome_advantage(
            token_rewards, mask, index, norm_adv_by_std_in_grpo=norm
        )
        _close(name, "core_algos.compute_grpo_outcome_advantage", ours[:, None] * mask, theirs)
        assert torch.equal(theirs, returns)
        gidx = np.array([int(u.split("-")[1]) for u in uids])
        theirs, _ = core_algos.compute_grpo_vectorized_outcome_advantage(
            token_rewards, mask, gidx, norm_adv_by_std_in_grpo=norm
        )
        _close(
            name,
            "core_algos.compute_grpo_vectorized_outcome_advantage",
            ours[:, None] * mask,
            theirs,
        )


def test_parity_grpo_advantages_deliberate_differences_from_verl() -> None:
    ones = torch.ones(8, 1)
    # 1. A group of one sample: veRL uses mean 0, std 1 and passes the raw reward through; MIA
    #    gives 0 (no baseline, no relative signal).
    rewards = torch.tensor([0.7, 1.0, 0.0])
    uids = ["solo", "pair", "pair"]
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        rewards[:, None], ones[:3], np.array(uids, dtype=object)
    )
    ours = group_advantages(rewards, group_ids=uids)
    assert theirs[0, 0].item() == pytest.approx(0.7 / (1 + 1e-6))
    assert ours[0].item() == 0.0
    _close(
        "GRPO advantage, groups of >1",
        "core_algos.compute_grpo_outcome_advantage",
        ours[1:],
        theirs[1:, 0],
    )
    # 2. A tied group whose float mean is not exactly its rewards (8 x 1.05): veRL's std is ~6e-8
    #    and the advantage becomes -0.106 for every sample; MIA centres a tied group to exactly 0.
    rewards = torch.full((8,), 1.05)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        rewards[:, None], ones, np.zeros(8, dtype=object)
    )
    assert theirs.abs().min().item() > 0.05
    assert group_advantages(rewards, group_size=8).abs().max().item() == 0.0


def _trl_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str
) -> torch.Tensor:
    """Run TRL's own advantage code: the block of ``GRPOTrainer._generate_and_score_completions``
    from the unscorable-reward mask to ``nan_to_num``, cut out of its source and executed on a
    stub ``self`` (the method itself generates completions, which this test does not need)."""
    src = inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions)
    lines = src.splitlines()
    first = next(i for i, ln in enumerate(lines) if "unscorable_mask = torch.isnan(" in ln)
    last = next(i for i, ln in enumerate(lines) if "advantages = torch.nan_to_num(" in ln)
    block = textwrap.dedent("\n".join(lines[first : last + 1]))
    stub = SimpleNamespace(
        scale_rewards=scale_rewards,
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(1),
    )
    scope = {
        "self": stub,
        "torch": torch,
        "nanstd": trl_grpo.nanstd,
        "rewards_per_func": rewards[:, None].clone(),
        "num_generations": num_generations,
        "device": rewards.device,
    }
    exec(compile(block, "<trl advantages>", "exec"), scope)
    return scope["advantages"]


@pytest.mark.parametrize("kind", ["normal", "binary", "graded"])
@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_grpo_advantages_with_trl(kind: str, group_size: int, seed: int) -> None:
    rewards = _rewards(1 + seed * 2, group_size, seed, kind)
    # scale_rewards="group": TRL's std epsilon is 1e-4 (ours and veRL's 1e-6): equal with eps=1e-4.
    ours = group_advantages(rewards, group_size=group_size, eps=1e-4)
    theirs = _trl_advantages(rewards, group_size, "group")
    _close("GRPO advantage (eps 1e-4)", "GRPOTrainer scale_rewards=group", ours, theirs)
    # "none": Dr. GRPO's centred reward.
    ours = group_advantages(rewards, group_size=group_size, norm_by_std=False)
    theirs = _trl_advantages(rewards, group_size, "none")
    _close("Dr. GRPO advantage (no std)", "GRPOTrainer scale_rewards=none", ours, theirs)
    # "batch" (group mean, batch std): not an MIA option; it is the centred reward over the
    # batch's std, which is what this composition of MIA's pieces computes.
    if rewards.numel() > 1:
        ours = group_advantages(rewards, group_size=group_size, norm_by_std=False)
        ours = ours / (rewards.std() + 1e-4)
        theirs = _trl_advantages(rewards, group_size, "batch")
        _close("group-mean / batch-std advantage", "GRPOTrainer scale_rewards=batch", ours, theirs)


def test_parity_grpo_advantages_deliberate_differences_from_trl() -> None:
    # The std epsilon: 1e-6 (MIA, veRL) vs 1e-4 (TRL) matters for groups with a tiny spread.
    rewards = torch.tensor([0.0, 0.001])
    ours = group_advantages(rewards, group_size=2)
    theirs = _trl_advantages(rewards, 2, "group")
    assert ours[1].item() == pytest.approx(0.7061, abs=1e-4)  # 0.0005 / (0.000707 + 1e-6)
    assert theirs[1].item() == pytest.approx(0.6195, abs=1e-4)  # 0.0005 / (0.000707 + 1e-4)


# ----------------------------------------------------------------------------- aggregation


def test_parity_loss_aggregation_modes_known_to_verl() -> None:
    """Every MIA mode is a veRL mode; veRL has two more (see the docs)."""
    src = inspect.getsource(core_algos.agg_loss)
    verl_modes = {
        m
        for m in (
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        )
        if f'"{m}"' in src
    }
    assert set(LOSS_AGG_MODES) <= verl_modes
    assert verl_modes - set(LOSS_AGG_MODES) == {"token-sum", "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_aggregation_with_verl(agg: str, shape: tuple[int, int], seed: int) -> None:
    b, t = shape
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(b, t, generator=g)
    mask = _mask(b, t, g)
    _close(
        f"aggregate {agg}",
        "core_algos.agg_loss",
        aggregate(values, mask, agg),
        core_algos.agg_loss(values, mask, agg),
    )
    # Micro-batches with the global normaliser (MIA's denom; veRL's batch_num_tokens /
    # global_batch_size) add up to the loss of the whole batch in both.
    if b >= 2:
        n_tok, n_seq = mask.sum(), b
        denom = n_tok if agg == "token-mean" else n_seq
        half = b // 2
        ours = sum(
            aggregate(values[s], mask[s], agg, denom) for s in (slice(0, half), slice(half, b))
        )
        theirs = sum(
            core_algos.agg_loss(
                values[s], mask[s], agg, batch_num_tokens=n_tok, global_batch_size=n_seq
            )
            for s in (slice(0, half), slice(half, b))
        )
        _close(
            f"aggregate {agg}, micro-batches",
            "core_algos.agg_loss (global denominators)",
            ours,
            theirs,
        )
        _close(
            f"aggregate {agg}, micro-batches", "MIA whole batch", ours, aggregate(values, mask, agg)
        )
    # veRL's modes that MIA does not offer are rescalings of ours.
    if agg == "seq-mean-token-sum":
        theirs = core_algos.agg_loss(values, mask, "seq-mean-token-sum-norm")
        _close(
            "seq-mean-token-sum / T",
            "core_algos.agg_loss seq-mean-token-sum-norm",
            aggregate(values, mask, agg) / t,
            theirs,
        )
    if agg == "token-mean":
        theirs = core_algos.agg_loss(values, mask, "token-sum")
        _close(
            "token-sum / n_tokens",
            "core_algos.agg_loss token-sum",
            aggregate(values, mask, agg),
            theirs / mask.sum(),
        )


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_parity_aggregation_deliberate_difference_empty_sequences(agg: str) -> None:
    """A sequence with no response token counts as a sample (loss 0) in MIA, as in TRL; veRL
    leaves it out of the sequence count."""
    values = torch.arange(12.0).reshape(3, 4)
    mask = torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]])
    ours = aggregate(values, mask, agg)
    theirs = core_algos.agg_loss(values, mask, agg)
    assert ours.item() == pytest.approx(theirs.item() * 2 / 3)
    keep = mask.sum(-1) > 0
    _close(
        f"aggregate {agg}, empty rows dropped",
        "core_algos.agg_loss",
        aggregate(values[keep], mask[keep], agg),
        theirs,
    )


# ----------------------------------------------------------------------------- policy loss


def _ours_loss(old, new, adv, mask, clip, agg, per_token_adv=False, **kw):
    lp = new.clone().requires_grad_(True)
    a = adv[:, None].expand_as(new) if per_token_adv else adv
    loss, metrics = policy_loss(
        lp, old, a, mask, clip_low=clip[0], clip_high=clip[1], clip_ratio_c=clip[2], agg=agg, **kw
    )
    loss.backward()
    return loss.detach(), lp.grad, metrics


@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: f"low{c[0]}-high{c[1]}-c{c[2]}")
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_policy_loss_with_verl(clip, agg: str, shape: tuple[int, int], seed: int) -> None:
    old, new, _, adv, mask = _tokens(*shape, seed)
    loss, grad, m = _ours_loss(old, new, adv, mask, clip, agg, per_token_adv=seed == 2)
    adv_bt = adv[:, None].expand_as(new)

    lp = new.clone().requires_grad_(True)
    cfg = _verl_actor_config(*clip)
    theirs, vm = core_algos.compute_policy_loss_vanilla(
        old, lp, adv_bt, mask, loss_agg_mode=agg, config=cfg
    )
    theirs.backward()
    peer = "core_algos.compute_policy_loss_vanilla"
    _close(f"policy loss {agg}", peer, loss, theirs)
    _close(f"policy loss {agg}: d loss / d logprobs", peer, grad, lp.grad)
    _close("clipfrac", f"{peer} pg_clipfrac", m["clipfrac"], vm["actor/pg_clipfrac"])
    _close(
        "clipfrac_dual",
        f"{peer} pg_clipfrac_lower",
        m["clipfrac_dual"],
        vm["actor/pg_clipfrac_lower"],
    )
    _close("approx_kl", f"{peer} ppo_kl", m["approx_kl"], vm["actor/ppo_kl"])

    # The deprecated functional form (explicit arguments) agrees too.
    theirs, clipfrac, ppo_kl, clipfrac_lower = core_algos.compute_policy_loss(
        old,
        new,
        adv_bt,
        mask,
        cliprange=clip[0],
        cliprange_low=clip[0],
        cliprange_high=clip[1],
        clip_ratio_c=clip[2],
        loss_agg_mode=agg,
    )
    peer = "core_algos.compute_policy_loss"
    _close(f"policy loss {agg}", peer, loss, theirs)
    _close("clipfrac_dual", f"{peer} pg_clipfrac_lower", m["clipfrac_dual"], clipfrac_lower)
    # Without the dual clip (MIA: clip_ratio_c=None) = veRL with a bound no ratio reaches (the
    # log-ratio is clamped to 20 in both, so exp(20) < 1e9).
    loss_nodual, grad_nodual, _ = _ours_loss(old, new, adv, mask, (clip[0], clip[1], None), agg)
    lp = new.clone().requires_grad_(True)
    theirs, _ = core_algos.compute_policy_loss_vanilla(
        old, lp, adv_bt, mask, loss_agg_mode=agg, config=_verl_actor_config(clip[0], clip[1], 1e9)
    )
    theirs.backward()
    _close(
        f"policy loss {agg}, no dual clip",
        "core_algos.compute_policy_loss_vanilla (clip_ratio_c=1e9)",
        loss_nodual,
        theirs,
    )
    _close(
        f"policy loss {agg}, no dual clip: gradient",
        "core_algos.compute_policy_loss_vanilla (clip_ratio_c=1e9)",
        grad_nodual,
        lp.grad,
    )


def test_parity_policy_loss_inputs_exercise_every_branch() -> None:
    """The random inputs above are not vacuous: they clip, dual-clip and leave tokens unclipped."""
    old, new, _, adv, mask = _tokens(32, 200, 0)
    _, _, m = _ours_loss(old, new, adv, mask, (0.2, 0.28, 3.0), "token-mean")
    assert 0.1 < m["clipfrac"] < 0.6
    assert m["clipfrac_dual"] > 0.005
    assert m["ratio_max"] > 3 and m["ratio_min"] < 0.5


def test_parity_dual_clip_bound_validated_like_verl() -> None:
    old, new, _, adv, mask = _tokens(2, 3, 0)
    with pytest.raises(AssertionError):
        core_algos.compute_policy_loss(
            old, new, adv[:, None].expand_as(new), mask, cliprange=0.2, clip_ratio_c=1.0
        )
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(new, old, adv, mask, clip_ratio_c=1.0)


# ----------------------------------------------------------------------------- TRL's GRPO loss


class _Accelerator:
    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather


def _trl_loss(
    old,
    new,
    adv,
    mask,
    *,
    loss_type,
    eps_low,
    eps_high,
    delta=None,
    beta=0.0,
    ref=None,
    num_items=None,
):
    """Call TRL's own ``GRPOTrainer._compute_loss`` on a stub ``self`` whose log-prob forward
    returns ``new``: every line of TRL's loss math runs; only the model forward is replaced."""
    b, t = new.shape
    lp = new.clone().requires_grad_(True)
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, torch.zeros_like(lp), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=t,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        accelerator=_Accelerator(),
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=False, steps_per_generation=1),
    )
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum() if num_items is None else num_items,
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    loss = trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), lp.grad, stub._metrics["train"]


# TRL loss_type -> the MIA aggregation with the same normalisation.
TRL_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "luspo": "seq-mean-token-sum",
}


@pytest.mark.parametrize("loss_type", list(TRL_LOSS_TYPES))
@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: f"low{c[0]}-high{c[1]}-c{c[2]}")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_policy_loss_with_trl(
    loss_type: str, clip, shape: tuple[int, int], seed: int
) -> None:
    old, new, _, adv, mask = _tokens(*shape, seed)
    agg = TRL_LOSS_TYPES[loss_type]
    peer = f"GRPOTrainer._compute_loss loss_type={loss_type}"
    # TRL has no dual clip by default: MIA with clip_ratio_c=None.
    loss, grad, _ = _ours_loss(old, new, adv, mask, (clip[0], clip[1], None), agg)
    theirs, tgrad, tm = _trl_loss(
        old, new, adv, mask, loss_type=loss_type, eps_low=clip[0], eps_high=clip[1]
    )
    _close(f"policy loss {agg}, no dual clip", peer, loss, theirs)
    _close(f"policy loss {agg}, no dual clip: gradient", peer, grad, tgrad)
    # TRL's `delta` (two-sided clipping) caps the ratio of every token at delta; for delta above
    # 1 + eps_high that is exactly veRL's / MIA's dual clip with clip_ratio_c = delta.
    loss, grad, m = _ours_loss(old, new, adv, mask, clip, agg)
    theirs, tgrad, tm = _trl_loss(
        old, new, adv, mask, loss_type=loss_type, eps_low=clip[0], eps_high=clip[1], delta=clip[2]
    )
    _close(f"policy loss {agg}, dual clip", f"{peer}, delta=clip_ratio_c", loss, theirs)
    _close(f"policy loss {agg}, dual clip: gradient", f"{peer}, delta=clip_ratio_c", grad, tgrad)
    # TRL's clip metrics: low = A<0 and ratio below the band, high = A>0 and above it; together
    # they are veRL's / MIA's clipfrac (the tokens where the clipped term is the larger loss).
    region = torch.tensor(tm["clip_ratio/region_mean"][-1])
    _close("clipfrac", f"{peer} clip_ratio/region_mean", m["clipfrac"], region)


@pytest.mark.parametrize("shape", SHAPES[1:])
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_dapo_global_token_normaliser_with_trl(shape: tuple[int, int], seed: int) -> None:
    """TRL's "dapo" divides by the tokens of the whole generation batch (num_items_in_batch):
    MIA's token-mean with ``denom`` = the global token count, micro-batch by micro-batch."""
    old, new, _, adv, mask = _tokens(*shape, seed)
    b = shape[0]
    n_tok = mask.sum()
    for s in (slice(0, b // 2), slice(b // 2, b)):
        loss, grad, _ = _ours_loss(
            old[s], new[s], adv[s], mask[s], (0.2, 0.28, None), "token-mean", denom=n_tok
        )
        theirs, tgrad, _ = _trl_loss(
            old[s],
            new[s],
            adv[s],
            mask[s],
            loss_type="dapo",
            eps_low=0.2,
            eps_high=0.28,
            num_items=n_tok,
        )
        _close(
            "policy loss token-mean, global denominator",
            "GRPOTrainer._compute_loss loss_type=dapo",
            loss,
            theirs,
        )
        _close(
            "policy loss token-mean, global denominator: gradient",
            "GRPOTrainer._compute_loss loss_type=dapo",
            grad,
            tgrad,
        )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_dr_grpo_normaliser_with_trl(shape: tuple[int, int], seed: int) -> None:
    """TRL's "dr_grpo" divides the token sum by B x max_completion_length: MIA's
    seq-mean-token-sum over that constant length (MIA has no mode for it; see the docs)."""
    old, new, _, adv, mask = _tokens(*shape, seed)
    loss, _, _ = _ours_loss(old, new, adv, mask, (0.2, 0.2, None), "seq-mean-token-sum")
    theirs, _, _ = _trl_loss(old, new, adv, mask, loss_type="dr_grpo", eps_low=0.2, eps_high=0.2)
    _close(
        "policy loss seq-mean-token-sum / T",
        "GRPOTrainer._compute_loss loss_type=dr_grpo",
        loss / shape[1],
        theirs,
    )


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_kl_loss_with_trl(loss_type: str, shape: tuple[int, int], seed: int) -> None:
    """TRL adds beta x k3 to each token's loss before aggregating; MIA adds kl_coef x the
    aggregated k3 (the same, aggregation being linear) while k3 stays below MIA's clamp of 10."""
    old, new, ref, adv, mask = _tokens(*shape, seed)
    agg, beta = TRL_LOSS_TYPES[loss_type], 0.04
    lp = new.clone().requires_grad_(True)
    pg, _ = policy_loss(
        lp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=None, agg=agg
    )
    loss = pg + beta * aggregate(kl_penalty(lp, ref, "k3"), mask, agg)
    loss.backward()
    theirs, tgrad, tm = _trl_loss(
        old, new, adv, mask, loss_type=loss_type, eps_low=0.2, eps_high=0.28, beta=beta, ref=ref
    )
    peer = f"GRPOTrainer._compute_loss loss_type={loss_type}, beta={beta}"
    _close(f"policy + k3 KL loss {agg}", peer, loss.detach(), theirs)
    _close(f"policy + k3 KL loss {agg}: gradient", peer, lp.grad, tgrad)
    kl_mean = aggregate(kl_penalty(new, ref, "k3"), mask, "token-mean")
    _close("k3 KL, token mean", f"{peer} metric kl", kl_mean, torch.tensor(tm["kl"][-1]))


def test_parity_deliberate_differences_from_trl_loss() -> None:
    # 1. k3 is clamped to [-10, 10] (veRL's low_var_kl); TRL's k3 is not.
    new, ref = torch.tensor([[-5.0]]), torch.tensor([[-1.0]])  # log(ref/new) = 4: k3 = e^4 - 5
    mask, adv, old = torch.ones(1, 1), torch.zeros(1), new.clone()
    theirs, _, tm = _trl_loss(
        old, new, adv, mask, loss_type="bnpo", eps_low=0.2, eps_high=0.2, beta=1.0, ref=ref
    )
    assert theirs.item() == pytest.approx(torch.e**4 - 5, rel=1e-6)
    assert kl_penalty(new, ref, "k3").item() == 10.0
    # 2. The log-ratio is clamped to [-20, 20] before exp (as veRL); TRL exponentiates it as is.
    old, new, adv = torch.tensor([[-30.0]]), torch.tensor([[-5.0]]), torch.tensor([-1.0])
    theirs, _, _ = _trl_loss(old, new, adv, mask, loss_type="bnpo", eps_low=0.2, eps_high=0.2)
    ours, _ = policy_loss(new, old, adv, mask, clip_ratio_c=None)
    assert theirs.item() == pytest.approx(torch.e**25, rel=1e-5)
    assert ours.item() == pytest.approx(torch.e**20, rel=1e-5)


# ----------------------------------------------------------------------------- KL estimators

KL_NAMES = [
    "k1",
    "kl",
    "abs",
    "k2",
    "mse",
    "k3",
    "low_var_kl",
    "k1+",
    "abs+",
    "k2+",
    "k3+",
    "low_var_kl+",
]


@pytest.mark.parametrize("name", KL_NAMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_parity_kl_estimators_with_verl(name: str, shape: tuple[int, int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = -4.0 * torch.rand(*shape, generator=g)
    # Wide differences, so the clamps (log-ratio at +-20, k3 at +-10) are hit in both.
    ref = lp + 12.0 * torch.randn(*shape, generator=g)
    x = lp.clone().requires_grad_(True)
    ours = kl_penalty(x, ref, name)
    ours.sum().backward()
    y = lp.clone().requires_grad_(True)
    theirs = core_algos.kl_penalty(y, ref, name)
    theirs.sum().backward()
    _close(f"KL {name}", "core_algos.kl_penalty", ours.detach(), theirs.detach())
    _close(f"KL {name}: gradient", "core_algos.kl_penalty", x.grad, y.grad)
    if name.endswith("+"):  # straight-through: the value of the estimator, the gradient of k2
        assert torch.allclose(x.grad, (lp - ref), atol=TOL)


def test_parity_kl_estimator_names_match_verl() -> None:
    for bad in ("full", "k9"):
        with pytest.raises(NotImplementedError):
            core_algos.kl_penalty(torch.zeros(1), torch.zeros(1), bad)
        with pytest.raises(ValueError, match="unknown KL estimator"):
            kl_penalty(torch.zeros(1), torch.zeros(1), bad)


def test_parity_bench_runs_both_engines_on_one_prompt_order(tmp_path: Path) -> None:
    """``bench/rl_parity.py --tiny``: both engines train on the same prompts, in the same order,
    and the run writes its curves (PNG) and figures (JSON) with the wall-time ratio."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MIA_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, str(root / "bench" / "rl_parity.py"), "--tiny", "--threads", "1",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prompt order: the same on every run" in proc.stdout
    record = json.loads((tmp_path / "out" / "rl_parity.json").read_text())
    runs = {r["engine"]: r for r in record["runs"]}
    assert sorted(runs) == ["ours", "trl"]
    assert runs["ours"]["prompts"] == runs["trl"]["prompts"]
    assert all(len(r["rewards"]) == 2 and len(r["prompts"]) == 2 for r in runs.values())
    assert all(0.0 <= x <= 1.0 for r in runs.values() for x in r["rewards"])
    summary = record["summary"]
    assert summary["wall_ratio"] == summary["ours"]["wall_s"] / summary["trl"]["wall_s"]
    assert (tmp_path / "out" / "rl_parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
