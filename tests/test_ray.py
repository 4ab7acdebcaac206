"""engine: ray on a local 2-CPU Ray cluster (one per module: Ray takes seconds to start): a short
run with finite metrics, a rollout actor killed mid-run that costs no sample, and the code
domain's sandbox pool as its own actor, killed mid-run at no cost either."""

import json
import math
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray>=2.30')")

from postrl.config.loading import load_config  # noqa: E402
from postrl.engines import ray_engine  # noqa: E402
from postrl.errors import UserError  # noqa: E402
from postrl.loop import train  # noqa: E402
from postrl.sandbox.pool import SandboxPool  # noqa: E402
from postrl.sandbox.runs import RunRequest, SandboxConfig, SandboxUnavailable  # noqa: E402
from postrl.store.rollouts import read_rows  # noqa: E402

ARGS = [
    "train.prompts_per_step=4", "train.samples_per_prompt=4", "rl.entropy_coef=0.01",
    "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false",
    "monitor.spot_check_every_steps=0", "pipeline.max_staleness=1",
]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


WHOLE = ["engine=ray", "train.total_steps=4", "checkpoint.every_steps=2"]  # with ARGS: max_staleness 1


def run_train(model_dir, run_dir, *extra, log=lambda *a: None):
    cfg = load_config("recipes/default.yaml", [f"model.name={model_dir}", f"run.dir={run_dir}", *ARGS, *extra])
    return train(cfg, log=log)


@pytest.fixture(scope="module")
def whole(cluster, tiny_model_dir, tmp_path_factory):
    """An uninterrupted 4-step Ray run at staleness 1 with a checkpoint at step 2, made once: the
    run whose metrics are checked below, and the one the killed async run must end as; with the
    torch threads it was trained with."""
    run_dir = run_train(tiny_model_dir, tmp_path_factory.mktemp("ray") / "whole", *WHOLE)
    return run_dir, torch.get_num_threads()


def test_a_ray_run_completes_with_finite_metrics(tiny_model_dir, whole):
    run_dir, _ = whole
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    for m in lines:
        for key in ("reward/mean", "pass_rate", "loss", "entropy", "grad_norm", "staleness/mean", "time/sample_s"):
            assert math.isfinite(m[key]), key
        assert m["engine/restarts"] == 0
    assert [m["staleness/max"] for m in lines] == [0, 1, 1, 1]  # each batch from the weights of a step before
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_actors_asking_for_gpus_the_cluster_lacks_is_one_line(tiny_model_dir, tmp_path):
    with pytest.raises(UserError, match=r"^config keys ray.rollout_gpus = 0.5 x 2 rollout actors \+ ray.reward_gpus = "
                                        r"1: 2 GPUs, the Ray cluster has 0; set them to 0 to run those actors on CPUs$"):
        run_train(tiny_model_dir, tmp_path / "gpus", "engine=ray", "train.total_steps=1", "ray.rollout_gpus=0.5",
                  "ray.rollout_workers=2", "ray.reward_gpus=1")


def test_killed_rollout_actor_loses_no_sample(tiny_model_dir, tmp_path, monkeypatch):
    start, killed = ray_engine.RayEngine._start, []

    def start_then_kill(self, order):  # the worker dies with step 1's order (and step 2's next) in flight
        flight = start(self, order)
        if order.step == 1 and not killed:
            ray.get(self.workers[0].ping.remote())
            ray.kill(self.workers[0], no_restart=True)
            killed.append(order.step)
        return flight

    monkeypatch.setattr(ray_engine.RayEngine, "_start", start_then_kill)
    logs = []
    run_dir = run_train(tiny_model_dir, tmp_path / "ray", "engine=ray", "train.total_steps=3", log=logs.append)
    assert killed and any("died" in line and "submitted again" in line for line in map(str, logs))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["engine/restarts"] == 1

    # the same run on the local threaded pipeline: orders are deterministic, so the rollouts match
    monkeypatch.undo()
    local_dir = run_train(tiny_model_dir, tmp_path / "local", "engine=local", "train.total_steps=3")
    got, want = read_rows(run_dir), read_rows(local_dir)
    keys = [(r.step, r.sample) for r in got]
    assert len(keys) == len(set(keys)) == 3 * 16  # none lost, none twice
    assert [(r.step, r.sample, r.task_id, r.token_ids, r.reward, r.policy_version) for r in got] == \
        [(r.step, r.sample, r.task_id, r.token_ids, r.reward, r.policy_version) for r in want]


CODE = ["domains={code: {weight: 1.0, params: {workers: 1, max_workers: 2}}}"]


def needs_sandbox():
    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))


def test_code_domain_runs_on_the_sandbox_actor(tiny_model_dir, tmp_path):
    needs_sandbox()
    logs = []
    run_dir = run_train(tiny_model_dir, tmp_path / "run", "engine=ray", "train.total_steps=2", *CODE,
                        log=logs.append)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert any("sandbox pool of domain code is an actor" in str(line) for line in logs)
    for m in lines:
        assert math.isfinite(m["reward/code"]) and m["pipeline/score_chunks"] >= 1
        assert m["sandbox/code/workers"] >= 1 and m["engine/sandbox_requeues"] == 0
    # every candidate ran on the actor: at least one run per sample per step (plus judge runs)
    assert lines[-1]["sandbox/code/runs"] >= 2 * 16


def test_killed_sandbox_actor_loses_no_sample(tiny_model_dir, tmp_path, monkeypatch):
    """The domain's (one) sandbox actor dies while the reward worker's runs wait in its pool (held
    full by two long runs sent from here); Ray restarts it, the fleet sends those runs again, and
    the rollouts equal the local engine's."""
    needs_sandbox()
    start, killed = ray_engine.RayEngine._start, []

    def kill_when_busy(fleet):
        actor = ray.get(fleet.actors.remote())[0]
        hold = [RunRequest("import time; time.sleep(30)", timeout_s=60)] * 2  # both workers (max_workers 2)
        blocked = actor.run_many.remote(hold)
        # until a reward worker's call waits behind the held runs: one in flight beside them, seen
        # after a reward call that was already running when they came (short code) has had time to
        # end, so that the held runs have both workers; the info that showed it is the one checked
        sent, deadline = time.time(), time.time() + 120
        info = ray.get(actor.info.remote())
        while (info["in_flight"] < 2 or time.time() - sent < 5) and time.time() < deadline:
            time.sleep(0.05)
            info = ray.get(actor.info.remote())
        killed.append(info)
        ray.kill(actor, no_restart=False)  # Ray restarts it
        try:
            ray.get(blocked)
        except ray.exceptions.RayActorError:
            killed.append("held runs lost with the actor")

    def start_then_kill(self, order):
        flight = start(self, order)
        if order.step == 2 and not killed:
            threading.Thread(target=kill_when_busy, args=(self.sandbox_fleets["code"],), daemon=True).start()
        return flight

    monkeypatch.setattr(ray_engine.RayEngine, "_start", start_then_kill)
    logs = []
    run_dir = run_train(tiny_model_dir, tmp_path / "ray", "engine=ray", "train.total_steps=3", *CODE,
                        log=logs.append)
    assert killed[0]["in_flight"] >= 2 and killed[1] == "held runs lost with the actor"
    assert any("sandbox actor died" in line and "queued again" in line for line in map(str, logs))
    last = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["engine/sandbox_requeues"] >= 1 and last["engine/restarts"] == 0

    monkeypatch.undo()
    local_dir = run_train(tiny_model_dir, tmp_path / "local", "engine=local", "train.total_steps=3", *CODE)
    got, want = read_rows(run_dir), read_rows(local_dir)
    keys = [(r.step, r.sample) for r in got]
    assert len(keys) == len(set(keys)) == 3 * 16  # none lost, none twice
    assert [(r.step, r.sample, r.task_id, r.token_ids, r.reward, r.verifier_status) for r in got] == \
        [(r.step, r.sample, r.task_id, r.token_ids, r.reward, r.verifier_status) for r in want]


def test_imports_are_loaded_by_the_ray_reward_actor(tiny_model_dir, tmp_path):
    """A reward term from the recipe's `imports:` is computed on the reward actor, which loaded it."""
    import os

    from postrl.extensions import load_recipe

    plugin = tmp_path / "ray_pid_term.py"
    plugin.write_text("import os\nfrom postrl.rewards.terms import register_term\n\n\n"
                      "@register_term('pid_term')\ndef pid_term(tasks, responses):\n"
                      "    return [float(os.getpid()) for _ in responses]\n")
    cfg = load_recipe("recipes/default.yaml", [
        f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", *ARGS, "engine=ray", "train.total_steps=2",
        f"imports=[{plugin}]", "domains.arith.reward={reward: 1.0, pid_term: 0.0}"])
    rows = read_rows(train(cfg, log=lambda *a: None))
    pids = {r.reward_components["pid_term"] for r in rows}
    assert len(rows) == 32 and len(pids) == 1 and pids != {float(os.getpid())}


def test_multi_turn_episodes_play_on_the_rollout_actors_as_they_do_locally(tiny_model_dir, tmp_path):
    """A multi-turn domain (tests/agent_envs.py, loaded by the actors from `imports:`) under Ray:
    the same episodes, token for token, turn for turn, as the local engine at the same staleness."""
    from pathlib import Path

    from postrl.extensions import load_recipe

    recipe = tmp_path / "agents.yaml"
    recipe.write_text(f"imports: [{Path(__file__).parent / 'agent_envs.py'}]\n"
                      "domains:\n  two: {type: two_turn_arith, params: {levels: [2]}, tools: [calculator]}\n")
    runs = {}
    for engine in ("local", "ray"):
        cfg = load_recipe(str(recipe), [f"model.name={tiny_model_dir}", f"run.dir={tmp_path / engine}", *ARGS,
                                        f"engine={engine}", "train.total_steps=2", "train.max_new_tokens=6"])
        runs[engine] = [(r.token_ids, r.loss_mask, [(t["role"], t["text"]) for t in r.turns], r.reward)
                        for r in read_rows(train(cfg, log=lambda *a: None))]
    assert runs["ray"] == runs["local"]
    assert any(0 in mask for _, mask, _, _ in runs["ray"])  # observations were played and masked


def test_a_ray_run_resumes_bitwise(tiny_model_dir, tmp_path):
    """A Ray-engine run stopped after its step-2 checkpoint and resumed to step 4 ends with the
    weights and rollouts of an uninterrupted one. (Synchronous: at staleness K an order is sent K
    steps ahead, so a run that ends at step 2 has sent no order for step 2 and cannot stand in
    for one interrupted there; the killed-and-resumed async runs are in tests/test_resume.py.)"""
    from postrl.loop import resume_config

    sync = ["engine=ray", "pipeline.max_staleness=0", "checkpoint.every_steps=2"]
    reference = run_train(tiny_model_dir, tmp_path / "ref", *sync, "train.total_steps=4")
    part = run_train(tiny_model_dir, tmp_path / "part", *sync, "train.total_steps=2")
    first_shard = part / "rollouts" / "step_00000000.parquet"
    written = first_shard.stat().st_mtime_ns
    resumed = train(resume_config(part, ["train.total_steps=4"]), resume=True, log=lambda *a: None)
    assert first_shard.stat().st_mtime_ns == written  # continued from the checkpoint, not trained again
    want, got = load_file(reference / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    rows = [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(resumed)]
    assert rows == [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(reference)]
    assert sorted({r["step"] for r in rows}) == [0, 1, 2, 3]


def test_a_killed_async_ray_run_resumes_bitwise(tiny_model_dir, tmp_path, whole):
    """An asynchronous Ray-engine run (staleness 1) SIGKILLed after its step-2 checkpoint, with
    step 3's order in flight on the rollout actor, and resumed with `postrl train --resume`, ends
    with the weights and rollouts of the same run trained here without a break (the module's
    `whole`). The killed and resumed drivers are `postrl train` processes with the torch threads
    `whole` was trained with that join this module's cluster through `ray.address` (a driver that
    started its own Ray and was killed would leave Ray processes behind); the killed one's actors
    die with it, and every CPU of the cluster is free again at the end."""
    import os
    import subprocess
    import sys

    def postrl(*args, crash_at=""):
        env = {**os.environ, "POSTRL_CRASH_AT": crash_at}  # with the cluster's RAY_AUTH_TOKEN and RAY_AUTH_MODE
        return subprocess.run([sys.executable, "-m", "postrl", "train", *args], env=env, capture_output=True, text=True)

    whole, threads = whole
    address = ray.get_runtime_context().gcs_address
    cut = postrl("recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'cut'}", *ARGS, *WHOLE,
                 f"ray.address={address}", f"run.threads={threads}", crash_at="step.stored:3")  # step 2 stored
    assert cut.returncode == -9, cut.stderr[-2000:]
    state = torch.load(tmp_path / "cut" / "checkpoints" / "step_00000002" / "state.pt", weights_only=False)
    assert sorted(state["pipeline"]["done"]) == [2]  # the order in flight at the checkpoint, drained into it
    first_shard = tmp_path / "cut" / "rollouts" / "step_00000000.parquet"
    written = first_shard.stat().st_mtime_ns
    resumed = postrl("--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert first_shard.stat().st_mtime_ns == written  # continued from the checkpoint, not trained again

    want = load_file(whole / "final" / "model.safetensors")
    got = load_file(tmp_path / "cut" / "final" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    rows = [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(tmp_path / "cut")]
    assert rows == [{k: v for k, v in vars(r).items() if k != "timings"} for r in read_rows(whole)]
    assert len({(r["step"], r["sample"]) for r in rows}) == len(rows) == 4 * 16  # none lost, none twice
    lines = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [m["staleness/max"] for m in lines] == [0, 1, 1, 1]  # each batch from the weights of a step before

    deadline = time.time() + 30  # Ray frees a dead driver's actors' CPUs within a second or so
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.time() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]


def test_a_rollout_worker_samples_with_the_named_backend_and_loads_each_version_once(tiny_model_dir, tmp_path,
                                                                                     monkeypatch):
    """A RolloutWorker (here in this process, not as an actor) builds the backend `rollout.backend`
    names, and hands it each published version once: a second order with the same weights loads
    nothing, new weights are loaded."""
    import toy_backend

    from postrl.builtin_models import load_model
    from postrl.engines.orders import Order, score_chunk
    from postrl.records import Task
    from postrl.tasks.catalog import build_domains

    monkeypatch.setenv(toy_backend.LOG, str(tmp_path / "loads"))
    cfg = load_config("recipes/default.yaml", [f"model.name={tiny_model_dir}", *ARGS, "rollout.backend=toy_greedy",
                                               f"imports=[{toy_backend.__file__}]"])
    domains = build_domains(cfg)

    class Scorer:  # the reward actor's `score.remote(samples)`: a ref to the scores
        class score:
            @staticmethod
            def remote(samples):
                return ray.put(score_chunk(samples, domains, {"arith": {"reward": 1.0}}))

    model, tok = load_model(str(tiny_model_dir), "float32", log=lambda *a: None)
    threads = torch.get_num_threads()
    try:
        worker = ray_engine.RolloutWorker(model, tok, cfg)
        tasks = [Task("arith", f"t{i}", f"{i}+{i + 5}=", str(2 * i + 5)) for i in range(4)]
        first = ray.put(model.state_dict())
        rollouts = [worker.generate(Order(step, tasks, [1.0] * 16, version), [ref], Scorer)
                    for step, version, ref in [(0, 0, first), (1, 0, first), (2, 2, ray.put(model.state_dict()))]]
    finally:
        torch.set_num_threads(threads)
    assert worker.policy.rollout.backend == "toy_greedy"
    assert [v for _, v in toy_backend.loads(tmp_path / "loads")] == [0, 2]
    for rollout in rollouts:  # greedy: each group's four completions are one
        ids = [s.completion_ids for s in rollout.samples]
        assert all(ids[g * 4 : g * 4 + 4].count(ids[g * 4]) == 4 for g in range(4))
    assert [s.policy_version for s in rollouts[2].samples] == [2] * 16


def test_ray_rollout_actors_sample_with_vllm(head32_model_dir, tmp_path):
    """`rollout.backend: vllm` under `engine: ray`: each rollout actor builds its own vLLM engine and
    loads each published version from the object store into it (one `reload_weights` call: a few
    milliseconds here; postrl's own backend only records the version, in microseconds). The model
    has head size 32: vLLM-CPU has no attention kernel for tiny_model_dir's 16."""
    from postrl.sampling.vllm_backend import vllm_problem

    if vllm_problem():
        pytest.skip(vllm_problem())
    run_dir = run_train(head32_model_dir, tmp_path / "run", "engine=ray", "train.total_steps=3",
                        "rollout.backend=vllm")
    m = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # at staleness 1 steps 0 and 1 are sampled with version 0 (one sync), step 2 with step 0's update
    assert [x["step"] for x in m] == [0, 1, 2] and m[0]["time/sync_s"] > 1e-3 and m[2]["time/sync_s"] > 1e-3
    assert m[0]["mismatch/tokens"] > 0 and m[0]["mismatch/logp_abs_diff_max"] < 1e-4  # step 0: fresh rows
    rows = read_rows(run_dir)
    assert len(rows) == 3 * 16 and {r.policy_version for r in rows[32:]} == {2}
