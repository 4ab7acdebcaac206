"""`benchmarks/gpu_suite.py --smoke`: the GPU machine's one prepared script runs its every section on
the CPU at tiny sizes, in this process (no fresh process's imports), so that it is known to work
before a GPU is lent."""

import math
import sys
from pathlib import Path

from postrl.sampling.vllm_backend import vllm_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_suite  # noqa: E402


def test_the_gpu_suite_smoke_runs_every_section_and_prints_its_figures(builtin_models_cached, tmp_path, capsys):
    assert gpu_suite.main(["--smoke", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            metric, value = line.split()[1].split("=", 1)
            results[metric] = float(value)
    backends = ["postrl"] if vllm_problem() else ["postrl", "vllm"]
    want = {"peak_tflops_measured", "bandwidth_gbs_measured", "grpo:pass1_before", "grpo:pass1_after", "wall_s",
            *(f"learner:{kind}:seq{n}:flops_share" for kind in ("full", "lora") for n in (64, 128)),
            *(f"learner:{kind}:seq64:compile:{figure}" for kind in ("full", "lora")
              for figure in ("flops_share", "tokens_per_s", "warmup_s", "loss_abs_diff")),
            "fsdp:noshard:tokens_per_s", "fsdp:fsdp1:tokens_per_s", "fsdp:loss_abs_diff",
            *(f"tiny:4rows:{b}:{figure}" for b in backends
              for figure in ("tokens_per_s", "bandwidth_share", "logp_abs_diff_mean")),
            "tiny:4rows:hf_static:tokens_per_s", "tiny:4rows:hf_static:bandwidth_share",
            *(f"tiny:4rows:postrl_graphs:{figure}" for figure in ("tokens_per_s", "logp_abs_diff_mean", "warmup_s",
                                                                  "same_tokens_as_eager", "same_tokens_twice")),
            *(["tiny:4rows:vllm:sync_ms"] if "vllm" in backends else [])}
    assert want <= set(results), sorted(want - set(results))
    assert all(math.isfinite(v) and v >= 0 for v in results.values()), results
    assert all(results[f"tiny:4rows:{b}:tokens_per_s"] > 0 for b in [*backends, "hf_static"])
    # float32, the learner's recomputation on the very weights each engine sampled with
    assert all(results[f"tiny:4rows:{b}:logp_abs_diff_mean"] < 1e-4 for b in [*backends, "postrl_graphs"])
    # the static decode steps, eager on the CPU: one seed, the eager engine's tokens, and the same twice
    assert results["tiny:4rows:postrl_graphs:same_tokens_as_eager"] == 1
    assert results["tiny:4rows:postrl_graphs:same_tokens_twice"] == 1
    assert all(0 < results[f"learner:{k}:seq64:flops_share"] for k in ("full", "lora"))
    # float32: compiled layers and the one-rank FSDP2 update give the eager, unsharded loss
    assert all(results[f"learner:{k}:seq64:compile:loss_abs_diff"] <= 1e-5 for k in ("full", "lora"))
    assert results["fsdp:loss_abs_diff"] <= 1e-5
    assert out.rstrip().splitlines()[-1].startswith("RESULT wall_s=")
    assert (tmp_path / "grpo" / "final").is_dir()


def test_a_section_that_breaks_is_reported_and_the_others_still_run(monkeypatch, tmp_path, capsys):
    """On a lent machine a crash in one section must not cost the minutes of the rest."""

    def broken(*args):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu_suite, "learner_section", broken)
    ran = []
    monkeypatch.setattr(gpu_suite, "grpo_section", lambda *a: ran.append("grpo"))
    assert gpu_suite.main(["--smoke", "--sections", "device,learner,grpo", "--work", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "RuntimeError: planted failure" in captured.err
    assert "RESULT learner:failed=1" in captured.out
    assert ran == ["grpo"]
    assert "failed: learner" in captured.out and captured.out.rstrip().splitlines()[-1].startswith("RESULT wall_s=")
