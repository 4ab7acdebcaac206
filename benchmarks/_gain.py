"""Shared by the gain benchmarks (smollm2_gain.py, own_data_gain.py, joint_vs_single.py; async_vs_sync.py
takes its standard error): measure a policy's held-out pass@1 on several domains, before and after
training, problem by problem, and report the change with paired standard errors.

Noise: each domain's change is a paired difference over the same problems, sampled with the same
seeds; its standard error is std(per-problem difference) / sqrt(problems). "No drop beyond noise"
on an untrained domain means the pass@1 change is above -2 standard errors.

A shared module, not a benchmark: the leading underscore marks the two (this and `_harness`) that
benchmarks may import; a benchmark never imports another (pyproject.toml's benchmarks contract).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from postrl.algo.passk import pass_at_k
from postrl.evaluation import count_correct
from postrl.sampling.policy import Policy


def measure(policy: Policy, suites: dict, cfg, max_new_tokens: dict[str, int] | None = None,
            greedy: bool = True) -> dict:
    """{domain: {"greedy": [bool per problem], "correct": [correct samples per problem]}}; without
    `greedy`, "greedy" is [] and the samples are the same (their own seeded generator)."""
    out = {}
    for name, (domain, tasks) in suites.items():
        t0 = time.perf_counter()
        tokens = (max_new_tokens or {}).get(name, cfg.train.max_new_tokens)
        g, c = count_correct(policy, domain, tasks, cfg.eval.samples_per_problem, cfg.eval.temperature, tokens,
                             cfg.seed, greedy=greedy)
        out[name] = {"greedy": g, "correct": c}
        print(f"  {name}: {summary(out[name], cfg.eval.samples_per_problem)} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return out


def summary(r: dict, n: int) -> str:
    s = scores(r, n)
    line = (f"greedy={s['greedy']:.3f} " if r["greedy"] else "") + f"pass@1={s['pass@1']:.3f}"
    return line if s["k"] == 1 else f"{line} pass@{s['k']}={s['pass@k']:.3f}"


def scores(r: dict, n: int) -> dict[str, float]:
    k = min(8, n)
    return {
        "greedy": sum(r["greedy"]) / len(r["greedy"]) if r["greedy"] else math.nan,  # nan: not measured
        "pass@1": sum(pass_at_k(n, c, 1) for c in r["correct"]) / len(r["correct"]),
        "pass@k": sum(pass_at_k(n, c, k) for c in r["correct"]) / len(r["correct"]), "k": k,
    }


def paired_se(before: dict, after: dict, n: int) -> float:
    """Standard error of the mean per-problem change in pass@1 (same problems before and after)."""
    diffs = [(a - b) / n for a, b in zip(after["correct"], before["correct"])]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return math.sqrt(var / len(diffs))


def report(base: dict, after: dict, cfg, trained: set[str], run_dir: Path, seconds: float) -> dict[str, tuple]:
    """Print the before/after table; returns {domain: (pass@1 change, its standard error)}."""
    n = cfg.eval.samples_per_problem
    print(f"\nheld-out, T={cfg.eval.temperature}, {n} samples/problem")
    print("| domain | problems | greedy before -> after | pass@1 before -> after (+/- 2 SE) | pass@k before -> after |")
    print("|---|---|---|---|---|")
    changes = {}
    for name in base:
        b, a, se = scores(base[name], n), scores(after[name], n), paired_se(base[name], after[name], n)
        changes[name] = (a["pass@1"] - b["pass@1"], se)
        role = "trained" if name in trained else "not trained"
        print(f"| {name} ({role}) | {len(base[name]['correct'])} | {b['greedy']:.3f} -> {a['greedy']:.3f} | "
              f"{b['pass@1']:.3f} -> {a['pass@1']:.3f} ({changes[name][0]:+.3f} +/- {2 * se:.3f}) | "
              f"{b['pass@k']:.3f} -> {a['pass@k']:.3f} (k={b['k']}) |")
    for name in base:
        if name not in trained:
            drop, se = changes[name]
            verdict = "no drop beyond 2 SE" if drop >= -2 * se else "a drop BEYOND 2 SE"
            print(f"untrained domain {name}: pass@1 change {drop:+.3f} ({verdict})")
    print(f"run {run_dir}; total {seconds / 60:.1f} min")
    return changes
