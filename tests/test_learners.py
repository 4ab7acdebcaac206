"""The data-parallel learner (train.learners N; postrl.learner.distributed): 2 ranks give 1 rank's
parameters within float tolerance, a 2-rank run resumes bit for bit, a rank gone between steps
stops the run with a checkpoint that resumes to the uninterrupted run's end, and a rank that dies
or hangs during an update ends the run with one line instead of hanging."""

import os
import signal
import time

import pytest
import torch
from test_async import rows, run_train, same_weights, weights
from test_processes import metrics

from postrl.errors import UserError
from postrl.loop import resume_config, train
from postrl.run import Run

TWO = ["train.learners=2", "train.minibatches=2"]  # two optimiser steps per update: the shared state is used


FSDP = [*TWO, "train.shard=fsdp"]


def kill_rank_1_before_step_3(monkeypatch):
    """`Run.check_learners` patched to SIGKILL learner rank 1 first at step 3; returns the original."""
    check = Run.check_learners

    def kill_then_check(self, step):
        if step == 3:
            process = self.learner.ranks.peers[0][0]
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=30)
        check(self, step)

    monkeypatch.setattr(Run, "check_learners", kill_then_check)
    return check


@pytest.mark.parametrize("extra", [[], ["model.lora.r=4"]], ids=["full", "lora"])  # lora: random adapters, rank 0's
def test_two_ranks_replicated_or_sharded_give_one_ranks_parameters(tiny_model_dir, tmp_path, extra):
    one = run_train(tiny_model_dir, tmp_path / "one", "train.total_steps=3", "train.minibatches=2", *extra)
    two = run_train(tiny_model_dir, tmp_path / "two", "train.total_steps=3", *TWO, *extra)
    fsdp = run_train(tiny_model_dir, tmp_path / "fsdp", "train.total_steps=3", *FSDP, *extra)
    a = weights(one)
    for run in (two, fsdp):
        b = weights(run)
        assert a.keys() == b.keys()
        for k in a:  # the same sums, added in another order (fsdp: Hugging Face's forward, not FastLM's)
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
        assert [r["token_ids"] for r in rows(one)] == [r["token_ids"] for r in rows(run)]
        for m1, m2 in zip(metrics(one), metrics(run), strict=True):
            for key in ("loss", "pg_loss", "kl/mean", "kl/max", "entropy", "entropy/arith", "clip_frac", "grad_norm"):
                assert m2[key] == pytest.approx(m1[key], rel=1e-3, abs=1e-5), key
    # each rank's parameters, gradients and Adam moments: all of them replicated, half of them sharded
    replicated, sharded = metrics(two)[-1]["learner/state_mib"], metrics(fsdp)[-1]["learner/state_mib"]
    print(f"per-rank learner state: replicated {replicated:.3f} MiB, sharded {sharded:.3f} MiB; peak resident "
          f"set: replicated {metrics(two)[-1]['learner/peak_mib']:.0f} MiB, "
          f"sharded {metrics(fsdp)[-1]['learner/peak_mib']:.0f} MiB")
    assert sharded < 0.6 * replicated


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    """A 2-rank run of 4 steps, checkpointed every 2."""
    return run_train(tiny_model_dir, tmp_path_factory.mktemp("dp") / "ref", "train.total_steps=4",
                     "checkpoint.every_steps=2", *TWO)


def test_a_two_rank_run_resumes_bitwise(tiny_model_dir, tmp_path, uninterrupted):
    part = run_train(tiny_model_dir, tmp_path / "part", "train.total_steps=2", "checkpoint.every_steps=2", *TWO)
    resumed = train(resume_config(part, ["train.total_steps=4"]), resume=True, log=lambda *a: None)
    assert same_weights(weights(uninterrupted), weights(resumed))
    assert rows(uninterrupted) == rows(resumed)


def test_a_killed_sharded_run_resumes_bitwise(tiny_model_dir, tmp_path, monkeypatch):
    """Rank 1 SIGKILLed before step 3: its shards are gone, so the run stops with one line naming
    the newest checkpoint (step 2's, the ranks' optimiser state gathered whole); resumed, it ends
    where the uninterrupted sharded run ends, bit for bit."""
    steps = ["train.total_steps=4", "checkpoint.every_steps=2", *FSDP]
    whole = run_train(tiny_model_dir, tmp_path / "whole", *steps)
    check = kill_rank_1_before_step_3(monkeypatch)
    with pytest.raises(UserError, match=r"^learner rank 1 \(exit code -9\) stopped before step 3, and its shards .* "
                                        r"the newest checkpoint is where the run continues: postrl train --resume .*cut$"):
        run_train(tiny_model_dir, tmp_path / "cut", *steps)
    monkeypatch.setattr(Run, "check_learners", check)
    resumed = train(resume_config(tmp_path / "cut", []), resume=True, log=lambda *a: None)
    assert same_weights(weights(whole), weights(resumed))
    assert rows(whole) == rows(resumed)


def test_a_rank_gone_between_steps_stops_the_run_with_a_checkpoint_that_resumes(
        tiny_model_dir, tmp_path, uninterrupted, monkeypatch):
    check = kill_rank_1_before_step_3(monkeypatch)
    with pytest.raises(UserError, match=r"^learner rank 1 \(exit code -9\) stopped before step 3; a checkpoint "
                                        r"of step 3 was written: postrl train --resume .*cut$"):
        run_train(tiny_model_dir, tmp_path / "cut", "train.total_steps=4", "checkpoint.every_steps=2", *TWO)
    monkeypatch.setattr(Run, "check_learners", check)
    resumed = train(resume_config(tmp_path / "cut", []), resume=True, log=lambda *a: None)
    assert same_weights(weights(uninterrupted), weights(resumed))
    assert rows(uninterrupted) == rows(resumed)


def test_a_rank_that_dies_during_an_update_ends_the_run_with_one_line(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("POSTRL_CRASH_AT", "learner.update:2")  # rank 1, the second update it gets
    with pytest.raises(UserError, match=r"^rank 1 \(exit code -9\) stopped during the update; the collective "
                                        r"failed: .*postrl train --resume .*dies$") as e:
        run_train(tiny_model_dir, tmp_path / "dies", "train.total_steps=3", *TWO)
    assert "\n" not in str(e.value)


def test_a_rank_that_hangs_during_an_update_ends_the_run_after_the_timeout(tiny_model_dir, tmp_path, monkeypatch):
    check = Run.check_learners

    def stop_rank_1_before_step_1(self, step):
        check(self, step)
        if step == 1:
            os.kill(self.learner.ranks.peers[0][0].pid, signal.SIGSTOP)  # alive, and never answers

    monkeypatch.setattr(Run, "check_learners", stop_rank_1_before_step_1)
    start = time.monotonic()
    with pytest.raises(UserError, match=r"stopped during the update; the collective failed: .*postrl train --resume"):
        run_train(tiny_model_dir, tmp_path / "hangs", "train.total_steps=3", "train.learner_timeout_s=3", *TWO)
    assert time.monotonic() - start < 120  # ended by the 3 s timeout, not by the test's own limit
