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
from postrl.cli import main
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


def in_process(args, capsys) -> tuple[int, str, str]:
    """`postrl ARGS` through `postrl.cli.main` in this process: (exit code, stdout, stderr). For the
    runs and refusals no SIGKILL or bitwise comparison depends on (a fresh process costs seconds of
    imports; the killed runs and those compared with `reference` still get one)."""
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


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


def _train(run_dir, model_dir, *extra, crash_at=None):
    return postrl(["train", "recipes/default.yaml", f"model.name={model_dir}", f"run.dir={run_dir}", *ARGS, *extra],
                  crash_at=crash_at)


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0(reference, tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir, tiny_model_dir, crash_at="step.stored:1").returncode == -9  # step 0 stored, no checkpoint
    assert (run_dir / "config.yaml").is_file() and CheckpointManager(run_dir).steps() == []
    # a new train into it is refused: it holds a run
    code, _, err = in_process(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
                               *ARGS], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: run directory {run_dir} already holds a run (config.yaml); continue it with `postrl train "
        f"--resume {run_dir}`, or start anew with run.overwrite=true (the old run is moved to {run_dir}.old-N, "
        "not deleted)"]
    resumed = postrl(["train", "--resume", str(run_dir)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"no intact checkpoint in {run_dir}; starting from step 0" in resumed.stdout
    assert rows_without_timings(run_dir) == rows_without_timings(reference)  # as if never killed
    want, got = (load_file(d / "final" / "model.safetensors") for d in (reference, run_dir))
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_run_killed_at_its_first_write_leaves_no_run_behind(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    # config.yaml written to its temporary file and fsynced, killed before the rename
    assert _train(run_dir, tiny_model_dir, "train.total_steps=1", crash_at="atomic.write:1").returncode == -9
    assert [p.name for p in run_dir.iterdir()] == [p.name for p in run_dir.glob(".config.yaml.tmp*")] != []
    code, _, err = in_process(["train", "--resume", str(run_dir)], capsys)
    assert code == 2
    assert err.strip().splitlines() == [f"error: cannot resume {run_dir}: no config.yaml (is it a postrl run directory?)"]
    # not a run: a new one starts there
    code, _, err = in_process(["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
                               *ARGS, "train.total_steps=1"], capsys)
    assert code == 0, err[-2000:]
    assert (run_dir / "final" / "model.safetensors").is_file() and not (tmp_path / "run.old-1").exists()


def test_a_run_killed_in_its_first_second_is_resumed_or_moved_aside(tiny_model_dir, tmp_path, capsys):
    import signal
    import time

    run_dir = tmp_path / "run"
    cmd = ["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}", *ARGS,
           "train.total_steps=1"]
    proc = subprocess.Popen([sys.executable, "-m", "postrl", *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "POSTRL_CRASH_AT": ""})
    deadline = time.monotonic() + 120
    while not run_dir.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)  # the run's first writes: config.yaml, the store, the sinks
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -9 and run_dir.is_dir()

    had_config = (run_dir / "config.yaml").is_file()
    code, _, err = in_process(["train", "--resume", str(run_dir)], capsys)
    if had_config:  # killed after its config: resumed from step 0 to the end
        assert code == 0, err[-2000:]
        assert [r.step for r in read_rows(run_dir)] == [0] * 16
    else:  # killed before: nothing to resume, one line
        assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = in_process([*cmd, "run.overwrite=true"], capsys)
    assert code == 0, err[-2000:]
    assert (run_dir / "final" / "model.safetensors").is_file()
    old = tmp_path / "run.old-1"
    assert old.is_dir() == had_config  # a run was moved aside, whole; a directory without one is reused
    if had_config:
        assert (old / "final" / "model.safetensors").is_file()
