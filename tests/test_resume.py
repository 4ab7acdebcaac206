"""Crash recovery: SIGKILL a run at several points (mid-checkpoint, mid-shard, between steps),
resume each time, and compare with an uninterrupted run: final weights bitwise equal, rollout
store rows identical, exactly one row per (step, sample)."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from postrl.checkpoint import CheckpointManager
from postrl.store.rollouts import read_rows

ARGS = [
    "train.total_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=1",
    "train.prompts_per_step=4", "train.samples_per_prompt=4", "rl.entropy_coef=0.01",
    "eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false",
    "monitor.spot_check_every_steps=0",
]


def postrl(args, crash_at=None):
    env = {**os.environ, "POSTRL_CRASH_AT": crash_at or ""}
    return subprocess.run([sys.executable, "-m", "postrl", *args], env=env, capture_output=True, text=True)


def rows_without_timings(run_dir):
    rows = read_rows(run_dir)
    return [{k: v for k, v in vars(r).items() if k != "timings"} for r in rows]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    done = postrl(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}", *ARGS])
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def test_killed_and_resumed_run_matches_uninterrupted_run(reference, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    first = postrl(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}", *ARGS],
                   crash_at="checkpoint.write:2")  # dies while writing the step-4 checkpoint
    assert first.returncode == -9
    assert CheckpointManager(run_dir).steps() == [2]  # the half-written one is not visible

    for crash in ["store.write:1", "step.stored:2", None]:  # mid-shard, between steps, then to the end
        resumed = postrl(["train", "--resume", str(run_dir)], crash_at=crash)
        assert resumed.returncode == (0 if crash is None else -9), resumed.stderr[-2000:]

    want = load_file(reference / "final" / "model.safetensors")
    got = load_file(run_dir / "final" / "model.safetensors")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)

    rows = rows_without_timings(run_dir)
    assert rows == rows_without_timings(reference)
    keys = [(r["step"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6 * 16


def test_corrupted_latest_checkpoint_is_skipped(reference, tiny_model_dir, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    ckpt = CheckpointManager(run_dir)
    (good,) = ckpt.steps()  # keep_last=1
    newer = ckpt.root / "step_00000099"
    shutil.copytree(ckpt.root / f"step_{good:08d}", newer)
    (newer / "state.pt").write_bytes(b"garbage")
    warnings = []
    latest = CheckpointManager(run_dir, log=warnings.append).latest_valid()
    assert latest.step == good
    assert warnings == ["warning: skipping checkpoint step_00000099: state.pt does not match its checksum"]
    (newer / "meta.json").unlink()  # a crash before meta.json: incomplete, also skipped
    assert CheckpointManager(run_dir, log=warnings.append).latest_valid().step == good
    assert warnings[-1] == "warning: skipping checkpoint step_00000099: no meta.json (incomplete write)"
