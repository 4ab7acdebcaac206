"""Advantages, the clipped loss, KL estimators and pass@k against values worked out by hand."""

import math

import pytest
import torch

from postrl.algo.advantages import ADVANTAGES, grpo, rloo
from postrl.algo.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LOSSES,
    Aggregation,
    aggregate,
    kl_estimate,
    ppo_clip,
)
from postrl.algo.passk import pass_at_k
from postrl.errors import ConfigError


def test_grpo_scales_by_unbiased_group_std():
    adv = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale_by_std=True)
    # mean 0.5, centred +-0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv.tolist()[0] == pytest.approx([expected, -expected, -expected, expected], abs=1e-6)


def test_dr_grpo_only_centres():
    adv = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]), scale_by_std=False)
    assert adv.tolist() == [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]


def test_equal_rewards_give_zero_advantage():
    assert grpo(torch.ones(1, 8)).abs().max().item() == 0.0


def test_rloo_leave_one_out():
    # i=0: 1 - mean(0, 0) = 1;  i=1: 0 - mean(1, 0) = -0.5
    assert rloo(torch.tensor([[1.0, 0.0, 0.0]])).tolist()[0] == pytest.approx([1.0, -0.5, -0.5])


def test_registries_know_their_names():
    assert ADVANTAGES.get("grpo") is grpo and LOSSES.get("ppo_clip") is ppo_clip
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    assert LOSS_AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"]
    with pytest.raises(ConfigError) as e:
        ADVANTAGES.get("nope")
    assert str(e.value) == "config key 'rl.advantage' = 'nope': unknown advantage estimator (expected one of: gae, grpo, reinforce_pp, rloo)"


def test_an_aggregation_cannot_be_registered_without_its_micro_batch_rule():
    with pytest.raises(TypeError):
        LOSS_AGGREGATIONS.register("token-sum")(lambda values, mask: (values * mask).sum())
    assert "token-sum" not in LOSS_AGGREGATIONS.names()


@pytest.mark.parametrize("name", LOSS_AGGREGATIONS.names())
def test_each_aggregations_micro_batch_rule_splits_it_over_parts(name):
    """The rule registered with an aggregation: its parts' aggregates, weighted by `share`, add up
    to the whole minibatch's (what gradient accumulation relies on)."""
    reduce, share = Aggregation(name, budget=4), LOSS_AGGREGATIONS.facts(name).share  # budget: if it needs one
    values = torch.arange(12.0).view(3, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # 3 + 1 + 4 tokens
    parts = [slice(0, 1), slice(1, 3)]
    total = sum(share(mask[p], mask) * reduce(values[p], mask[p]) for p in parts)
    assert float(total) == pytest.approx(float(reduce(values, mask)), rel=1e-6)
    assert sum(share(mask[p], mask) for p in parts) == pytest.approx(1.0)
    assert float(aggregate(values, mask, reduce)) == float(LOSS_AGGREGATIONS.get(name)(values, mask, *(
        [4] if LOSS_AGGREGATIONS.facts(name).needs_budget else [])))


def _ppo_case():
    old = torch.zeros(2, 2)
    # ratios: seq0 = [1.5, 1.0], seq1 = [0.5, 1.2] (second token of seq1 is masked out)
    logp = torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.2]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return logp, old, adv, mask


def test_ppo_clip_token_mean_by_hand():
    logp, old, adv, mask = _ppo_case()
    loss, stats = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean")
    # seq0 tok0: min(1.5, 1.28) * 1 -> -1.28 ; tok1: -1.0
    # seq1 tok0: min(0.5 * -1, 0.8 * -1) = -0.8 -> +0.8
    assert loss.item() == pytest.approx((-1.28 - 1.0 + 0.8) / 3, abs=1e-6)
    assert stats.clip_frac == pytest.approx(2 / 3)


def test_ppo_clip_seq_mean_by_hand():
    logp, old, adv, mask = _ppo_case()
    loss, _ = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(((-1.28 - 1.0) / 2 + 0.8) / 2, abs=1e-6)


def test_clipped_tokens_get_no_gradient():
    logp, old, adv, mask = _ppo_case()
    logp = logp.clone().requires_grad_(True)
    loss, _ = ppo_clip(logp, old, adv, mask, 0.2, 0.28, "token-mean")
    loss.backward()
    # clipped (seq0 tok0, seq1 tok0) and masked (seq1 tok1) tokens: zero; seq0 tok1: -ratio * A / 3
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -1 / 3, 0.0, 0.0], abs=1e-7)


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    ln2 = math.log(2)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(ln2, abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2, abs=1e-6)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2, abs=1e-6)
    same = kl_estimate(logp, logp, "k3")
    assert same.item() == 0.0


def test_k3_is_unbiased_estimate_of_kl():
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.4, 0.4, 0.2])
    exact = float((p * (p / q).log()).sum())
    per_outcome = kl_estimate(p.log(), q.log(), "k3")
    assert float((p * per_outcome).sum()) == pytest.approx(exact, abs=1e-6)


def test_aggregate_modes():
    values = torch.tensor([[1.0, 3.0, 0.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(3.0)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(3.5)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [(5, 2, 2, 1 - 3 / 10), (10, 3, 1, 0.3), (4, 0, 2, 0.0), (4, 4, 1, 1.0), (6, 5, 2, 1.0), (16, 4, 8, 1 - 495 / 12870)],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)


def test_unverified_samples_get_the_verified_mean_and_zero_advantage():
    from postrl.algo.advantages import fill_unverified

    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    verified = torch.tensor([[True, True, False, True], [False, False, False, False]])
    filled = fill_unverified(rewards, verified)
    assert filled.flatten().tolist() == pytest.approx([1.0, 0.0, 1 / 3, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-7)
