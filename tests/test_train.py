"""Integration: the CLI's train and eval commands on a tiny model, checking real effects."""

import json
import math

import pytest
import torch
import yaml
from safetensors.torch import load_file

from postrl.cli import main
from postrl.errors import ConfigError


def test_two_step_train_changes_parameters_and_writes_the_run(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    code = main([
        "train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
        "train.total_steps=2", "train.prompts_per_step=4", "train.samples_per_prompt=4",
        "eval.num_problems=8", "eval.samples_per_problem=4", "eval.k=[1,4]", "run.progress=false",
        # a barely trained model rarely answers right, so all advantages may be 0; the entropy
        # bonus guarantees a gradient either way
        "rl.entropy_coef=0.01",
    ])
    assert code == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["train"]["total_steps"] == 2 and saved["run"]["dir"] == str(run_dir)

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        for key in ("reward/mean", "pass_rate", "kl/mean", "entropy", "clip_frac", "response_len/mean",
                    "tokens_per_s", "time/sample_s", "time/reward_s", "time/update_s", "loss", "grad_norm"):
            assert m[key] is not None and math.isfinite(m[key]), key
        assert 0 <= m["pass_rate"] <= 1 and m["entropy"] > 0 and m["tokens_per_s"] > 0
    assert lines[1]["kl/mean"] > 0  # the policy moved away from the reference

    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(run_dir / "final" / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)  # every tensor received a gradient step
    result = json.loads((run_dir / "eval" / "step_2.json").read_text())
    assert set(result["arith"]) >= {"greedy", "pass@1", "pass@4"}


def test_eval_json_reports_greedy_and_pass_at_k(tiny_model_dir, capsys):
    code = main(["eval", str(tiny_model_dir), "--domains", "arith", "--k", "1,4", "--samples", "4",
                 "--problems", "10", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    r = result["arith"]
    assert set(r) >= {"greedy", "pass@1", "pass@4"}
    assert 0 <= r["pass@1"] <= r["pass@4"] <= 1 and r["n_problems"] == 10


def test_eval_rejects_k_above_samples(tiny_model_dir, capsys):
    assert main(["eval", str(tiny_model_dir), "--k", "1,8", "--samples", "4"]) == 2
    assert "every k must be <= --samples (4)" in capsys.readouterr().err


# ---------------------------------------------------------------------------- a run is never lost


def _files(root):
    """Every file under `root` with its bytes: what "byte-identical afterwards" compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_train_into_a_run_refuses_and_overwrite_moves_the_old_run_aside(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "recipes/default.yaml", f"model.name={tiny_model_dir}", f"run.dir={run_dir}",
            "train.total_steps=1", "train.prompts_per_step=2", "train.samples_per_prompt=2", "eval.num_problems=2",
            "eval.samples_per_problem=1", "eval.k=[1]", "run.progress=false", "checkpoint.every_steps=1"]
    assert main(args) == 0
    first = _files(run_dir)
    assert "config.yaml" in first and "final/model.safetensors" in first and "checkpoints/step_00000001/meta.json" in first
    capsys.readouterr()

    assert main(args) == 2  # the same command typed twice
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err], err  # one line
    assert f"run directory {run_dir} already holds a run (config.yaml)" in err
    assert f"postrl train --resume {run_dir}" in err and "run.overwrite=true" in err
    assert _files(run_dir) == first  # not a byte changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]

    assert main([*args, "run.overwrite=true"]) == 0
    out = capsys.readouterr().out
    assert f"run.overwrite: the run that was in {run_dir} is now in {tmp_path / 'run.old-1'}" in out
    assert _files(tmp_path / "run.old-1") == first  # the old run kept whole, beside the new one
    second = _files(run_dir)
    assert "final/model.safetensors" in second and "rollouts" in {p.name for p in run_dir.iterdir()}
    assert yaml.safe_load(second["config.yaml"])["run"]["overwrite"] is True
    assert main([*args, "run.overwrite=true"]) == 0  # again: the next free name, nothing lost
    assert _files(tmp_path / "run.old-1") == first and _files(tmp_path / "run.old-2") == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.old-1", "run.old-2"]


def test_what_holds_a_run_and_what_does_not(tmp_path):
    from postrl.run_dir import RUN_MARKS, check_run_dir, held_run

    assert held_run(tmp_path / "absent") is None
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    (tmp_path / "user" / "data").mkdir()  # rows postrl.train writes before the run starts
    (tmp_path / "user" / ".config.yaml.tmp123").write_text("half")  # a run killed at its first write
    assert held_run(tmp_path / "user") is None
    check_run_dir(tmp_path / "user", overwrite=False)  # a new run may start there
    for mark in RUN_MARKS:
        d = tmp_path / mark.replace(".", "_")
        d.mkdir()
        (d / mark).mkdir()
        assert held_run(d) == mark
        with pytest.raises(ConfigError, match=f"already holds a run \\({mark}\\)"):
            check_run_dir(d, overwrite=False)
        check_run_dir(d, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="a file, not a directory"):
        check_run_dir(tmp_path / "file", overwrite=True)
