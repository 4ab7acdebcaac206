"""The train/inference mismatch and its correction (postrl.algo.correction, rl.rollout_correction):
each correction's weights by hand, the mismatch metrics by hand, auto resolved by the backend's
facts, mode none leaving the loss as it was, postrl's own backend measuring ~0 in a real run, and a
weight sync broken on purpose (tests/frozen_backend.py) caught by the `mismatch` monitor within
one step of the first update, with and without seq_mask."""

import json
import math
import typing

import frozen_backend
import pytest
import torch
from test_async import metrics, run_train, weights
from test_monitors import run_monitors, trajectory

from postrl.algo.correction import CORRECTIONS, correction_stats, mismatch_stats
from postrl.algo.losses import truncated_is_weight
from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.config.schema import RolloutCorrectionConfig
from postrl.errors import ConfigError
from postrl.learner import batch as batch_module
from postrl.learner import learner as learner_module
from postrl.learner.learner import Learner
from postrl.learner.offpolicy import correction_mode
from postrl.monitor.monitors import build_monitors
from postrl.monitor.settings import MonitorConfig
from postrl.records import Task
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy

# ---------------------------------------------------------------------------- the corrections by hand

# Two completions, three positions (weights below are flattened, row by row); the second's third position is padding (its ratio 8 must not count).
RATIOS = torch.tensor([[2.0, 0.5, 4.0], [2.0, 0.25, 8.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def corrected(mode, cap=3.0, low=0.3):
    c = CORRECTIONS.get(mode)(torch.log(RATIOS), MASK, cap, low)
    return c.weight.flatten().tolist(), correction_stats(c, MASK)


def test_tis_truncates_each_token_at_the_cap_and_ignores_low():
    weight, stats = corrected("tis")
    # min(r, 3): 4 -> 3 on a trained token; the padding's 8 -> 3 too, but it is out of the mask
    assert weight == pytest.approx([2.0, 0.5, 3.0, 2.0, 0.25, 3.0], abs=1e-6)
    assert stats == pytest.approx({"rollout_correction/weight_mean": (2 + 0.5 + 3 + 2 + 0.25) / 5,  # 1.55
                                   "rollout_correction/masked_frac": 0.0,
                                   "rollout_correction/truncated_frac": 1 / 5}, abs=1e-6)


def test_token_mask_drops_tokens_outside_low_and_cap():
    weight, stats = corrected("token_mask")
    # 4 > 3 dropped, 0.25 < 0.3 dropped, the rest keep their own ratio
    assert weight == pytest.approx([2.0, 0.5, 0.0, 2.0, 0.0, 0.0], abs=1e-6)
    assert stats == pytest.approx({"rollout_correction/weight_mean": (2 + 0.5 + 2) / 5,  # 0.9
                                   "rollout_correction/masked_frac": 2 / 5,
                                   "rollout_correction/truncated_frac": 0.0}, abs=1e-6)


def test_seq_mask_weighs_every_token_by_the_sequence_ratio_or_drops_the_sequence():
    weight, stats = corrected("seq_mask")
    # row 0: rho = 2 * 0.5 * 4 = 4 > 3, dropped whole; row 1: rho = 2 * 0.25 = 0.5 (padding left out), kept
    assert weight == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.5, 0.5], abs=1e-6)
    assert stats == pytest.approx({"rollout_correction/weight_mean": (0.5 + 0.5) / 5,  # 0.2
                                   "rollout_correction/masked_frac": 1 / 2,  # sequences, not tokens
                                   "rollout_correction/truncated_frac": 0.0}, abs=1e-6)
    # a lower bound above 0.5 drops row 1 as well; cap 4 keeps row 0 at its rho
    assert corrected("seq_mask", low=0.6)[1]["rollout_correction/masked_frac"] == 1.0
    assert corrected("seq_mask", cap=4.0)[0][:3] == pytest.approx([4.0, 4.0, 4.0], abs=1e-5)


def test_the_config_offers_exactly_the_registered_corrections():
    mode = typing.get_type_hints(RolloutCorrectionConfig)["mode"]
    assert sorted(typing.get_args(mode)) == sorted(["auto", "none", *CORRECTIONS.names()])
    for bad, key in [("rl.rollout_correction.mode=is", "rl.rollout_correction.mode"),
                     ("rl.rollout_correction.cap=0.5", "rl.rollout_correction.cap"),
                     ("rl.rollout_correction.low=2", "rl.rollout_correction.low")]:
        with pytest.raises(ConfigError, match=key):
            load_config("recipes/default.yaml", [bad])


# ---------------------------------------------------------------------------- the mismatch metrics by hand


def test_mismatch_stats_by_hand():
    behav = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.4, 0.7]]))
    learner = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.4, 0.4, 0.7]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # row 0's third position is padding
    m = mismatch_stats(learner, behav, mask)
    ln2 = math.log(2)
    # per token learner - behaviour: row 0 [-ln 2, 0], row 1 [+ln 2, 0, 0]
    # k3 with r = learner/behaviour: r = 1/2 -> 1/2 - 1 + ln 2; r = 2 -> 2 - 1 - ln 2; together exactly 0.5
    assert m == pytest.approx({
        "mismatch/logp_abs_diff_mean": 2 * ln2 / 5, "mismatch/logp_abs_diff_max": ln2,
        "mismatch/seq_log_ratio_mean": 0.0, "mismatch/seq_log_ratio_max": ln2,
        "mismatch/kl_k3": 0.5 / 5, "mismatch/tokens": 5.0}, abs=1e-6)
    assert mismatch_stats(learner, behav, torch.zeros_like(mask)) == {"mismatch/tokens": 0.0}


# ---------------------------------------------------------------------------- the learner


def test_auto_resolves_by_the_backends_facts():
    def mode(*overrides):
        return correction_mode(load_config("recipes/default.yaml", list(overrides)))

    assert mode() == "none"  # postrl: learner_numerics, its log-probs are the learner's
    assert mode("rollout.backend=frozen") == "seq_mask"  # an inference engine's are not
    assert mode("rollout.backend=frozen", "rl.rollout_correction.mode=tis") == "tis"
    assert mode("rollout.backend=frozen", "rl.rollout_correction.mode=none") == "none"
    assert mode("pipeline.proximal=behaviour") == "none"
    with pytest.raises(ConfigError, match=r"rl.rollout_correction.mode' = 'auto \(seq_mask for rollout.backend frozen\)'"):
        mode("rollout.backend=frozen", "pipeline.proximal=behaviour")
    with pytest.raises(ConfigError, match="rl.rollout_correction.mode' = 'token_mask'"):
        mode("rl.rollout_correction.mode=token_mask", "pipeline.proximal=behaviour")


@pytest.fixture
def step_samples(tiny_model_dir):
    """A learner on the tiny model and 8 samples of two prompts it drew (policy version 0)."""
    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", "train.samples_per_prompt=4",
                                               "rl.kl_coef=0"])
    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    policy = Policy(model, tok)
    tasks = [Task("arith", "a", "12+34=", "46"), Task("arith", "b", "7+8=", "15")]
    samples = policy.sample(tasks, 4, GenParams(6, 1.0, 1.0), torch.Generator().manual_seed(0))
    for s in samples:
        s.logprobs = [lp - 0.1 for lp in s.logprobs]  # a sampler 0.1 nats less sure than the learner
    return cfg, policy, samples


def spy_on_loss(learner: Learner) -> list:
    """(trust region centre, weight) of each call the learner makes of its policy loss."""
    calls, original = [], learner.loss_fn

    def spy(logp, old, adv, mask, lo, hi, agg, is_weight=None):
        calls.append((old.detach().clone(), None if is_weight is None else is_weight.clone()))
        return original(logp, old, adv, mask, lo, hi, agg, is_weight=is_weight)

    learner.loss_fn = spy
    return calls


def forwards(monkeypatch) -> list[int]:
    """Counts the learner's forward passes (each call of token_logprobs, in the update or outside it)."""
    calls, original = [], learner_module.token_logprobs

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(learner_module, "token_logprobs", counted)  # the update's passes
    monkeypatch.setattr(batch_module, "token_logprobs", counted)  # build_batch's (reference, proximal)
    return calls


def rows_of_first_minibatch(batch, seed, minibatches):
    order = torch.randperm(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(seed))
    return order[: batch.input_ids.shape[0] // minibatches]


def test_mode_none_trains_as_before_and_measures_the_first_minibatch(step_samples, monkeypatch):
    cfg, policy, samples = step_samples
    passes = forwards(monkeypatch)
    learner = Learner(policy, None, cfg.train, cfg.rl, cfg.model)  # run.py's call before this change: none
    calls = spy_on_loss(learner)
    batch = learner.build_batch(samples, 0.0)
    assert batch.prox_logprobs is None and passes == []  # no extra pass on a fresh batch
    stats = learner.update(batch, 0.0, torch.Generator().manual_seed(3))
    assert len(passes) == cfg.train.minibatches  # one forward per minibatch: the loss's own
    # the synchronous loss: plain PPO around the behaviour log-probs, no weight
    first = rows_of_first_minibatch(batch, 3, cfg.train.minibatches)
    centre = calls[0][0]
    assert torch.equal(centre, batch.old_logprobs[first, : centre.shape[1]])
    assert all(w is None for _, w in calls)
    m = stats.offpolicy
    assert m["mismatch/tokens"] == float(batch.loss_mask[first].sum()) < float(batch.loss_mask.sum())
    # the learner is 0.1 nats surer than the sampler on every token, up to float rounding
    assert m["mismatch/logp_abs_diff_mean"] == pytest.approx(0.1, abs=1e-4)
    assert m["mismatch/logp_abs_diff_max"] == pytest.approx(0.1, abs=1e-4)
    assert m["mismatch/kl_k3"] == pytest.approx(math.exp(0.1) - 1 - 0.1, abs=1e-4)
    assert not any(k.startswith(("rollout_correction/", "offpolicy/")) for k in m)


def test_mode_none_keeps_decoupled_ppo_on_stale_rows(step_samples, monkeypatch):
    cfg, policy, samples = step_samples
    policy.version = 2  # the trainer moved on: samples[4:] are re-stamped fresh, samples[:4] stay stale
    for s in samples[4:]:
        s.policy_version = 2
    learner = Learner(policy, None, cfg.train, cfg.rl, cfg.model, is_cap=1.05)
    calls = spy_on_loss(learner)
    batch = learner.build_batch(samples, 0.0)
    assert torch.equal(batch.prox_logprobs[4:], batch.old_logprobs[4:])  # the pass ran on stale rows only
    assert batch.fresh.tolist() == [False] * 4 + [True] * 4
    stats = learner.update(batch, 0.0, torch.Generator().manual_seed(3))
    # the trust region's centre is pi_prox and the weight decoupled PPO's own, min(r, pipeline.is_cap)
    centre, w = calls[0]
    micro = rows_of_first_minibatch(batch, 3, cfg.train.minibatches)
    width = centre.shape[1]
    assert torch.equal(centre, batch.prox_logprobs[micro, :width])
    assert torch.equal(w, truncated_is_weight(centre, batch.old_logprobs[micro, :width], 1.05))
    assert stats.offpolicy["offpolicy/is_truncated"] > 0  # the stale rows' 0.1 nats exceed ln 1.05
    fresh_first = [i for i in micro.tolist() if i >= 4]
    assert stats.offpolicy["mismatch/tokens"] == float(batch.loss_mask[fresh_first].sum())


@pytest.mark.parametrize("mode", ["tis", "token_mask", "seq_mask"])
def test_a_correction_weighs_every_row_against_the_learners_pass(step_samples, monkeypatch, mode):
    cfg, policy, samples = step_samples
    passes = forwards(monkeypatch)
    cfg.rl.rollout_correction.cap = 1.05  # r = e^0.1 = 1.105 on every token: above it
    learner = Learner(policy, None, cfg.train, cfg.rl, cfg.model, correction=mode)
    calls = spy_on_loss(learner)
    batch = learner.build_batch(samples, 0.0)
    assert len(passes) == 1  # the proximal pass, over every row, although every row is fresh
    m = batch.loss_mask.bool()
    assert torch.allclose(batch.prox_logprobs[m], batch.old_logprobs[m] + 0.1, atol=1e-4)
    stats = learner.update(batch, 0.0, torch.Generator().manual_seed(3))
    centre, w = calls[0]
    micro = rows_of_first_minibatch(batch, 3, cfg.train.minibatches)
    width = centre.shape[1]
    assert torch.equal(centre, batch.prox_logprobs[micro, :width])
    expected = CORRECTIONS.get(mode)(centre - batch.old_logprobs[micro, :width], batch.loss_mask[micro, :width],
                                     1.05, 0.0).weight
    assert torch.equal(w, expected)
    m = stats.offpolicy
    assert m["mismatch/tokens"] == float(batch.loss_mask.sum())  # every fresh row: the pass covered them
    assert m["mismatch/logp_abs_diff_mean"] == pytest.approx(0.1, abs=1e-4)
    dropped = {"tis": (0.0, 1.0), "token_mask": (1.0, 0.0), "seq_mask": (1.0, 0.0)}[mode]
    assert (m["rollout_correction/masked_frac"], m["rollout_correction/truncated_frac"]) == pytest.approx(dropped)
    assert not any(k.startswith("offpolicy/") for k in m)


# ---------------------------------------------------------------------------- the monitor


def test_the_mismatch_monitor_fires_once_and_skips_steps_without_a_measurement(make_sample):
    def edit(step, m):
        if step % 5 == 4:
            return  # a step with no fresh rows measured: no mismatch metrics
        broken = step >= 7
        m.update({"mismatch/logp_abs_diff_mean": 0.4 if broken else 1e-7, "mismatch/kl_k3": 0.1 if broken else 0.0})

    alerts = run_monitors(trajectory(make_sample, edit))
    assert [(a.name, a.step, a.action) for a in alerts] == [("mismatch", 7, "warn")]
    # either threshold alone fires it
    for values in ({"mismatch/logp_abs_diff_mean": 0.06, "mismatch/kl_k3": 0.0},
                   {"mismatch/logp_abs_diff_mean": 0.0, "mismatch/kl_k3": 0.02}):
        monitor = build_monitors(MonitorConfig()).monitors["mismatch"]
        assert [a.name for a in monitor.update(0, values, [])] == ["mismatch"]
        state = json.loads(json.dumps(monitor.state_dict()))
        again = build_monitors(MonitorConfig()).monitors["mismatch"]
        again.load_state_dict(state)
        assert again.update(1, values, []) == []  # latched: it fired before the checkpoint
        assert again.update(2, {}, []) == [] and again.update(3, values, []) == []  # a skipped step keeps the latch


# ---------------------------------------------------------------------------- real runs

BROKEN = ["rollout.backend=frozen", "train.lr=0.01", "rl.entropy_coef=0.1",  # all-zero rewards: entropy moves the weights
          f"imports=[{frozen_backend.__file__}]"]


def alerts(run_dir):
    path = run_dir / "alerts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_postrl_backend_shows_no_mismatch(tiny_model_dir, tmp_path):
    run = run_train(tiny_model_dir, tmp_path / "r", "train.total_steps=3")
    for m in metrics(run):
        assert m["mismatch/tokens"] > 0
        assert m["mismatch/logp_abs_diff_max"] < 1e-5 and m["mismatch/kl_k3"] < 1e-5
        assert m["mismatch/seq_log_ratio_max"] < 1e-5
    assert alerts(run) == []


@pytest.mark.parametrize("mode", ["none", "seq_mask"])
def test_a_sync_that_does_not_land_fires_the_monitor_after_the_first_update(tiny_model_dir, tmp_path, mode):
    run = run_train(tiny_model_dir, tmp_path / mode, "train.total_steps=3", f"rl.rollout_correction.mode={mode}",
                    *BROKEN)
    steps = metrics(run)
    assert steps[0]["mismatch/logp_abs_diff_mean"] < 1e-5  # step 0 samples the weights the copy was made of
    assert [(a["step"], a["name"]) for a in alerts(run)] == [(1, "mismatch")]  # step 0's update never reached it
    assert all(m["mismatch/logp_abs_diff_mean"] > 0.05 for m in steps[1:])
    if mode == "seq_mask":
        assert max(m["rollout_correction/masked_frac"] for m in steps) > 0
    else:
        assert not any(k.startswith("rollout_correction/") for m in steps for k in m)


def test_seq_mask_with_two_learner_ranks_gives_one_ranks_parameters(tiny_model_dir, tmp_path):
    extra = ["train.total_steps=2", "rl.rollout_correction.mode=seq_mask", *BROKEN]
    one = run_train(tiny_model_dir, tmp_path / "one", *extra)
    two = run_train(tiny_model_dir, tmp_path / "two", "train.learners=2", *extra)
    a, b = weights(one), weights(two)
    for k in a:  # the same sums, added in another order
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    for m1, m2 in zip(metrics(one), metrics(two), strict=True):
        for key in ("rollout_correction/weight_mean", "rollout_correction/masked_frac", "mismatch/kl_k3", "loss"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-3, abs=1e-5), key
