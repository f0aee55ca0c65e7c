"""GRPO math against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from mia.rl.grpo import (
    aggregate,
    entropy_from_logits,
    group_advantages,
    kl_penalty,
    policy_loss,
    token_logprobs,
)

# ----------------------------------------------------------------------------- advantages


def test_group_advantages_normalised_by_unbiased_std() -> None:
    # One group of four: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025.
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), group_size=4, eps=0.0)
    assert torch.allclose(adv, torch.tensor([0.866025, -0.866025, 0.866025, -0.866025]), atol=1e-6)


def test_group_advantages_without_std_is_centered_reward() -> None:
    adv = group_advantages(torch.tensor([3.0, 1.0, 0.0, 2.0]), group_size=2, norm_by_std=False)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]


def test_group_advantages_zero_variance_and_singleton_groups_are_zero() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.7, 1.0])
    adv = group_advantages(rewards, group_ids=["a", "a", "b", "c", "b"])
    # a: all equal -> 0; b = [0, 1]: mean .5, std .7071 -> -+0.7071; c: singleton -> 0.
    assert torch.isfinite(adv).all()
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -0.707106, 0.0, 0.707106]), atol=1e-5)


@pytest.mark.parametrize("reward", [0.05, 0.15, 0.95, 1.05])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_a_tied_group_gets_exactly_zero_advantage_whatever_its_float_mean(
    reward: float, n: int
) -> None:
    """Eight float32 rewards of 1.05 average to 1.05 - 6e-8; divided by their (tiny) std that
    residue became advantages of about 0.1, so a step whose groups were all tied still moved
    the policy (TTRL with 8 plans). Tied is
    tied: exactly 0, so the trainer's skip of signal-free steps sees it."""
    adv = group_advantages(torch.tensor([reward] * n + [0.0, 1.0]), group_ids=[0] * n + [1, 1])
    assert adv[:n].tolist() == [0.0] * n
    assert adv[n:].tolist() == pytest.approx([-0.707106, 0.707106], abs=1e-5)


def test_group_advantages_group_ids_may_be_a_tensor_in_any_order() -> None:
    a = group_advantages(torch.tensor([0.0, 5.0, 1.0, 7.0]), group_ids=torch.tensor([9, 4, 9, 4]))
    assert torch.allclose(a, torch.tensor([-0.707106, -0.707106, 0.707106, 0.707106]), atol=1e-5)


def test_group_advantages_rejects_bad_grouping() -> None:
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        group_advantages(torch.zeros(4))


# ----------------------------------------------------------------------------- aggregation


def test_aggregation_modes() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    # A global denominator makes micro-batch shares add up to the whole-batch loss.
    halves = [aggregate(values[i : i + 1], mask[i : i + 1], "token-mean", denom=4) for i in (0, 1)]
    assert sum(h.item() for h in halves) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(values, mask, "mean")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- policy loss


def _ratios(*r: float) -> torch.Tensor:
    return torch.log(torch.tensor([list(r)]))


def test_policy_loss_positive_advantage_clips_high_ratio() -> None:
    lp = _ratios(1.5, 0.5, 1.0).requires_grad_(True)
    loss, m = policy_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    # per token: max(-r, -clip(r, .8, 1.2)) = [-1.2, -0.5, -1.0] -> mean -0.9
    assert loss.item() == pytest.approx(-0.9, abs=1e-6)
    assert m["clipfrac"].item() == pytest.approx(1 / 3)
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["ratio_max"].item() == pytest.approx(1.5)
    assert m["ratio_min"].item() == pytest.approx(0.5)
    # approx_kl = mean(old - new) = -(ln 1.5 + ln .5 + 0) / 3
    assert m["approx_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 3)
    loss.backward()
    # clipped token has no gradient; unclipped ones: d(-r)/d(log r) / 3 = -r / 3
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -0.5 / 3, -1.0 / 3]]), atol=1e-6)


def test_policy_loss_negative_advantage_and_dual_clip() -> None:
    loss, m = policy_loss(
        _ratios(1.5, 0.5, 4.0), torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3)
    )
    # max(r, clip(r)) = [1.5, 0.8, 4.0]; dual clip caps 4.0 at c = 3 -> mean (1.5+.8+3)/3
    assert loss.item() == pytest.approx((1.5 + 0.8 + 3.0) / 3, abs=1e-6)
    assert m["clipfrac"].item() == pytest.approx(1 / 3)  # only r=0.5 is clipped (0.8 > 0.5)
    assert m["clipfrac_dual"].item() == pytest.approx(1 / 3)
    loss_nodual, _ = policy_loss(
        _ratios(1.5, 0.5, 4.0),
        torch.zeros(1, 3),
        torch.tensor([-1.0]),
        torch.ones(1, 3),
        clip_ratio_c=None,
    )
    assert loss_nodual.item() == pytest.approx((1.5 + 0.8 + 4.0) / 3, abs=1e-6)


def test_policy_loss_clip_higher_and_mask() -> None:
    lp = _ratios(1.25, 1.25, 7.0)
    mask = torch.tensor([[1, 1, 0]])  # the last token is a tool token: ignored everywhere
    loss, m = policy_loss(lp, torch.zeros(1, 3), torch.tensor([2.0]), mask, clip_high=0.28)
    assert loss.item() == pytest.approx(-2.5, abs=1e-6)  # 1.25 < 1.28: unclipped, -2 * 1.25
    assert m["clipfrac"].item() == 0.0
    assert m["ratio_max"].item() == pytest.approx(1.25)


def test_policy_loss_sequence_aggregation_and_per_token_advantages() -> None:
    lp = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = policy_loss(lp, lp, adv, mask, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-((1 + 3) / 2 + 2) / 2)


# ----------------------------------------------------------------------------- KL, entropy, log-probs


def test_kl_penalty_estimators() -> None:
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    # k3 = q/p - log(q/p) - 1 = 0.5 + ln 2 - 1
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(lp, lp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(lp, ref, "k9")


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e9, -1e9]]])
    ent = entropy_from_logits(logits, chunk_size=1)
    expected = [math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert ent.shape == (1, 2)
    assert torch.allclose(ent, torch.tensor([expected]), atol=1e-6)


def test_token_logprobs_matches_log_softmax_and_hand_value() -> None:
    logits = torch.tensor([[[0.0, math.log(3)], [2.0, 2.0]]])
    lp = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.75), math.log(0.5)]]), atol=1e-6)
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3, 5, 11, generator=g, dtype=torch.bfloat16)
    ids = torch.randint(0, 11, (3, 5), generator=g)
    ref = torch.log_softmax(big.float(), -1).gather(-1, ids[..., None]).squeeze(-1)
    for chunk in (None, 1, 4, 100):
        out = token_logprobs(big, ids, chunk_size=chunk)
        assert out.dtype == torch.float32
        assert torch.allclose(out, ref, atol=1e-6)
