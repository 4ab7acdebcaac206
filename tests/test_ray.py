"""engine: ray on a local 2-CPU Ray cluster (one per module: Ray takes seconds to start): a short
run with finite metrics, and a rollout actor killed mid-run that costs no sample."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray>=2.30')")

from postrl.config import load_config  # noqa: E402
from postrl.engines import ray_engine  # noqa: E402
from postrl.store import read_rows  # noqa: E402
from postrl.train import train  # noqa: E402

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


def run_train(model_dir, run_dir, *extra, log=lambda *a: None):
    cfg = load_config("recipes/default.yaml", [f"model.name={model_dir}", f"run.dir={run_dir}", *ARGS, *extra])
    return train(cfg, log=log)


def test_two_step_ray_run_completes_with_finite_metrics(tiny_model_dir, tmp_path):
    run_dir = run_train(tiny_model_dir, tmp_path / "run", "engine=ray", "train.total_steps=2")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        for key in ("reward/mean", "pass_rate", "loss", "entropy", "grad_norm", "staleness/mean", "time/sample_s"):
            assert math.isfinite(m[key]), key
        assert m["engine/restarts"] == 0
    assert [m["staleness/max"] for m in lines] == [0, 1]
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


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
