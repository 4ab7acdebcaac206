"""Integration: the CLI's train and eval commands on a tiny model, checking real effects."""

import json
import math

import torch
import yaml
from safetensors.torch import load_file

from postrl.cli import main


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
