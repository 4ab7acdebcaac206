"""Sampler processes (engine local, pipeline.samplers N; postrl.engines.processes): equal to the
synchronous loop at max_staleness 0, reproducible and equal to the threaded pipeline at K > 0, a
killed sampler loses no sample, and a killed run resumes bit for bit."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from test_async import rows, run_train, same_weights, weights

from postrl.engines import processes

ONE_THREAD = ["run.threads=1", "pipeline.sampler_threads=1"]  # equal numerics need equal thread counts
# the uninterrupted run (`whole`) and the two runs, killed in part, that must end as it does
ON_ONE_SAMPLER = ["train.total_steps=4", "checkpoint.every_steps=2", "pipeline.max_staleness=1",
                  "pipeline.samplers=1", *ONE_THREAD]


def metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def whole(tiny_model_dir, tmp_path_factory):
    """The uninterrupted run on one sampler process, made once for the two tests that kill part of
    one: a sampler process, and the trainer itself."""
    return run_train(tiny_model_dir, tmp_path_factory.mktemp("processes") / "whole", *ON_ONE_SAMPLER)


@pytest.mark.parametrize("extra", [
    [],  # the reference pass on the sampler, over each order: a batch of one order gets the same numbers
    ["curriculum.dynamic_sampling=true", "train.max_new_tokens=4", "pipeline.reference=learner"],
], ids=["default", "dynamic-sampling"])
def test_sampler_process_at_staleness_0_equals_the_synchronous_loop(tiny_model_dir, tmp_path, extra):
    sync = run_train(tiny_model_dir, tmp_path / "sync", "train.total_steps=3", *ONE_THREAD, *extra)
    proc = run_train(tiny_model_dir, tmp_path / "proc", "train.total_steps=3", "pipeline.samplers=1",
                     *ONE_THREAD, *extra)
    assert same_weights(weights(sync), weights(proc))
    assert rows(sync) == rows(proc)
    assert all(m["engine/restarts"] == 0 for m in metrics(proc))
    on_sampler = "pipeline.reference=learner" not in extra  # then the samplers did the reference pass
    assert all((m["time/reference_s"] > 0) == on_sampler for m in metrics(proc))


def test_sampler_processes_at_staleness_2_are_reproducible_and_equal_the_threaded_pipeline(tiny_model_dir, tmp_path):
    extra = ["train.total_steps=4", "pipeline.max_staleness=2", *ONE_THREAD]
    first = run_train(tiny_model_dir, tmp_path / "a", "pipeline.samplers=2", *extra)
    again = run_train(tiny_model_dir, tmp_path / "b", "pipeline.samplers=2", *extra)
    threaded = run_train(tiny_model_dir, tmp_path / "threads", *extra)
    assert same_weights(weights(first), weights(again)) and rows(first) == rows(again)
    assert same_weights(weights(first), weights(threaded)) and rows(first) == rows(threaded)
    assert [m["staleness/max"] for m in metrics(first)] == [0, 1, 2, 2]


def test_a_killed_sampler_process_loses_no_sample(tiny_model_dir, tmp_path, monkeypatch, whole):
    start, killed = processes.ProcessEngine._start, []

    def start_then_kill(self, order):  # sampler 0 dies with step 1's order (and its weights) sent to it
        key = start(self, order)
        if order.step == 1 and not killed:
            os.kill(self.samplers[0].process.pid, signal.SIGKILL)
            killed.append(order.step)
        return key

    monkeypatch.setattr(processes.ProcessEngine, "_start", start_then_kill)
    logs = []
    from test_async import ARGS

    from postrl.config import load_config
    from postrl.loop import train

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'killed'}",
                                               *ARGS, *ON_ONE_SAMPLER])
    run_dir = train(cfg, log=logs.append)
    assert killed and any("sampler process 0 died" in line and "sent again" in line for line in map(str, logs))
    assert metrics(run_dir)[-1]["engine/restarts"] == 1
    got = rows(run_dir)
    assert len({(r["step"], r["sample"]) for r in got}) == len(got) == 4 * 16  # none lost, none twice
    assert got == rows(whole) and same_weights(weights(run_dir), weights(whole))


def test_a_killed_multi_process_run_resumes_bitwise(tiny_model_dir, tmp_path, whole):
    """The trainer is SIGKILLed after its step-2 checkpoint with step 3's order in flight on a
    sampler process; the resumed run ends as the uninterrupted one (trained in this process, with
    the same one thread), and the orphaned sampler exits."""
    from test_async import ARGS

    args = ["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'cut'}", *ARGS,
            *ON_ONE_SAMPLER]
    cut = subprocess.run([sys.executable, "-m", "postrl", *args], env={**os.environ, "POSTRL_CRASH_AT": "step.stored:3"},
                         capture_output=True, text=True)
    assert cut.returncode == -9
    resumed = subprocess.run([sys.executable, "-m", "postrl", "train", "--resume", str(tmp_path / "cut")],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert same_weights(weights(whole), weights(tmp_path / "cut"))
    assert rows(whole) == rows(tmp_path / "cut")


def test_samplers_are_refused_on_the_ray_engine():
    from postrl.config import load_config
    from postrl.errors import ConfigError

    with pytest.raises(ConfigError, match="pipeline.samplers"):
        load_config("recipes/default.yaml", ["engine=ray", "pipeline.samplers=2"])


def test_shared_weights_are_a_frozen_copy():
    state = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(2, dtype=torch.bfloat16), "c": torch.zeros(4)}
    shared = processes.publish(state, version=3)
    state["a"].add_(1)  # the trainer's next update
    got = shared.state_dict()
    assert torch.equal(got["a"], torch.arange(6.0).view(2, 3)) and got["b"].dtype == torch.bfloat16
    assert len(shared.buffers) == 2 and all(b.is_shared() for b in shared.buffers.values())


def test_weights_go_into_a_buffer_no_order_reads_and_orders_in_flight_keep_theirs(tiny_model_dir, tmp_path):
    """Once per version the trainer copies its weights into shared memory: into a buffer set of
    an earlier version that no order in flight reads, else into a new one. At staleness 2 three
    versions can be in flight at once, so three sets are made, and then reused, and every order in
    flight still reads the weights of the moment it was submitted."""
    from postrl.config import load_config
    from postrl.run import open_run

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'r'}",
                                               "pipeline.max_staleness=2", "pipeline.samplers=1", *ONE_THREAD])
    run = open_run(cfg, log=lambda *a: None)
    engine, policy = run.engine, run.policy
    submitted, made = {}, []
    try:
        for step in range(8):
            for ahead in engine.to_submit(step):
                tasks = run.sampler.next_batch(cfg.train.prompts_per_step, run.schedule.weights, run.schedule.task_weight)
                engine.submit(ahead, tasks)
                submitted[ahead] = (policy.version, {k: v.clone() for k, v in policy.model.state_dict().items()})
            with engine._cond:
                flights = {k[0]: f.order.weights for k, f in engine._flights.items()}
            for q, shared in flights.items():
                version, state = submitted[q]
                got = shared.state_dict()
                assert shared.version == version and all(torch.equal(got[k], v) for k, v in state.items())
            made.append(len(engine._buffers))
            engine.take(step)
            with torch.no_grad():  # a stand-in for the step's update: new weights, a new version
                next(policy.model.parameters()).add_(1.0)
            policy.version += 1
        assert made[-1] == made[3] == 3  # the versions in flight at once; reused from then on
    finally:
        run.engine.close()
        run.sinks.close()
