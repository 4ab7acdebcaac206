"""GSPO, CISPO and REINFORCE++ against values worked out by hand (#45)."""

import math

import pytest
import torch

from postrl.algo.advantages import ADVANTAGES, group_advantages, reinforce_pp
from postrl.algo.losses import LOSSES, Aggregation, aggregate, cispo, gspo, ppo_clip
from postrl.algo.overlong import soft_overlong_penalty
from postrl.cli import main


def test_gspo_clips_whole_sequences_on_the_geometric_mean_ratio_and_spreads_the_gradient():
    # row 0: token log-ratios 0.2, 0.0 (the padded third, 5.0, is masked) -> s = e^0.1 = 1.10517, inside 1.2
    # row 1: log-ratios 0.6 on all three tokens -> s = e^0.6 = 1.822 > 1.2: clipped, value 1.2, no gradient
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, 0.0, 5.0], [0.6, 0.6, 0.6]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, st = gspo(logp, old, torch.tensor([1.0, 1.0]), mask, 0.2, 0.2, "seq-mean-token-mean")
    assert float(loss.detach()) == pytest.approx(-(math.exp(0.1) + 1.2) / 2, rel=1e-6)
    loss.backward()
    # d/dlogp_t of -(1/2) * s_0 * A_0 = -(1/2) * s_0 * (1/|y_0|) = -0.25 * e^0.1 on each real token of row 0
    g = -0.25 * math.exp(0.1)
    assert logp.grad.tolist()[0] == pytest.approx([g, g, 0.0], rel=1e-6)
    assert logp.grad.tolist()[1] == [0.0, 0.0, 0.0]
    assert st.clip_frac == pytest.approx(3 / 5)  # row 1's three tokens of the five real ones


def test_gspo_refuses_a_token_level_weight():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="gspo"):
        gspo(x, x, torch.ones(1), torch.ones(1, 2), 0.2, 0.2, "token-mean", is_weight=torch.ones(1, 2))


def test_cispo_keeps_the_gradient_of_clipped_tokens_under_a_detached_weight():
    # ratios 0.5/0.25 = 2 (clipped to 1.28) and 0.25/0.25 = 1; A = 2
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.25]]))
    loss, st = cispo(logp, old, torch.tensor([2.0]), torch.ones(1, 2), 0.2, 0.28, "token-mean")
    # per token -w * A * log pi: -1.28 * 2 * log 0.5 = 1.774457, -1 * 2 * log 0.25 = 2.772589; mean of the two
    assert float(loss.detach()) == pytest.approx((2.56 * math.log(2) + 2 * math.log(4)) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.28, -1.0], rel=1e-6)  # -w * A / 2 tokens: none dropped
    assert st.clip_frac == 0.5 and st.ratio_mean == pytest.approx(1.5)


def test_reinforce_pp_normalises_over_the_batch_not_the_group():
    adv = reinforce_pp(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    # batch mean 0.75; centred 0.25, -0.75, 0.25, 0.25; unbiased var = (3 * 0.0625 + 0.5625) / 3 = 0.25
    assert adv.flatten().tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], rel=1e-5)
    # the all-correct second group keeps a nonzero advantage (GRPO would give it zero)


def test_reinforce_pp_sees_the_kl_penalty_in_the_reward():
    rewards, verified = torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)
    adv = group_advantages(reinforce_pp, rewards, verified, torch.tensor([0.5, 0.0]), scale_by_std=False)
    assert adv.tolist() == pytest.approx([0.25, -0.25])  # rewards 0.5, 0 after the penalty; mean 0.25


def test_new_objectives_are_registered():
    assert LOSSES.get("gspo") is gspo and LOSSES.get("cispo") is cispo
    assert ADVANTAGES.get("reinforce_pp") is reinforce_pp


@pytest.mark.parametrize("override, other_key", [
    ("rl.rollout_correction.mode=tis", "rl.rollout_correction.mode"),
    ("pipeline.max_staleness=1", "pipeline.max_staleness"),
])
def test_gspo_with_a_setting_that_gives_it_a_token_weight_is_one_line_naming_both_keys(
        override, other_key, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("POSTRL_CACHE", str(cache))
    code = main(["train", "recipes/default.yaml", "rl.loss=gspo", override, f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: config key 'rl.loss' = 'gspo'") and other_key in err, err
    assert not (tmp_path / "run").exists() and list(cache.iterdir()) == []


def test_soft_overlong_penalty_ramps_linearly_over_the_buffer():
    # max_new_tokens 100, buffer 20: no penalty up to 80 tokens, then -(|y| - 80) / 20, -1 from 100 on
    lengths = torch.tensor([10, 80, 81, 90, 100, 120])
    assert soft_overlong_penalty(lengths, 100, 20).tolist() == pytest.approx([0.0, 0.0, -0.05, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="overlong buffer"):
        soft_overlong_penalty(lengths, 100, 0)


def test_dr_grpo_divides_every_completions_token_sum_by_the_generation_budget():
    # two completions of 3 and 1 tokens, budget 4: (1 + 2 + 3 + 10) / (2 * 4) = 2.0, whatever the lengths
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(values, mask, Aggregation("seq-mean-token-sum-norm", budget=4))) == 2.0
    # GRPO's seq-mean-token-mean would give (2 + 10) / 2 = 6: the short reply's token weighs 3x more
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == 6.0
    # in a loss, a token's gradient is -A / (B * L) whatever its completion's length
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = ppo_clip(logp, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask, 0.2, 0.28,
                       Aggregation("seq-mean-token-sum-norm", budget=4))
    loss.backward()
    assert logp.grad.tolist() == [[-0.125, -0.125, -0.125], [-0.125, 0.0, 0.0]]


def test_dr_grpo_without_a_budget_is_an_error_not_a_silent_length_normaliser():
    with pytest.raises(ValueError, match="generation budget"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm")


def test_the_soft_overlong_penalty_lowers_the_rewards_of_long_completions_before_the_advantage(tiny_model_dir):
    from conftest import build_sample

    from postrl.builtin_models import load_model
    from postrl.config.schema import RLConfig, TrainConfig
    from postrl.learner.learner import Learner
    from postrl.sampling.policy import Policy

    model, tok = load_model(str(tiny_model_dir), log=lambda *_: None)
    train = TrainConfig(samples_per_prompt=4, max_new_tokens=10, minibatches=1)
    # four correct replies (reward 1) of 2, 6, 8 and 10 tokens; buffer 4 -> the ramp starts past 6:
    # penalties 0, 0, 0.5, 1 (overlong_penalty 1): shaped rewards 1, 1, 0.5, 0
    samples = [build_sample("x" * n, group=0, task_id="t0", completion_ids=[5] * n) for n in (2, 6, 8, 10)]
    learner = Learner(Policy(model, tok), None, train, RLConfig(kl_coef=0.0, overlong_buffer=4, scale_by_std=False))
    adv = learner.build_batch(samples, 0.0).advantages
    assert adv.tolist() == pytest.approx([0.375, 0.375, -0.125, -0.625])  # shaped rewards minus their mean 0.625
    assert all(s.kl_penalty is None for s in samples)  # the KL field stays the KL's
    off = Learner(Policy(model, tok), None, train, RLConfig(kl_coef=0.0, scale_by_std=False))
    assert off.build_batch(samples, 0.0).advantages.tolist() == [0.0, 0.0, 0.0, 0.0]  # all correct: no signal


@pytest.mark.parametrize("overrides, message", [
    (["rl.overlong_buffer=9"], "config key 'rl.overlong_buffer' = 9: must be <= train.max_new_tokens (8)"),
    (["rl.overlong_buffer=2", "domains.arith.max_new_tokens=12"],
     "config key 'rl.overlong_buffer' ramps up to train.max_new_tokens (8); domains.arith.max_new_tokens = 12 "
     "is another budget"),
])
def test_an_overlong_buffer_the_budget_cannot_hold_is_one_line(overrides, message, tmp_path, capsys):
    code = main(["train", "recipes/default.yaml", *overrides, f"run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {message}\n" and not (tmp_path / "run").exists()
