"""The learner-step benchmark's reporting (benchmarks/learner_step.py, issue 46): the warm-up
updates' metrics side by side, and a process's batch in one line, checked against hand-written
strings."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import learner_step as bench  # noqa: E402


def test_metric_gaps_relative_to_base_and_absolute_at_zero():
    # loss: 2.5 -> 2.4, -0.1 = -4% of 2.5; kl_mean 0 has no relative gap; entropy only in base is left out
    lines = bench.metric_gaps({"loss": 2.5, "kl_mean": 0.0, "entropy": 1.0}, {"loss": 2.4, "kl_mean": 3e-7})
    assert lines == ["loss: base 2.5, new 2.4, new - base -1.00e-01 (-4.0e-02 relative)",
                     "kl_mean: base 0, new 3e-07, new - base +3.00e-07"]


def test_metric_gaps_equal_values():
    assert bench.metric_gaps({"grad_norm": 0.75}, {"grad_norm": 0.75}) == [
        "grad_norm: base 0.75, new 0.75, new - base +0.00e+00 (+0.0e+00 relative)"]


def test_describe_batch():
    batch = {"domains": {"code": [2, 0.125], "word_problems": [3, 0.5]}, "completions": 40, "tokens": 3210,
             "digest": "abc123"}
    assert bench.describe(batch) == ("code 2 prompts (mean reward 0.12), word_problems 3 prompts (mean reward 0.50); "
                                     "40 completions, 3210 completion tokens, digest abc123")
