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

    from postrl.config.loading import load_config
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
    from postrl.config.loading import load_config
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
    from postrl.config.loading import load_config
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


# ---------------------------------------------------------------------------- the messages


def test_a_sampler_speaks_typed_messages(tiny_model_dir):
    """`sampler_main`, run in a thread here: LoadWeights and RunOrder in; GroupReady for each set
    of whole groups, then OrderDone, whose sample order puts them back in the order's order, with
    the reference log-probs; an order for weights it was never sent is an OrderFailed; None stops it."""
    import dataclasses
    import queue
    import threading
    from types import SimpleNamespace

    from test_async import ARGS

    from postrl.builtin_models import load_model
    from postrl.config.loading import load_config
    from postrl.engines.orders import Order
    from postrl.records import Task
    from postrl.sampling.generate import GenParams
    from postrl.sampling.policy import Policy
    from postrl.seeding import step_generator

    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", *ARGS])
    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    tasks = [Task("arith", f"t{i}", f"{i}+{i + 5}=", str(2 * i + 5)) for i in range(4)]
    orders, sent = queue.Queue(), []
    for msg in [processes.LoadWeights(processes.publish(model.state_dict(), 0)),
                processes.RunOrder(7, Order(0, tasks, [1.0] * 16, 0)),
                processes.RunOrder(8, Order(1, tasks, [1.0] * 16, 3)), None]:
        orders.put(msg)
    threads = torch.get_num_threads()
    sampler = threading.Thread(target=processes.sampler_main, args=(model, tok, 512, cfg, threads, "cpu", orders,
                                                                     SimpleNamespace(send=sent.append)))
    try:
        sampler.start()
        sampler.join(timeout=300)
    finally:
        torch.set_num_threads(threads)
    assert not sampler.is_alive()
    *groups, done, failed = sent
    assert groups and all(isinstance(m, processes.GroupReady) and m.attempt == 7 for m in groups)
    assert isinstance(done, processes.OrderDone) and done.attempt == 7 and done.start <= done.end
    flat = [s for m in groups for s in m.samples]
    ordered = [flat[j] for j in done.sample_order]
    assert sorted(done.sample_order) == list(range(16)) and [s.group for s in ordered] == [g // 4 for g in range(16)]
    want = Policy(model, tok).sample(tasks, 4, GenParams(cfg.train.max_new_tokens), step_generator(cfg.seed, 0, 0),
                                     [1.0] * 16)
    assert [s.completion_ids for s in ordered] == [s.completion_ids for s in want]
    assert len(done.ref_logprobs) == 16 and done.reference_s > 0  # pipeline.reference: sampler
    assert [len(r) for r in done.ref_logprobs] == [len(s.completion_ids) for s in ordered]
    assert isinstance(failed, processes.OrderFailed) and failed.attempt == 8
    assert "sampler holds weights 0, order wants 3" in failed.error
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.attempt = 8


def test_reading_the_metrics_changes_nothing():
    """`metrics()` is a getter; the run's `metrics_recorded()` starts the next step's sums."""
    engine = object.__new__(processes.ProcessEngine)  # the counters only: no sampler is started
    engine._step_metrics, engine.restarts, engine.reference_s = {"pipeline/wait_s": 0.5}, 1, 2.5
    first = engine.metrics()
    assert first == engine.metrics() == {"pipeline/wait_s": 0.5, "engine/restarts": 1.0, "time/reference_s": 2.5}
    engine.metrics_recorded()
    assert engine.metrics()["time/reference_s"] == 0.0 and engine.metrics()["engine/restarts"] == 1.0


def test_sampler_processes_sample_with_the_named_backend(tiny_model_dir, tmp_path, monkeypatch):
    """`rollout.backend` reaches the sampler processes: a user's backend (`imports:`) samples there,
    and loads each version once."""
    import toy_backend

    monkeypatch.setenv(toy_backend.LOG, str(tmp_path / "loads"))
    run_dir = run_train(tiny_model_dir, tmp_path / "run", "train.total_steps=2", "pipeline.samplers=1",
                        "rollout.backend=toy_greedy", f"imports=[{toy_backend.__file__}]", *ONE_THREAD)
    by_group: dict[tuple[int, int], list] = {}
    for r in rows(run_dir):
        by_group.setdefault((r["step"], r["group"]), []).append(r["token_ids"])
    assert len(by_group) == 2 * 4 and all(g.count(g[0]) == len(g) for g in by_group.values())  # greedy: the toy's
    loads = toy_backend.loads(tmp_path / "loads")
    in_sampler = [v for owner, v in loads if not owner.startswith(f"{os.getpid()}:")]
    assert in_sampler == [0, 2]  # versions 0 and 2 (two updates a step), once each
    assert len(loads) == len(set(loads))
