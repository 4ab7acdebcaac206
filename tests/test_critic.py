"""PPO with a critic (postrl.learner.critic, rl.advantage: gae): GAE, whitening and the clipped value
loss worked by hand; the config's pairs refused in one line naming both keys; runs with a critic
(a copy of the policy, LoRA, a separate model directory, the asynchronous pipeline) that learn,
warm up, and resume bit for bit, the critic's state included."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from test_async import crash_after_step_2, metrics, rows, run_train, same_weights, weights

from postrl.algo.advantages import ADVANTAGES, gae, whiten
from postrl.algo.losses import cispo, gspo, ppo_clip
from postrl.config.loading import load_config
from postrl.errors import ConfigError
from postrl.learner.critic import gae_advantages, value_loss, value_stats
from postrl.names import check_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import algorithms  # noqa: E402

# ---------------------------------------------------------------------------- by hand


def test_gae_by_hand_discounted_and_undiscounted():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.8]])
    mask = torch.ones(1, 3)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.2]]))  # the reward to go (1) less each value
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    # gamma 0.9, lambda 0.5: delta2 = 1 - 0.8 = 0.2; delta1 = 0.9 * 0.8 - 0.6 = 0.12, A1 = 0.12 + 0.45 * 0.2
    # = 0.21; delta0 = 0.9 * 0.6 - 0.5 = 0.04, A0 = 0.04 + 0.45 * 0.21 = 0.1345
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.1345, 0.21, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.6345, 0.81, 1.0]]))


def test_gae_skips_positions_off_the_mask():
    # a prompt position, an action, a tool's token (its value 9 must not be read), the last action
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[7.0, 0.5, 9.0, 0.8]])
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # A3 = 0.2; A1 = (0.9 * 0.8 - 0.5) + 0.45 * 0.2 = 0.31; off the mask: 0
    assert torch.allclose(adv, torch.tensor([[0.0, 0.31, 0.0, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.0, 0.81, 0.0, 1.0]]))


def test_whiten_by_hand():
    got = whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)  # mean 2, std 1; off: 0


def test_clipped_value_loss_by_hand():
    v, old = torch.tensor([[1.0, 0.6]]), torch.tensor([[0.5, 0.5]])
    ret, mask = torch.tensor([[2.0, 0.0]]), torch.ones(1, 2)
    # token 0: (1 - 2)^2 = 1; clipped 0.5 + 0.2 = 0.7: (0.7 - 2)^2 = 1.69, the larger: 0.5 * 1.69 = 0.845
    # token 1: moved 0.1 < 0.2, not clipped: 0.5 * 0.36 = 0.18
    loss, frac = value_loss(v, old, ret, mask, clip=0.2)
    assert math.isclose(float(loss), (0.845 + 0.18) / 2, rel_tol=1e-6) and frac == 0.5
    loss, frac = value_loss(v, old, ret, mask, clip=0.0)
    assert math.isclose(float(loss), (0.5 + 0.18) / 2, rel_tol=1e-6) and frac == 0.0
    # the gradient stops where the clipped term wins: d/dv of token 0 is 0, of token 1 (v - R) / 2 = 0.3
    v.requires_grad_(True)
    value_loss(v, old, ret, mask, clip=0.2)[0].backward()
    assert torch.allclose(v.grad, torch.tensor([[0.0, 0.3]]))


def test_explained_variance_by_hand():
    ret = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert value_stats(ret.clone(), ret, mask)["critic/explained_variance"] == 1.0
    assert value_stats(torch.full((1, 3), 2.0), ret, mask)["critic/explained_variance"] == 0.0
    # residuals [1, 0, -1] around V = [0, 2, 4]: Var 2/3 of Var(R) 2/3 -> 1 - 1 = 0
    assert value_stats(torch.tensor([[0.0, 2.0, 4.0]]), ret, mask)["critic/explained_variance"] == 0.0


def test_gae_advantages_pay_the_reward_at_the_last_action_and_skip_unverified_rows():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])  # row 0 is shorter
    values = torch.zeros(2, 4)
    adv, ret, value_mask = gae_advantages(torch.tensor([1.0, 3.0]), torch.tensor([True, False]), values, mask,
                                          None, gamma=1.0, lam=1.0, scale=False)
    assert torch.equal(ret[0], torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert torch.equal(adv[1], torch.zeros(4))  # unverified: no advantage and no value target
    assert torch.equal(value_mask, torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    kl = torch.tensor([[0.0, 0.25, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])  # the KL taken at each token
    adv, _, _ = gae_advantages(torch.tensor([1.0, 3.0]), torch.tensor([True, True]), values, mask, kl,
                               gamma=1.0, lam=1.0, scale=False)
    assert torch.allclose(adv[0], torch.tensor([0.0, 0.25, 0.5, 0.0]))  # 1 - 0.25 - 0.5, then 1 - 0.5


def test_losses_take_one_advantage_a_token():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    old = torch.log(torch.tensor([[0.25, 0.25]]))  # ratios 2 and 1
    mask = torch.ones(1, 2)
    adv = torch.tensor([[1.0, -2.0]])
    loss, st = ppo_clip(logp, old, adv, mask, 0.2, 0.28, "token-mean")
    # token 0: min(2 * 1, 1.28 * 1) = 1.28; token 1: ratio 1: -2 -> loss = -(1.28 - 2) / 2 = 0.36
    assert math.isclose(float(loss), 0.36, rel_tol=1e-6) and st.clip_frac == 0.5
    loss, _ = cispo(logp, old, adv, mask, 1.0, 0.28, "token-mean")
    # -(1.28 * 1 * log 0.5 + 1 * -2 * log 0.25) / 2
    assert math.isclose(float(loss), -(1.28 * math.log(0.5) - 2 * math.log(0.25)) / 2, rel_tol=1e-6)
    with pytest.raises(ValueError, match="one advantage a completion"):
        gspo(logp, old, adv, mask, 3e-4, 4e-4, "seq-mean-token-mean")


# ---------------------------------------------------------------------------- the config's pairs


@pytest.mark.parametrize("overrides, words", [
    (["rl.advantage=gae"], ["rl.advantage", "critic.model"]),
    (["critic.model=policy"], ["critic.model", "rl.advantage"]),
    (["rl.advantage=gae", "critic.model=policy", "rl.loss=gspo"], ["rl.loss", "rl.advantage"]),
    (["rl.advantage=gae", "critic.model=policy", "train.learners=2"], ["critic.model", "train.learners"]),
])
def test_critic_pairs_are_one_line_errors_naming_both_keys(overrides, words):
    cfg = load_config("default", overrides)
    with pytest.raises(ConfigError) as err:
        check_names(cfg)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    assert ADVANTAGES.facts("gae").needs_values and not ADVANTAGES.facts("grpo").needs_values


def test_a_critic_with_another_tokenizer_is_refused_before_the_run_dir(tiny_model_dir, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<tool>"])  # one id more: not the policy's token ids
    tok.save_pretrained(other)
    with pytest.raises(ConfigError, match="critic.model.*tokenizer"):
        run_train(tiny_model_dir, tmp_path / "run", "rl.advantage=gae", f"critic.model={other}")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- runs

PPO = ["rl.advantage=gae", "critic.model=policy", "critic.lr=1e-3", "rl.overlong_buffer=6"]
"""The test model solves no sum: DAPO's overlong penalty (a reward by length) gives the critic returns."""


def test_ppo_run_learns_a_value_and_resumes_bit_for_bit_through_the_async_pipeline(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    extra = [*PPO, "train.total_steps=4", "pipeline.max_staleness=1", "checkpoint.every_steps=2"]
    whole = run_train(tiny_model_dir, tmp_path / "whole", *extra)
    m = metrics(tmp_path / "whole")
    assert all(0 <= r["critic/clip_frac"] <= 1 and r["critic/loss"] > 0 for r in m)
    assert m[0]["critic/value_mean"] == 0.0 and m[-1]["critic/value_mean"] != 0.0  # zero head, then learnt
    assert m[-1]["critic/explained_variance"] > m[0]["critic/explained_variance"]
    assert [r["critic/warmup"] for r in m] == [0.0] * 4

    run_dir = tmp_path / "crashed"
    crash_after_step_2(tiny_model_dir, run_dir, extra, monkeypatch)
    from postrl.loop import resume_config, train

    train(resume_config(run_dir, []), log=lambda *a: None, resume=True)
    assert same_weights(weights(whole), weights(run_dir))
    assert rows(whole) == rows(run_dir)

    def critic_state(run):
        return torch.load(run / "checkpoints" / "step_00000004" / "state.pt", weights_only=False)["learner"]["critic"]

    a, b = critic_state(whole), critic_state(run_dir)
    assert a["updates"] == b["updates"] == 4
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert str(a["optimizer"]) == str(b["optimizer"])  # every moment tensor printed in full below
    assert all(torch.equal(x["exp_avg_sq"], y["exp_avg_sq"])
               for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()))


def test_critic_warmup_holds_the_policy_and_a_lora_critic_trains_its_adapters(tiny_model_dir, tmp_path):
    from postrl.learner.critic import make_critic
    from postrl.model.lora import apply_lora

    extra = [*PPO, "train.total_steps=3", "critic.warmup_steps=2", "model.lora.r=4"]
    run_train(tiny_model_dir, tmp_path / "run", *extra)
    m = metrics(tmp_path / "run")
    assert [r["critic/warmup"] for r in m] == [1.0, 1.0, 0.0]
    assert m[0]["grad_norm"] == 0.0 and m[0]["entropy"] > 0  # the policy measured, not stepped
    versions = {r["step"]: r["policy_version"] for r in rows(tmp_path / "run")}
    assert versions == {0: 0, 1: 0, 2: 0}  # sampled before any policy update
    assert m[2]["grad_norm"] > 0

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", *extra])
    from postrl.builtin_models import load_model

    model, tok = load_model(str(tiny_model_dir), log=lambda *a: None)
    model = apply_lora(model, cfg.model.lora)
    critic = make_critic(cfg, model, tok, load=None)
    names = {n for n, p in critic.model.named_parameters() if any(p is q for q in critic.params)}
    assert names and all("lora_" in n or n.startswith("head.") for n in names), names
    assert {"head.weight", "head.bias"} <= names


def test_a_separate_critic_model_directory(tiny_model_dir, tmp_path):
    run_train(tiny_model_dir, tmp_path / "run", "rl.advantage=gae", f"critic.model={tiny_model_dir}",
              "train.total_steps=2", "rl.gamma=0.99", "rl.lam=0.9", "rl.kl_in=reward", "rl.overlong_buffer=6")
    m = metrics(tmp_path / "run")
    assert len(m) == 2 and m[1]["critic/value_mean"] != 0.0


def test_the_objectives_benchmarks_quick_run_trains_every_objective(builtin_models_cached, tmp_path, capsys):
    """benchmarks/algorithms.py --quick on arith: every objective (the critic's too) trains and is
    evaluated, each run's record is kept, and the RESULT lines rank them."""
    assert algorithms.main(["--quick", "--tasks", "arith", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in algorithms.OBJECTIVES:
        record = json.loads((tmp_path / "arith" / name / "seed0.json").read_text())
        assert sorted(map(int, record["curve"])) == [0, 2, 4] and record["step_s"] > 0, name
        assert f"| {name} |" in out
    assert "critic.model=policy" in json.loads((tmp_path / "arith" / "ppo" / "seed0.json").read_text())["overrides"]
    lines = out.strip().splitlines()
    assert lines[-2].startswith("RESULT best_objective=") and lines[-1].startswith("RESULT grpo_rank=")
