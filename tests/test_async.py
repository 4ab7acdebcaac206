"""The asynchronous pipeline (postrl.engines.pipeline): equivalence with the synchronous loop at
max_staleness 0, the staleness bound under injected delays, the off-policy correction by hand,
exact resume with orders in flight, and groups graded while later groups are still generating."""

import json
import math
import time

import pytest
import torch
from safetensors.torch import load_file

from postrl.algo.losses import ppo_clip, truncated_is_weight
from postrl.config.loading import load_config
from postrl.engines import local, orders
from postrl.errors import ConfigError
from postrl.learner.learner import Learner
from postrl.learner.offpolicy import offpolicy_stats
from postrl.loop import train
from postrl.records import Batch
from postrl.store.rollouts import read_rows

ARGS = [
    "train.prompts_per_step=4", "train.samples_per_prompt=4", "rl.entropy_coef=0.01",
    "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false",
    "monitor.spot_check_every_steps=0",
]


def run_train(model_dir, run_dir, *extra, resume=False):
    cfg = load_config("recipes/default.yaml", [f"model.name={model_dir}", f"run.dir={run_dir}", *ARGS, *extra])
    return train(cfg, log=lambda *a: None, resume=resume)


class Crash(Exception):
    pass


def crash_after_step_2(model_dir, run_dir, extra, monkeypatch) -> None:
    """`run_train` that dies between steps, after its step-2 checkpoint (the third crash point)."""
    from postrl import run as run_module

    calls = []

    def crash(name):
        calls.append(name)
        if len(calls) == 3:
            raise Crash

    monkeypatch.setattr(run_module, "crash_point", crash)
    threads = torch.get_num_threads()
    with pytest.raises(Crash):
        run_train(model_dir, run_dir, *extra)
    monkeypatch.undo()
    torch.set_num_threads(threads)  # the crashed run's engine never closed to restore it


def weights(run_dir):
    return load_file(run_dir / "final" / "model.safetensors")


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def rows(run_dir):
    return [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(run_dir)]


def metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- off-policy correction by hand


def test_truncated_is_weight_by_hand():
    prox = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    behav = torch.log(torch.tensor([[0.2, 0.6, 0.2]]))
    # 0.5/0.2 = 2.5 truncated at 2; 0.3/0.6 = 0.5; 0.2/0.2 = 1
    assert truncated_is_weight(prox, behav, cap=2.0).tolist()[0] == pytest.approx([2.0, 0.5, 1.0], abs=1e-6)


def test_decoupled_ppo_loss_by_hand():
    prox = torch.log(torch.tensor([[0.5, 0.3]]))  # trust region centre (the trainer's weights)
    behav = torch.log(torch.tensor([[0.2, 0.6]]))  # the stale sampler's
    w = truncated_is_weight(prox, behav, cap=2.0)  # [2.0, 0.5]
    # current policy: ratio to prox 1.5 on token 0 (clipped to 1.28 for A > 0), 1.0 on token 1
    logp = prox + torch.log(torch.tensor([[1.5, 1.0]]))
    mask = torch.ones(1, 2)
    loss, _ = ppo_clip(logp, prox, torch.tensor([1.0]), mask, 0.2, 0.28, "token-mean", is_weight=w)
    # token-mean of -w * min(r A, clip(r) A) = -(2.0 * 1.28 + 0.5 * 1.0) / 2
    assert float(loss) == pytest.approx(-(2.0 * 1.28 + 0.5) / 2, abs=1e-6)
    # the weight is a constant: d loss / d logp = -w * r * A / 2 on the unclipped token only
    logp.requires_grad_(True)
    loss, _ = ppo_clip(logp, prox, torch.tensor([1.0]), mask, 0.2, 0.28, "token-mean", is_weight=w)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5 * 1.0 / 2], abs=1e-6)
    # no weight: the plain PPO loss, unchanged
    plain, _ = ppo_clip(logp.detach(), prox, torch.tensor([1.0]), mask, 0.2, 0.28, "token-mean")
    assert float(plain) == pytest.approx(-(1.28 + 1.0) / 2, abs=1e-6)


def test_offpolicy_stats_by_hand():
    behav = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    prox = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding
    batch = Batch(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), mask, behav, None, torch.zeros(1),
                  torch.ones(1), prox)
    m = offpolicy_stats(batch, cap=2.0)
    # k3 with r = prox/behav: token 0 r = 0.5 -> 0.5 - 1 + ln 2 = 0.193147; token 1 r = 1 -> 0
    assert m["offpolicy/mismatch_kl"] == pytest.approx((0.5 - 1 + math.log(2)) / 2, abs=1e-6)
    assert m["offpolicy/is_weight_mean"] == pytest.approx((0.5 + 1.0) / 2, abs=1e-6)
    assert m["offpolicy/is_truncated"] == 0.0


def test_learner_computes_proximal_logprobs_only_for_stale_rows(tiny_model_dir):
    from postrl.builtin_models import load_model
    from postrl.records import Task
    from postrl.sampling.generate import GenParams
    from postrl.sampling.policy import Policy

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", "train.samples_per_prompt=4"])
    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    policy = Policy(model, tok)
    learner = Learner(policy, None, cfg.train, cfg.rl, cfg.model)
    samples = policy.sample([Task("arith", "t", "12+34=", "46")], 4, GenParams(4, 1.0, 1.0),
                            torch.Generator().manual_seed(0))
    assert learner.build_batch(samples, 0.0).prox_logprobs is None  # on-policy: the synchronous loss
    policy.version = 2  # the trainer has moved on; samples[2:] are re-stamped as fresh
    for s in samples[2:]:
        s.policy_version = 2
    batch = learner.build_batch(samples, 0.0)
    assert torch.equal(batch.prox_logprobs[2:], batch.old_logprobs[2:])
    # same weights as the sampler: the recomputed log-probs agree with the behaviour ones
    m = batch.loss_mask[:2].bool()
    assert torch.allclose(batch.prox_logprobs[:2][m], batch.old_logprobs[:2][m], atol=1e-4)
    assert torch.all(batch.prox_logprobs[:2][~m] == 0)
    # pipeline.proximal: behaviour: no extra pass, plain PPO around the sampling weights
    behaviour = Learner(policy, None, cfg.train, cfg.rl, cfg.model, proximal="behaviour")
    assert behaviour.build_batch(samples, 0.0).prox_logprobs is None


def test_behaviour_proximal_run_trains_without_the_extra_pass(tiny_model_dir, tmp_path, monkeypatch):
    passes, original = [], Learner._proximal_logprobs

    def counted(self, *args):
        passes.append(original(self, *args))
        return passes[-1]

    monkeypatch.setattr(Learner, "_proximal_logprobs", counted)
    run = run_train(tiny_model_dir, tmp_path / "b", "train.total_steps=3", "pipeline.max_staleness=1",
                    "pipeline.proximal=behaviour")
    assert len(passes) == 3 and all(p is None for p in passes)
    assert all(not any(k.startswith("offpolicy/") for k in m) for m in metrics(run))
    assert max(m["staleness/max"] for m in metrics(run)) == 1  # the batches were stale
    with pytest.raises(ConfigError, match="pipeline.proximal"):
        load_config("recipes/default.yaml", ["pipeline.proximal=prox"])


# ---------------------------------------------------------------------------- the pipeline in the loop


def test_threaded_pipeline_at_staleness_0_equals_the_synchronous_loop(tiny_model_dir, tmp_path, monkeypatch):
    sync = run_train(tiny_model_dir, tmp_path / "sync", "train.total_steps=3")
    threaded = []

    def threaded_engine(policy, domains, cfg, log):  # the threaded pipeline forced at max_staleness 0
        threaded.append(local.ThreadedEngine(policy, domains, cfg, log, split_cores=False))
        return threaded[-1]

    monkeypatch.setattr(local, "make_local_engine", threaded_engine)
    asyn = run_train(tiny_model_dir, tmp_path / "threaded", "train.total_steps=3")
    assert threaded and not any(t.is_alive() for t in threaded[0]._threads)  # it ran, and was closed
    assert same_weights(weights(sync), weights(asyn))
    assert rows(sync) == rows(asyn)


@pytest.mark.parametrize("slow", ["sampler", "trainer"])
def test_staleness_never_exceeds_the_bound(tiny_model_dir, tmp_path, monkeypatch, slow):
    k, steps = 2, 5
    if slow == "sampler":
        original = orders.generate
        monkeypatch.setattr(orders, "generate", lambda *a, **k: (time.sleep(0.3), original(*a, **k))[1])
    else:
        original = Learner.update
        monkeypatch.setattr(Learner, "update", lambda *a: (time.sleep(0.3), original(*a))[1])
    run_dir = run_train(tiny_model_dir, tmp_path / "run", f"train.total_steps={steps}",
                        f"pipeline.max_staleness={k}")
    updates_per_step = 2  # ppo_epochs 1 x minibatches 2
    by_step = {}
    for r in read_rows(run_dir):
        by_step.setdefault(r.step, set()).add(r.policy_version)
    # the trainer starts step s at version 2s; step s's batch was sampled at the start of step s - k
    assert by_step == {s: {updates_per_step * max(0, s - k)} for s in range(steps)}
    lines = metrics(run_dir)
    assert [m["staleness/max"] for m in lines] == [min(s, k) for s in range(steps)]
    assert all(m["staleness/max"] <= k for m in lines)
    for m in lines[1:]:  # stale batches: the correction's metrics are logged and finite
        assert math.isfinite(m["offpolicy/mismatch_kl"]) and m["offpolicy/mismatch_kl"] >= 0
        assert 0 < m["offpolicy/is_weight_mean"] <= 2.0
    assert "offpolicy/mismatch_kl" not in lines[0]  # step 0 is on-policy


def test_async_run_resumes_exactly_with_orders_in_flight(tiny_model_dir, tmp_path, monkeypatch):
    extra = ["train.total_steps=5", "pipeline.max_staleness=2", "checkpoint.every_steps=2"]
    whole = run_train(tiny_model_dir, tmp_path / "whole", *extra)

    run_dir = tmp_path / "crashed"
    crash_after_step_2(tiny_model_dir, run_dir, extra, monkeypatch)
    state = torch.load(run_dir / "checkpoints" / "step_00000002" / "state.pt", weights_only=False)
    assert sorted(state["pipeline"]["done"]) == [2, 3]  # drained in-flight orders are in the checkpoint
    from postrl.loop import resume_config

    train(resume_config(run_dir, []), log=lambda *a: None, resume=True)
    assert same_weights(weights(whole), weights(run_dir))
    assert rows(whole) == rows(run_dir)


# ---------------------------------------------------------------------------- grading overlaps generation


def test_groups_are_scored_while_later_groups_generate(tiny_model_dir, monkeypatch):
    """run_order hands each finished group to the scorer at once: with one group per generation
    chunk, a slow model and a slow reward term, chunk k is being graded while chunk k+1 is sampled;
    the samples and scores are those of sampling everything first and scoring after."""
    import random

    from postrl.builtin_models import load_model
    from postrl.rewards.terms import TERMS, register_term
    from postrl.sampling import backends as backends_module
    from postrl.sampling.generate import GenParams
    from postrl.sampling.policy import Policy
    from postrl.seeding import step_generator
    from postrl.tasks.catalog import build_domains

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", *ARGS])
    cfg.domains["arith"].reward = {"reward": 1.0, "test_slow": 0.0}  # computed and logged, weight 0
    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    policy = Policy(model, tok, max_batch=4)  # 4 samples per prompt: one group per generation chunk
    domains = build_domains(cfg)
    tasks = [domains["arith"].sample(random.Random(i)) for i in range(4)]
    order = orders.Order(0, tasks, [1.0] * 16, 0)

    chunks, graded = [], []  # (start, end) of each generation chunk; (start, task ids) of each score call
    real_generate = backends_module.generate

    def slow_generate(*a, **k):
        start = time.time()
        time.sleep(0.2)
        out = real_generate(*a, **k)
        chunks.append((start, time.time()))
        return out

    def slow_term(tasks, responses):
        graded.append((time.time(), {t.task_id for t in tasks}))
        time.sleep(0.1)
        return [0.0] * len(tasks)

    monkeypatch.setattr(backends_module, "generate", slow_generate)
    register_term("test_slow")(slow_term)
    scorer = orders.LocalScorer(domains, orders.reward_terms(cfg))
    try:
        rollout = orders.run_order(policy, order, cfg, scorer).result()
        during, spans = list(graded), list(chunks)
        monkeypatch.undo()
        after = policy.sample(tasks, 4, GenParams(cfg.train.max_new_tokens, 1.0, 1.0),
                              step_generator(cfg.seed, 0, 0), [1.0] * 16)
        # the same samples, scored once all exist
        orders.attach_scores(after, orders.score_chunk(after, domains, orders.reward_terms(cfg)))
    finally:
        scorer.close()
        TERMS.remove("test_slow")

    assert len(spans) == len(during) == rollout.chunks == 4
    assert [ids for _, ids in during] == [{t.task_id} for t in tasks]  # group by group, in order
    for k in range(3):  # group k is graded once sampled (its chunk's 0.2 s delay is over), before chunk k+1 ends
        assert spans[k][0] + 0.2 <= during[k][0] < spans[k + 1][1]
    assert rollout.reward_s >= 0.4 and rollout.overlap_s >= 0.25  # three of the four ran during generation
    assert rollout.tail_s < rollout.reward_s
    key = [(s.group, s.completion_ids, s.logprobs, s.text, s.score) for s in rollout.samples]
    assert key == [(s.group, s.completion_ids, s.logprobs, s.text, s.score) for s in after]


def test_whole_groups_are_handed_over_once_each(tiny_model_dir):
    """Multi-temperature sampling splits each group over two generation batches: a group is
    handed over only once its last sample exists, every sample exactly once, groups whole."""
    from postrl.builtin_models import load_model
    from postrl.records import Task
    from postrl.sampling.generate import GenParams
    from postrl.sampling.policy import Policy

    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    policy = Policy(model, tok)
    tasks = [Task("arith", f"t{i}", f"{i}+{i}=", str(2 * i)) for i in range(3)]
    temps = [0.5, 1.0] * 6  # within each group: half at 0.5 (first batch), half at 1.0 (second)
    ready: list[list] = []
    samples = policy.sample(tasks, 4, GenParams(6), torch.Generator().manual_seed(0), temps, on_ready=ready.append)
    handed = [s for chunk in ready for s in chunk]
    assert sorted(map(id, handed)) == sorted(map(id, samples))  # each sample once
    for chunk in ready:
        groups = [s.group for s in chunk]
        assert len(chunk) % 4 == 0 and all(groups.count(g) == 4 for g in groups)  # whole groups
    plain = policy.sample(tasks, 4, GenParams(6), torch.Generator().manual_seed(0), temps)
    assert [s.completion_ids for s in plain] == [s.completion_ids for s in samples]
