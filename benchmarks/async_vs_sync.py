"""Synchronous loop vs the asynchronous pipeline (max_staleness 1 and 2), side by side in one process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async_vs_sync.py [--budget-s 90] [--threads 1]

Each arm is the real training loop (`postrl.loop.train`, engine: local) on the default recipe
from the same model, stopped once its wall-clock budget is spent (at the loop's `step.stored`
point, after a whole step); its policy is then scored on the same held-out problems. Throughput is
the median seconds per step after the first (warm-up). The synchronous arm runs with `--threads`
torch threads; an asynchronous arm runs the trainer and the sampling thread side by side, each
with half of them (at least one), so with --threads 1 it occupies two cores where the synchronous
loop occupies one: that is the point of the pipeline on a CPU box. The machine is shared, so
only ratios measured in one invocation mean much.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from postrl import loop as train_module
from postrl import run as run_module
from postrl.config import load_config
from postrl.evaluation import evaluate_domain
from postrl.models import resolve_model_path


class Budget(Exception):
    """The arm's wall-clock budget is spent."""


def run_arm(cfg, budget_s: float) -> tuple[list[float], dict]:
    """Train until the budget is spent; (seconds of each step, held-out scores of the policy)."""
    runs, ends = [], []
    original = train_module.open_run
    train_module.open_run = lambda *a, **k: (runs.append(original(*a, **k)), runs[-1])[1]  # to reach the policy
    start = time.perf_counter()

    def step_done(name: str) -> None:
        ends.append(time.perf_counter())
        if ends[-1] - start > budget_s:
            raise Budget

    run_module.crash_point = step_done
    try:
        train_module.train(cfg, log=lambda *a: None)
    except Budget:
        pass
    finally:
        train_module.open_run = original
    run = runs[0]
    run.engine.close()
    run.sinks.close()
    domain = next(iter(run.domains.values()))
    scores = evaluate_domain(run.policy, domain, num_problems=cfg.eval.num_problems, ks=[1],
                             samples_per_problem=cfg.eval.samples_per_problem, temperature=1.0,
                             max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed)
    return [b - a for a, b in zip([start, *ends], ends)], scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--budget-s", type=float, default=90.0, help="wall-clock training budget per arm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="dotted recipe overrides")
    a = ap.parse_args()
    path = resolve_model_path(a.model)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for k in (0, 1, 2):
            torch.set_num_threads(a.threads)
            cfg = load_config(a.recipe, [
                f"model.name={path}", f"run.dir={Path(work) / f'k{k}'}", "train.total_steps=100000",
                f"pipeline.max_staleness={k}", "run.progress=false", "monitor.spot_check_every_steps=0",
                f"eval.num_problems={a.eval_problems}", f"eval.samples_per_problem={a.eval_samples}", "eval.k=[1]",
                *a.overrides,
            ])
            times, scores = run_arm(cfg, a.budget_s)
            sec = statistics.median(times[1:] or times)
            per_step = cfg.train.prompts_per_step * cfg.train.samples_per_prompt
            results[k] = {"steps": len(times), "sec_per_step": sec, "completions_per_s": per_step / sec,
                          "pass@1": scores["pass@1"]}
    report(results, a)


def report(results: dict, a) -> None:
    print(f"default recipe, torch threads {a.threads} (async: trainer + sampler thread), budget {a.budget_s:.0f}s "
          f"per arm, held-out {a.eval_problems} problems x {a.eval_samples} samples")
    print(f"{'arm':14s} {'steps':>6s} {'sec/step':>9s} {'compl/s':>9s} {'pass@1':>7s}")
    for k, r in results.items():
        name = "sync" if k == 0 else f"async K={k}"
        print(f"{name:14s} {r['steps']:6d} {r['sec_per_step']:9.3f} {r['completions_per_s']:9.1f} {r['pass@1']:7.3f}")
    best = max(results[1]["completions_per_s"], results[2]["completions_per_s"])
    speedup = best / results[0]["completions_per_s"]
    print(f"speedup async/sync completions/s: K=1 {results[1]['completions_per_s'] / results[0]['completions_per_s']:.2f}x, "
          f"K=2 {results[2]['completions_per_s'] / results[0]['completions_per_s']:.2f}x")
    print(f"RESULT async_speedup={speedup:.2f} target=1.5")


if __name__ == "__main__":
    main()
